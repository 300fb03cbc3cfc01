//! The SwiGLU feed-forward block shared by dense layers and routed experts.

use super::activation::{sigmoid, silu};
use super::matvec::{add_bias, matvec};
use crate::model::ExpertAct;

/// `out = down · (silu(gate · x) * (up · x))`, with `gate`, `up` row-major `[inter, hidden]`
/// and `down` `[hidden, inter]`; `x` and `out` have length `hidden`.
pub fn swiglu_mlp(gate: &[f32], up: &[f32], down: &[f32], hidden: usize, inter: usize, x: &[f32], out: &mut [f32]) {
    let mut g = vec![0.0f32; inter];
    let mut u = vec![0.0f32; inter];
    matvec(gate, inter, hidden, x, &mut g);
    matvec(up, inter, hidden, x, &mut u);
    for (a, b) in g.iter_mut().zip(&u) {
        *a = silu(*a) * b;
    }
    matvec(down, hidden, inter, &g, out);
}

/// gpt-oss's clamped SwiGLU of one gate/up pair (transformers' `GptOssExperts._apply_gate`):
/// `gate = min(gate, limit)`, `up = clamp(up, -limit, limit)`,
/// `(up + 1) * gate * sigmoid(alpha * gate)`.
pub fn clamped_swiglu(gate: f32, up: f32, alpha: f32, limit: f32) -> f32 {
    let g = gate.min(limit);
    let u = up.clamp(-limit, limit);
    (u + 1.0) * (g * sigmoid(g * alpha))
}

/// A routed expert: `swiglu_mlp` for [`ExpertAct::SwiGlu`]; for [`ExpertAct::ClampedSwiGlu`]
/// `down · clamped_swiglu(gate · x + b_gate, up · x + b_up) + b_down`, with `bias` the expert's
/// `[b_gate (inter) | b_up (inter) | b_down (hidden)]`.
#[allow(clippy::too_many_arguments)]
pub fn expert_mlp(
    (gate, up, down): (&[f32], &[f32], &[f32]),
    bias: Option<&[f32]>,
    act: ExpertAct,
    hidden: usize,
    inter: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let ExpertAct::ClampedSwiGlu { alpha, limit } = act else {
        return swiglu_mlp(gate, up, down, hidden, inter, x, out);
    };
    let bias = bias.expect("clamped SwiGLU experts have biases");
    let mut g = vec![0.0f32; inter];
    let mut u = vec![0.0f32; inter];
    matvec(gate, inter, hidden, x, &mut g);
    matvec(up, inter, hidden, x, &mut u);
    add_bias(&mut g, &bias[..inter]);
    add_bias(&mut u, &bias[inter..2 * inter]);
    for (a, b) in g.iter_mut().zip(&u) {
        *a = clamped_swiglu(*a, *b, alpha, limit);
    }
    matvec(down, hidden, inter, &g, out);
    add_bias(out, &bias[2 * inter..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_projections() {
        // hidden = inter = 2, all identity: out = silu(x) * x.
        let eye = [1.0f32, 0.0, 0.0, 1.0];
        let x = [1.0f32, -2.0];
        let mut out = [0.0; 2];
        swiglu_mlp(&eye, &eye, &eye, 2, 2, &x, &mut out);
        assert!((out[0] - silu(1.0)).abs() < 1e-6);
        assert!((out[1] - silu(-2.0) * -2.0).abs() < 1e-6);
    }
}
