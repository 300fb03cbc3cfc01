//! The MLA attention kind on the GPU, its shared part: queries (direct or through the compressed
//! `q_a`/`q_b` pair), the step's latent in `acts.k` (normalised) and rotary key in `acts.v`
//! (rotated), the merge of split decode attention over the latent cache (it applies the layer's
//! `W_UV`), Ling's per-head output gate and `o_proj`. The cache, the store into it and the attention kernel are per session
//! ([`super::cache::MlaCache`]).

use super::{Activations, Builder};
use crate::error::Result;
use crate::gpu::{Gpu, Pass};
use crate::model::layer_weights::{MlaQuery, MlaWeights, MLA_NORM_EPS};
use crate::model::{ArchSpec, HostTensor, MlaCacheKind, MlaSpec};
use crate::ops::matmul::{MatMul, MatMulOut};
use crate::ops::mla_merge::{MlaMerge, MlaMergeIo};
use crate::ops::rms_norm::{NormRows, RmsNorm};
use crate::ops::rope::{Rope, RopeLayout};

/// How the layer forms its queries.
enum Query {
    Direct(MatMul),
    Compressed { a: MatMul, norm: RmsNorm, b: MatMul },
}

/// One layer's bound MLA block.
pub(super) struct MlaAttn {
    q: Query,
    /// `kv_a_proj_with_mqa`'s latent rows into `acts.k`.
    kv_c: MatMul,
    kv_norm: RmsNorm,
    /// Its rotary-key rows into `acts.v`.
    kv_rope: MatMul,
    rope_q: Rope,
    rope_k: Rope,
    /// `kv_b_proj` in f32, which the attention kernels read themselves.
    pub(super) kv_b: wgpu::Buffer,
    /// Split decode's merge over the latent cache (the decompressed cache's needs no weights:
    /// the model's shared attention merge).
    pub(super) merge: Option<MlaMerge>,
    /// Ling's `g_proj`: each head's output times the sigmoid of its gate, before `o_proj`.
    out_gate: Option<super::linear::OutputGate>,
    o: MatMul,
}

/// Rows `start..start + rows` of a `[_, cols]` matrix.
fn rows(t: &HostTensor, start: usize, n: usize) -> HostTensor {
    let cols = t.shape[1];
    HostTensor::new(vec![n, cols], t.data[start * cols..(start + n) * cols].to_vec())
}

impl Builder<'_> {
    /// Binds layer MLA block `w` of `spec`, reading `acts.hn` and adding into `acts.x`; `tables`
    /// the RoPE cos/sin tables; split decode attention runs splits of `split_len` keys.
    pub(super) fn mla(
        &mut self,
        spec: &ArchSpec,
        m: &MlaSpec,
        w: &MlaWeights,
        acts: &Activations,
        tables: (&wgpu::Buffer, &wgpu::Buffer),
        split_len: usize,
    ) -> Result<MlaAttn> {
        let (gpu, step) = (self.gpu, self.step);
        let qd = spec.q_dim();
        let q = match &w.q {
            MlaQuery::Direct(wq) => {
                Query::Direct(self.matmul("attention", wq, None, &acts.hn, &acts.q, MatMulOut::plain(qd))?)
            }
            MlaQuery::Compressed { a, norm, b } => {
                let r = norm.data.len();
                let a = self.matmul("attention", a, None, &acts.hn, &acts.q_lat, MatMulOut::plain(r))?;
                let rows_q = NormRows { n: r, rows_per_token: 1, at_cache_pos: false };
                let norm = self.norm(norm, &acts.q_lat, None, rows_q, MLA_NORM_EPS);
                let b = self.matmul("attention", b, None, &acts.q_lat, &acts.q, MatMulOut::plain(qd))?;
                Query::Compressed { a, norm, b }
            }
        };
        let (rank, rope) = (m.kv_lora_rank, m.qk_rope_head_dim);
        let plain = MatMulOut::plain;
        let kv_c = self.matmul("attention", &rows(&w.kv_a, 0, rank), None, &acts.hn, &acts.k, plain(rank))?;
        let kv_rope = self.matmul("attention", &rows(&w.kv_a, rank, rope), None, &acts.hn, &acts.v, plain(rope))?;
        let kv_norm = self.norm(
            &w.kv_norm,
            &acts.k,
            None,
            NormRows { n: rank, rows_per_token: 1, at_cache_pos: false },
            MLA_NORM_EPS,
        );
        let qk = m.qk_head_dim();
        let q_layout = RopeLayout {
            n_heads: spec.heads,
            head_stride: qk,
            row_stride: qd,
            offset: m.qk_nope_head_dim,
            at_cache_pos: false,
        };
        let rope_q = Rope::new(gpu, step, tables, &acts.q, &spec.rope, q_layout);
        let rope_k = Rope::new(gpu, step, tables, &acts.v, &spec.rope, RopeLayout::heads(1, rope, false));
        let kv_b = gpu.upload("mla kv_b", bytemuck::cast_slice(&w.kv_b.data));
        let merge = (m.cache == MlaCacheKind::Latent).then(|| {
            let io = MlaMergeIo { partial: &acts.attn_partial, kv_b: &kv_b, out: &acts.attn };
            MlaMerge::new(gpu, step, io, spec.heads, m, split_len)
        });
        let out_gate = w.gate.as_ref().map(|g| self.output_gate(g, spec.heads * m.v_head_dim, acts)).transpose()?;
        let o_out = MatMulOut { accumulate: true, ..MatMulOut::plain(spec.hidden) };
        let o = self.matmul("attention", &w.o, None, &acts.attn, &acts.x, o_out)?;
        Ok(MlaAttn { q, kv_c, kv_norm, kv_rope, rope_q, rope_k, kv_b, merge, out_gate, o })
    }
}

impl MlaAttn {
    /// Records the queries, latent and rotary key of `n` tokens (before the session's store and
    /// attention).
    pub(super) fn record_inputs(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        match &self.q {
            Query::Direct(q) => q.record(gpu, pass, n),
            Query::Compressed { a, norm, b } => {
                a.record(gpu, pass, n);
                norm.record(gpu, pass, n);
                b.record(gpu, pass, n);
            }
        }
        self.kv_c.record(gpu, pass, n);
        self.kv_rope.record(gpu, pass, n);
        self.kv_norm.record(gpu, pass, n);
        if let Some(g) = &self.out_gate {
            g.record_projection(gpu, pass, n);
        }
    }

    /// Records what depends on the tokens' positions before the cache: RoPE of the queries'
    /// and the key's rotary parts (run per sequence in a batched step).
    pub(super) fn record_positional(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        self.rope_q.record(gpu, pass, n);
        self.rope_k.record(gpu, pass, n);
    }

    /// Records the output gate (Ling) and `o_proj`, adding the attention output into `x`.
    pub(super) fn record_output(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        if let Some(g) = &self.out_gate {
            g.record_gating(gpu, pass, n);
        }
        self.o.record(gpu, pass, n);
    }
}
