//! The SwiGLU feed-forward block shared by dense layers and routed experts.

use super::activation::silu;
use super::matvec::matvec;

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
