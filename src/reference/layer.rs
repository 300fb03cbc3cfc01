//! One decoder layer of the reference forward pass: attention block, then FFN block.

use super::kv_cache::KvCache;
use super::linear_attention::linear_attention;
use super::ops::{
    add_bias, attention_with, expert_mlp, gate_mul, matvec, rms_norm, rope, route, sigmoid, swiglu_mlp, GateAct,
    HeadShape,
};
use crate::model::layer_weights::{
    AttentionBlock, AttentionWeights, LayerWeights, MlaQuery, MlaWeights, MlpWeights, MLA_NORM_EPS,
};
use crate::model::{ArchSpec, MlaSpec, QkNorm};

/// The layer's residual update from attention at position `pos`: `x += Wo · attn(norm(x))`,
/// appending this position's key and value to `cache`.
pub(crate) fn attention_block(
    spec: &ArchSpec,
    lw: &LayerWeights,
    layer: usize,
    pos: usize,
    x: &mut [f32],
    cache: &mut KvCache,
) {
    let h = spec.hidden;
    let mut normed = vec![0.0f32; h];
    rms_norm(x, &lw.input_norm.data, spec.rms_eps, &mut normed);
    let o = match (&lw.attn, spec.mla()) {
        (AttentionBlock::Grouped(w), _) => grouped(spec, w, layer, pos, &normed, cache),
        (AttentionBlock::Mla(w), Some(m)) => mla(spec, m, w, layer, pos, &normed, cache),
        (AttentionBlock::Mla(_), None) => unreachable!("MLA weights are only read for an MLA spec"),
        (AttentionBlock::Linear(w), _) => {
            let hy = spec.hybrid.as_ref().expect("linear weights are only read for a hybrid spec");
            linear_attention(spec, hy, w, &normed, cache.linear_state(layer))
        }
    };
    for (xi, oi) in x.iter_mut().zip(&o) {
        *xi += oi;
    }
}

/// Grouped-query attention of `normed` at `pos`, returning `Wo · attn`.
fn grouped(
    spec: &ArchSpec,
    w: &AttentionWeights,
    layer: usize,
    pos: usize,
    normed: &[f32],
    cache: &mut KvCache,
) -> Vec<f32> {
    let (h, qd, kvd, hd) = (spec.hidden, spec.q_dim(), spec.kv_dim(), spec.head_dim);
    let mut q = vec![0.0f32; qd];
    let mut k = vec![0.0f32; kvd];
    let mut v = vec![0.0f32; kvd];
    matvec(&w.q.data, qd, h, normed, &mut q);
    matvec(&w.k.data, kvd, h, normed, &mut k);
    matvec(&w.v.data, kvd, h, normed, &mut v);
    if let Some([bq, bk, bv]) = &w.qkv_bias {
        add_bias(&mut q, &bq.data);
        add_bias(&mut k, &bk.data);
        add_bias(&mut v, &bv.data);
    }
    if let Some([qn, kn]) = &w.qk_norm {
        match spec.qk_norm {
            QkNorm::PerHead => {
                norm_heads(&mut q, &qn.data, hd, spec.rms_eps);
                norm_heads(&mut k, &kn.data, hd, spec.rms_eps);
            }
            QkNorm::Full => {
                norm_heads(&mut q, &qn.data, qd, spec.rms_eps);
                norm_heads(&mut k, &kn.data, kvd, spec.rms_eps);
            }
            QkNorm::None => {}
        }
    }
    rope(&mut q, spec.heads, hd, pos, &spec.rope);
    rope(&mut k, spec.kv_heads, hd, pos, &spec.rope);
    cache.push(layer, &k, &v);
    let kv_len = cache.len(layer);
    let mut attn = vec![0.0f32; qd];
    let shape = HeadShape {
        n_heads: spec.heads,
        n_kv_heads: spec.kv_heads,
        k_dim: hd,
        v_dim: hd,
        scale: spec.attention_scale(),
        window: spec.window(layer),
    };
    let sinks = w.sinks.as_ref().map(|s| &s.data[..]);
    attention_with(&q, cache.keys(layer), cache.values(layer), shape, kv_len, sinks, &mut attn);
    if let Some(gate) = &w.gate {
        let mut g = vec![0.0f32; qd];
        matvec(&gate.data, qd, h, normed, &mut g);
        gate_mul(&mut attn, &g, 1, GateAct::Sigmoid);
    }
    let mut o = vec![0.0f32; h];
    matvec(&w.o.data, h, qd, &attn, &mut o);
    if let Some(b) = &w.o_bias {
        add_bias(&mut o, &b.data);
    }
    o
}

