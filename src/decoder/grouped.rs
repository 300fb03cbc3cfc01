//! Binding a grouped-query attention layer's projections (q | k | v, the q and k norms, the
//! output gate, o, attention sinks); the attention itself runs over the session's cache
//! ([`super::cache`]).

use super::*;
use crate::model::layer_weights::AttentionWeights;

impl Builder<'_> {
    /// Binds grouped attention block `attn` of layer `i`, reading `acts.hn` and adding into
    /// `acts.x`; `(heads, split_len)` shape the split-K merge of layers with sinks.
    pub(super) fn grouped_attn(
        &mut self,
        spec: &ArchSpec,
        i: usize,
        attn: &AttentionWeights,
        acts: &Activations,
        (heads, split_len): (Heads, usize),
    ) -> Result<GroupedAttn> {
        let (gpu, step) = (self.gpu, self.step);
        let (h, eps) = (spec.hidden, spec.rms_eps);
        let outputs = [(&acts.q, spec.q_dim()), (&acts.k, spec.kv_dim()), (&acts.v, spec.kv_dim())];
        let weights = [&attn.q, &attn.k, &attn.v];
        let qkv = self.qkv(i, weights, attn.qkv_bias.as_ref(), &acts.hn, outputs)?;
        let qk_norm = attn.qk_norm.as_ref().map(|[qn, kn]| {
            // Per head, or over the whole projection.
            let (q_rows, k_rows) = match spec.qk_norm {
                QkNorm::PerHead => (
                    NormRows { n: spec.head_dim, rows_per_token: spec.heads, at_cache_pos: false },
                    NormRows { n: spec.head_dim, rows_per_token: spec.kv_heads, at_cache_pos: false },
                ),
                _ => (
                    NormRows { n: spec.q_dim(), rows_per_token: 1, at_cache_pos: false },
                    NormRows { n: spec.kv_dim(), rows_per_token: 1, at_cache_pos: false },
                ),
            };
            self.norm_pair((qn, &acts.q, q_rows), (kn, &acts.k, k_rows), eps)
        });
        let out_gate = attn.gate.as_ref().map(|g| self.output_gate(g, spec.q_dim(), acts)).transpose()?;
        let o_out = MatMulOut { accumulate: true, ..MatMulOut::plain(h) };
        let o_bias = attn.o_bias.as_ref();
        let o = self.projection("o", &attn.o, o_bias, &acts.attn, &acts.x, o_out, (i, LoraTarget::O))?;
        let sinks = attn.sinks.as_ref().map(|s| {
            let buf = f32_buf(gpu, "attention sinks", s);
            let partial = (&acts.attn_partial, &acts.attn);
            let merge = AttentionMerge::new(gpu, step, partial, Some(&buf), heads, split_len);
            (buf, merge)
        });
        Ok(GroupedAttn { qkv, qk_norm, out_gate, o, sinks })
    }
}
