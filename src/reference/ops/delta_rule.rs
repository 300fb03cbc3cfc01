//! The linear-attention layers' per-token ops (transformers' `causal_conv1d_update`, Gated
//! DeltaNet's `torch_recurrent_gated_delta_rule` and KDA's `recurrent_kimi_delta_attention`,
//! both with `use_qk_l2norm_in_kernel`), one token at a time.

use super::activation::{sigmoid, silu};
pub use crate::model::config::{DeltaShape, GateAct};
use crate::model::LinearKind;

/// One token through a depthwise causal conv with SiLU: `x` `[channels]` is the new input,
/// `window` `[channels, kernel - 1]` the previous inputs (oldest first, updated to end with
/// `x`), `w` `[channels, kernel]` the taps (the last tap meets `x`). Writes `out` `[channels]`.
pub fn causal_conv1d_step(x: &[f32], window: &mut [f32], w: &[f32], kernel: usize, out: &mut [f32]) {
    let past = kernel - 1;
    assert!(window.len() == x.len() * past && w.len() == x.len() * kernel && out.len() == x.len());
    for (c, o) in out.iter_mut().enumerate() {
        let win = &mut window[c * past..(c + 1) * past];
        let taps = &w[c * kernel..(c + 1) * kernel];
        let acc = win.iter().zip(taps).map(|(v, t)| v * t).sum::<f32>() + x[c] * taps[past];
        *o = silu(acc);
        win.rotate_left(1);
        win[past - 1] = x[c];
    }
}

/// `softplus(x) = ln(1 + e^x)`, linear above 20 as torch's `F.softplus`.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The gate inputs of one token.
#[derive(Clone, Copy, Debug)]
pub struct DeltaGates<'a> {
    /// `a`, the decay input: `[v_heads]` (Gated DeltaNet) or `[v_heads * dk]` (KDA's `f`).
    pub a: &'a [f32],
    /// `b` `[v_heads]` (beta logits).
    pub b: &'a [f32],
    /// `A_log` `[v_heads]`.
    pub a_log: &'a [f32],
    /// `dt_bias`, as wide as `a`.
    pub dt_bias: &'a [f32],
    /// Which decay the gates make.
    pub kind: LinearKind,
}

impl DeltaGates<'_> {
    /// The log-decay `g` of key channel `i` of value head `h`: Gated DeltaNet's
    /// `-exp(A_log) * softplus(a + dt_bias)` per head, or KDA's per channel (see
    /// [`LinearKind::Kda`]).
    pub fn log_decay(&self, h: usize, i: usize, dk: usize) -> f32 {
        let a_exp = self.a_log[h].exp();
        match self.kind {
            LinearKind::GatedDeltaNet => -a_exp * softplus(self.a[h] + self.dt_bias[h]),
            LinearKind::Kda { lower_bound } => {
                let x = self.a[h * dk + i] + self.dt_bias[h * dk + i];
                match lower_bound {
                    Some(bound) => bound * sigmoid(a_exp * x),
                    None => -a_exp * softplus(x),
                }
            }
        }
    }
}

/// `x / sqrt(sum(x^2) + 1e-6)` (the FLA `l2norm` transformers uses), in place.
fn l2norm(x: &mut [f32]) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// One token of the gated delta rule: q, k `[k_heads * dk]` (L2-normalised here, q also by
/// `1/sqrt(dk)`), v `[v_heads * dv]`; per value head the log-decays `g` of its key channels
/// ([`DeltaGates::log_decay`]: one for all of them in Gated DeltaNet, one each in KDA),
/// `beta = sigmoid(b)`, `S[i, :] *= exp(g[i])`, `S += k (beta (v - S^T k))^T`, `out = S^T q`.
/// `state` `[v_heads, dk, dv]`; writes `out` `[v_heads * dv]`.
pub fn gated_delta_step(
    shape: DeltaShape,
    (q, k, v): (&[f32], &[f32], &[f32]),
    gates: DeltaGates<'_>,
    state: &mut [f32],
    out: &mut [f32],
) {
    let DeltaShape { k_heads, v_heads, dk, dv } = shape;
    assert!(q.len() == k_heads * dk && k.len() == q.len() && v.len() == v_heads * dv && out.len() == v.len());
    assert!(state.len() == v_heads * dk * dv);
    let ratio = v_heads / k_heads;
    for h in 0..v_heads {
        let kh = h / ratio;
        let mut qh = q[kh * dk..(kh + 1) * dk].to_vec();
        let mut kvec = k[kh * dk..(kh + 1) * dk].to_vec();
        l2norm(&mut qh);
        l2norm(&mut kvec);
        let scale = 1.0 / (dk as f32).sqrt();
        qh.iter_mut().for_each(|x| *x *= scale);
        let beta = sigmoid(gates.b[h]);
        let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
        for (i, row) in s.chunks_exact_mut(dv).enumerate() {
            let decay = gates.log_decay(h, i, dk).exp();
            row.iter_mut().for_each(|x| *x *= decay);
        }
        for j in 0..dv {
            let kv_mem: f32 = (0..dk).map(|i| s[i * dv + j] * kvec[i]).sum();
            let delta = (v[h * dv + j] - kv_mem) * beta;
            for i in 0..dk {
                s[i * dv + j] += kvec[i] * delta;
            }
            out[h * dv + j] = (0..dk).map(|i| s[i * dv + j] * qh[i]).sum();
        }
    }
}

/// `y[i] *= act(g[i / span])`: each gate value scales `span` consecutive values (1: one gate
/// per value; a head's width: one per head).
pub fn gate_mul(y: &mut [f32], g: &[f32], span: usize, act: GateAct) {
    assert_eq!(y.len(), g.len() * span);
    for (y, &g) in y.chunks_exact_mut(span).zip(g) {
        let f = match act {
            GateAct::Sigmoid => sigmoid(g),
            GateAct::Silu => silu(g),
        };
        y.iter_mut().for_each(|y| *y *= f);
    }
}