/// Multi-head latent attention of `normed` at `pos` in its plain (decompressed) form: the
/// latent `c` is normalised, the shared rotary key rotated, and `kv_b_proj` expands them into
/// every head's key `[k_nope | k_rope]` and value, which go into the cache. Returns `Wo · attn`.
fn mla(
    spec: &ArchSpec,
    m: &MlaSpec,
    w: &MlaWeights,
    layer: usize,
    pos: usize,
    normed: &[f32],
    cache: &mut KvCache,
) -> Vec<f32> {
    let (h, heads, qk) = (spec.hidden, spec.heads, m.qk_head_dim());
    let (rank, nope, rope_dim, vd) = (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
    let mut q = vec![0.0f32; heads * qk];
    match &w.q {
        MlaQuery::Direct(wq) => matvec(&wq.data, heads * qk, h, normed, &mut q),
        MlaQuery::Compressed { a, norm, b } => {
            let r = norm.data.len();
            let (mut qa, mut qn) = (vec![0.0f32; r], vec![0.0f32; r]);
            matvec(&a.data, r, h, normed, &mut qa);
            rms_norm(&qa, &norm.data, MLA_NORM_EPS, &mut qn);
            matvec(&b.data, heads * qk, r, &qn, &mut q);
        }
    }
    let mut ckv = vec![0.0f32; rank + rope_dim];
    matvec(&w.kv_a.data, rank + rope_dim, h, normed, &mut ckv);
    let mut c = vec![0.0f32; rank];
    rms_norm(&ckv[..rank], &w.kv_norm.data, MLA_NORM_EPS, &mut c);
    let k_rope = &mut ckv[rank..];
    rope(k_rope, 1, rope_dim, pos, &spec.rope);
    cache.round_latent(&mut c, k_rope);
    for head in q.chunks_exact_mut(qk) {
        rope(&mut head[nope..], 1, rope_dim, pos, &spec.rope);
    }
    let mut kv = vec![0.0f32; heads * (nope + vd)];
    matvec(&w.kv_b.data, heads * (nope + vd), rank, &c, &mut kv);
    let (mut keys, mut values) = (Vec::with_capacity(heads * qk), Vec::with_capacity(heads * vd));
    for blk in kv.chunks_exact(nope + vd) {
        keys.extend_from_slice(&blk[..nope]);
        keys.extend_from_slice(&ckv[rank..]);
        values.extend_from_slice(&blk[nope..]);
    }
    cache.push(layer, &keys, &values);
    let shape =
        HeadShape { n_heads: heads, n_kv_heads: heads, k_dim: qk, v_dim: vd, scale: m.softmax_scale, window: None };
    let mut attn = vec![0.0f32; heads * vd];
    attention_with(&q, cache.keys(layer), cache.values(layer), shape, cache.len(layer), None, &mut attn);
    if let Some(gate) = &w.gate {
        let mut g = vec![0.0f32; heads];
        matvec(&gate.data, heads, h, normed, &mut g);
        gate_mul(&mut attn, &g, vd, GateAct::Sigmoid);
    }
    let mut o = vec![0.0f32; h];
    matvec(&w.o.data, h, heads * vd, &attn, &mut o);
    o
}

/// RMSNorm of each consecutive `width`-wide chunk of `x` with the same `weight`.
fn norm_heads(x: &mut [f32], weight: &[f32], width: usize, eps: f32) {
    let mut tmp = vec![0.0f32; width];
    for chunk in x.chunks_exact_mut(width) {
        rms_norm(chunk, weight, eps, &mut tmp);
        chunk.copy_from_slice(&tmp);
    }
}

fn run_mlp(m: &MlpWeights, hidden: usize, x: &[f32], out: &mut [f32]) {
    let inter = m.gate.shape[0];
    swiglu_mlp(&m.gate.data, &m.up.data, &m.down.data, hidden, inter, x, out);
}

/// The layer's residual update from its FFN: `x += ffn(norm(x))`. `experts` are the layer's
/// routed experts (empty for dense layers). Returns the routing `(expert, weight)` chosen, empty
/// for dense layers.
pub(crate) fn ffn_block(
    spec: &ArchSpec,
    lw: &LayerWeights,
    experts: &[MlpWeights],
    x: &mut [f32],
) -> Vec<(usize, f32)> {
    use crate::model::layer_weights::FfnWeights;
    let h = spec.hidden;
    let mut normed = vec![0.0f32; h];
    rms_norm(x, &lw.post_norm.data, spec.rms_eps, &mut normed);
    let mut y = vec![0.0f32; h];
    let mut routing = Vec::new();
    match &lw.ffn {
        FfnWeights::Dense(m) => run_mlp(m, h, &normed, &mut y),
        FfnWeights::Moe(moe) => {
            let spec_moe = spec.moe.as_ref().expect("MoE layer in an MoE spec");
            let n = spec_moe.num_experts;
            let mut logits = vec![0.0f32; n];
            matvec(&moe.router.data, n, h, &normed, &mut logits);
            if let Some(b) = &moe.router_logit_bias {
                add_bias(&mut logits, &b.data);
            }
            routing = route(&logits, spec_moe, moe.router_bias.as_ref().map(|b| &b.data[..]));
            let mut e_out = vec![0.0f32; h];
            let inter = spec_moe.expert_intermediate;
            for &(e, weight) in &routing {
                let w = &experts[e];
                let bias = moe.expert_bias.as_ref().map(|b| &b.data[e * (2 * inter + h)..(e + 1) * (2 * inter + h)]);
                let mats = (&w.gate.data[..], &w.up.data[..], &w.down.data[..]);
                expert_mlp(mats, bias, spec_moe.expert_act, h, inter, &normed, &mut e_out);
                for (yi, ei) in y.iter_mut().zip(&e_out) {
                    *yi += weight * ei;
                }
            }
            if let Some((shared, gate)) = &moe.shared {
                run_mlp(shared, h, &normed, &mut e_out);
                let g = gate.as_ref().map_or(1.0, |gate| {
                    let mut g = [0.0f32];
                    matvec(&gate.data, 1, h, &normed, &mut g);
                    sigmoid(g[0])
                });
                for (yi, ei) in y.iter_mut().zip(&e_out) {
                    *yi += g * ei;
                }
            }
        }
    }
    for (xi, yi) in x.iter_mut().zip(&y) {
        *xi += yi;
    }
    routing
}
