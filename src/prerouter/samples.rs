//! A dataset's samples: which tokens pair with their successor, the held-out split, and what one
//! head reads and must predict at a token.
//!
//! Sample `t` pairs token `t` (the head's input) with token `t + 1` (its target); tokens of two
//! teacher-forced sequences never pair.

use super::dataset::Dataset;
use super::error::PrerouterError;
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
    /// The model's input embeddings `[vocab, hidden]` (read with the `token` feature).
    pub embeddings: &'a [f32],
}

/// The embeddings [`HeadInputs`] reads for heads reading `features`, after checking that `data`
/// and `embeddings` hold what the `token` feature needs: token ids and an embedding row for each
/// (empty without the feature).
pub fn token_inputs<'a>(
    data: &Dataset,
    features: Features,
    embeddings: Option<&'a [f32]>,
) -> Result<&'a [f32], PrerouterError> {
    if !features.token {
        return Ok(&[]);
    }
    let rows = embeddings.map_or(0, |e| e.len() / data.meta.hidden);
    let tokens = (0..data.meta.tokens).map(|t| data.token(t));
    match tokens.map(|id| id.filter(|&id| (id as usize) < rows)).position(|id| id.is_none()) {
        None => Ok(embeddings.unwrap_or(&[])),
        Some(t) => Err(PrerouterError::InvalidArgument(format!(
            "the `token` feature needs token ids in the dataset (collected by this version) and their embeddings; \
             token {t} has {:?} of {rows} embedding rows",
            data.token(t)
        ))),
    }
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

    /// The dense input at token `t`: `h_N(t)`, then with `deep` the last MoE layer's, then with
    /// `token` the embedding of token `t + 1` (`embeddings` from [`token_inputs`]).
    pub fn dense(&self, t: usize) -> Vec<f32> {
        let d = self.data;
        let mut x = d.hidden(t, self.j).to_vec();
        if self.features.deep {
            x.extend_from_slice(d.hidden(t, d.meta.moe_layers.len() - 1));
        }
        if self.features.token {
            let (h, id) = (d.meta.hidden, d.token(t + 1).expect("checked token ids") as usize);
            x.extend_from_slice(&self.embeddings[id * h..(id + 1) * h]);
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
