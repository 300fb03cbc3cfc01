//! A dataset's samples: which tokens pair with their successor, the held-out split, and what one
//! head reads and must predict at a token.
//!
//! Sample `t` pairs token `t` (the head's input) with token `t + 1` (its target); tokens of two
//! teacher-forced sequences never pair.

use super::dataset::Dataset;
use super::features::{Features, RoutingContext};

/// Every token that has a successor in its own sequence, ascending.
pub fn sample_tokens(data: &Dataset) -> Vec<usize> {
    (0..data.meta.tokens.saturating_sub(1)).filter(|&t| !data.starts_sequence(t + 1)).collect()
}

/// The samples split at the token where the last `holdout` share of tokens starts: (training,
/// held out).
pub fn split_held_out(data: &Dataset, holdout: f64) -> (Vec<usize>, Vec<usize>) {
    let split = ((data.meta.tokens as f64) * (1.0 - holdout)).floor() as usize;
    sample_tokens(data).into_iter().partition(|&t| t < split)
}

/// What the head owned by the dataset's MoE layer `j` reads and predicts.
#[derive(Clone, Copy)]
pub struct HeadInputs<'a> {
    /// The recorded routing and hidden states.
    pub data: &'a Dataset,
    /// Index of the owning MoE layer in the dataset's order (the head predicts `j + 1`).
    pub j: usize,
    /// The inputs the head reads.
    pub features: Features,
}

impl HeadInputs<'_> {
    fn context(&self, t: usize) -> RoutingContext<'_> {
        let d = self.data;
        RoutingContext {
            next: d.topk(t, self.j + 1),
            prev: (!d.starts_sequence(t)).then(|| d.topk(t - 1, self.j + 1)),
            own: d.topk(t, self.j),
        }
    }

    /// The indices of the ones in the input's multi-hot blocks at token `t`.
    pub fn active(&self, t: usize) -> Vec<usize> {
        self.features.active(self.data.meta.experts, &self.context(t))
    }

    /// The dense input at token `t`: `h_N(t)`, then with `deep` the last MoE layer's.
    pub fn dense(&self, t: usize) -> Vec<f32> {
        let d = self.data;
        let mut x = d.hidden(t, self.j).to_vec();
        if self.features.deep {
            x.extend_from_slice(d.hidden(t, d.meta.moe_layers.len() - 1));
        }
        x
    }

    /// The routed set the prediction made at token `t` is scored against (layer N+1 at `t + 1`).
    pub fn target(&self, t: usize) -> &[u16] {
        self.data.topk(t + 1, self.j + 1)
    }

    /// Layer N+1's routed set at token `t` (the persistence baseline's prediction).
    pub fn persistence(&self, t: usize) -> &[u16] {
        self.data.topk(t, self.j + 1)
    }
}
