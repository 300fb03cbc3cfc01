//! A linear-attention layer of the reference forward pass (Gated DeltaNet: Qwen3-Next,
//! Qwen3.5-MoE; KDA: Ling), one token at a time over the layer's state (conv window +
//! recurrent state).

use super::ops::{causal_conv1d_step, gate_mul, gated_delta_step, matvec, rms_norm, DeltaGates, DeltaShape, GateAct};
use crate::model::hybrid_weights::LinearAttnWeights;
use crate::model::{ArchSpec, HybridSpec};

/// `out_proj(gated_norm(delta_rule(conv(in_proj x))))` of `normed` `[hidden]`, advancing
/// `state` (`[conv window | recurrent state]`, [`HybridSpec::state_floats`]).
pub(crate) fn linear_attention(
    spec: &ArchSpec,
    hy: &HybridSpec,
    w: &LinearAttnWeights,
    normed: &[f32],
    state: &mut [f32],
) -> Vec<f32> {
    let (c, kd, vd, nv, dv) = (hy.conv_dim(), hy.key_dim(), hy.value_dim(), hy.num_v_heads, hy.head_v_dim);
    let mut proj = vec![0.0f32; hy.in_width()];
    matvec(&w.in_proj.data, hy.in_width(), spec.hidden, normed, &mut proj);
    let (window, recurrent) = state.split_at_mut(c * (hy.conv_kernel - 1));
    let mut conv = vec![0.0f32; c];
    causal_conv1d_step(&proj[..c], window, &w.conv.data, hy.conv_kernel, &mut conv);
    let (z, b, a) = (&proj[c..c + vd], &proj[c + vd..c + vd + nv], &proj[c + vd + nv..]);
    let gates = DeltaGates { a, b, a_log: &w.a_log.data, dt_bias: &w.dt_bias.data, kind: hy.kind };
    let mut core = vec![0.0f32; vd];
    let qkv = (&conv[..kd], &conv[kd..2 * kd], &conv[2 * kd..]);
    gated_delta_step(DeltaShape::of(hy), qkv, gates, recurrent, &mut core);
    let mut gated = vec![0.0f32; vd];
    for (x, y) in core.chunks_exact(dv).zip(gated.chunks_exact_mut(dv)) {
        rms_norm(x, &w.norm.data, spec.rms_eps, y);
    }
    gate_mul(&mut gated, z, 1, GateAct::of_output_gate(hy.kind));
    let mut out = vec![0.0f32; spec.hidden];
    matvec(&w.out.data, spec.hidden, vd, &gated, &mut out);
    out
}
