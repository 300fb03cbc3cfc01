//! One decoder layer of the reference forward pass: attention block, then FFN block.

use super::kv_cache::KvCache;
use super::ops::{add_bias, attention, matvec, rms_norm, rope, router_topk, sigmoid, swiglu_mlp};
use crate::model::layer_weights::{AttentionWeights, LayerWeights, MlpWeights};
use crate::model::{ArchSpec, QkNorm};

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
    let (h, qd, kvd, hd) = (spec.hidden, spec.q_dim(), spec.kv_dim(), spec.head_dim);
    let w: &AttentionWeights = &lw.attn;
    let mut normed = vec![0.0f32; h];
    rms_norm(x, &lw.input_norm.data, spec.rms_eps, &mut normed);
    let mut q = vec![0.0f32; qd];
    let mut k = vec![0.0f32; kvd];
    let mut v = vec![0.0f32; kvd];
    matvec(&w.q.data, qd, h, &normed, &mut q);
    matvec(&w.k.data, kvd, h, &normed, &mut k);
    matvec(&w.v.data, kvd, h, &normed, &mut v);
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
    rope(&mut q, spec.heads, hd, pos, spec.rope_theta);
    rope(&mut k, spec.kv_heads, hd, pos, spec.rope_theta);
    cache.push(layer, &k, &v);
    let kv_len = cache.len(layer);
    let mut attn = vec![0.0f32; qd];
    attention(&q, cache.keys(layer), cache.values(layer), spec.heads, spec.kv_heads, hd, kv_len, &mut attn);
    let mut o = vec![0.0f32; h];
    matvec(&w.o.data, h, qd, &attn, &mut o);
    for (xi, oi) in x.iter_mut().zip(&o) {
        *xi += oi;
    }
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
            routing = router_topk(&logits, spec_moe.top_k, spec_moe.norm_topk_prob);
            let mut e_out = vec![0.0f32; h];
            for &(e, weight) in &routing {
                run_mlp(&experts[e], h, &normed, &mut e_out);
                for (yi, ei) in y.iter_mut().zip(&e_out) {
                    *yi += weight * ei;
                }
            }
            if let Some((shared, gate)) = &moe.shared {
                run_mlp(shared, h, &normed, &mut e_out);
                let mut g = [0.0f32];
                matvec(&gate.data, 1, h, &normed, &mut g);
                let g = sigmoid(g[0]);
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
