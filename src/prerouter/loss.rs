//! Training losses of a head against the k experts actually routed.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::PrerouterError;

/// How the expert scores are compared with the routed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Loss {
    /// Softmax cross-entropy over experts against the uniform distribution on the k targets:
    /// `−(1/k) Σ_{e∈T} log softmax(z)_e`. Ranks experts against each other, which is what
    /// top-k selection needs (the default).
    Ce,
    /// Multi-label binary cross-entropy: `Σ_e softplus(z_e) − y_e z_e`.
    Bce,
}

impl Loss {
    /// The loss of `logits` against `targets` (distinct expert ids); writes its gradient with
    /// respect to the logits into `grad`.
    pub fn eval(self, logits: &[f32], targets: &[u16], grad: &mut [f32]) -> f32 {
        match self {
            Loss::Ce => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = logits.iter().map(|z| (z - max).exp()).sum();
                let lse = max + sum.ln();
                let w = 1.0 / targets.len() as f32;
                for (g, z) in grad.iter_mut().zip(logits) {
                    *g = (z - lse).exp();
                }
                let mut loss = 0.0;
                for &t in targets {
                    grad[usize::from(t)] -= w;
                    loss -= w * (logits[usize::from(t)] - lse);
                }
                loss
            }
            Loss::Bce => {
                let mut loss = 0.0;
                for (e, (g, &z)) in grad.iter_mut().zip(logits).enumerate() {
                    let y = if targets.iter().any(|&t| usize::from(t) == e) { 1.0 } else { 0.0 };
                    let softplus = z.max(0.0) + (-z.abs()).exp().ln_1p();
                    loss += softplus - y * z;
                    *g = 1.0 / (1.0 + (-z).exp()) - y;
                }
                loss
            }
        }
    }
}

impl FromStr for Loss {
    type Err = PrerouterError;

    /// `ce` or `bce`.
    fn from_str(s: &str) -> Result<Loss, PrerouterError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ce" => Ok(Loss::Ce),
            "bce" => Ok(Loss::Bce),
            _ => Err(PrerouterError::InvalidArgument(format!("unknown loss {s:?}; expected ce or bce"))),
        }
    }
}
