//! Scoring one head on a set of samples, beside the two baselines it must beat.
//!
//! *Persistence* predicts layer N+1's routing at t (what a cache that keeps the last token's
//! experts has); *router* applies layer N+1's router to `h_N(t)` (the untrained skip).

use serde::Serialize;

use super::head::{dot, Head, Tape};
use super::metrics::{top_k, Tally};
use super::samples::HeadInputs;

/// Recall@k and exact-set match of one predictor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Score {
    /// Share of routed experts in the predicted top-k.
    pub recall: f64,
    /// Share of predictions equal to the routed set.
    pub exact_match: f64,
}

impl From<Tally> for Score {
    fn from(t: Tally) -> Score {
        Score { recall: t.recall(), exact_match: t.exact_match() }
    }
}

/// One head's figures on a set of samples.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HeadScore {
    /// Samples scored.
    pub samples: usize,
    /// The head: recall@k and exact-set match.
    pub head: Score,
    /// The head: share of routed experts among its 2k best (a prefetch may load that many).
    pub recall_2k: f64,
    /// Baseline: layer N+1's routing at token t.
    pub persistence: Score,
    /// Baseline: layer N+1's router applied to `h_N(t)`.
    pub router: Score,
}

/// Scores `head` (reading `inputs`) and the baselines on `samples`; `skip` is layer N+1's router
/// (`[experts, hidden]`).
pub fn score_head(inputs: &HeadInputs<'_>, head: &Head, skip: &[f32], samples: &[usize]) -> HeadScore {
    let meta = &inputs.data.meta;
    let k = meta.top_k;
    let mut tape = Tape::default();
    let mut logits = vec![0f32; meta.experts];
    let (mut trained, mut trained_2k) = (Tally::default(), Tally::default());
    let (mut persistence, mut router) = (Tally::default(), Tally::default());
    for &t in samples {
        let target = inputs.target(t);
        head.forward(&inputs.dense(t), &inputs.active(t), &mut tape, &mut logits);
        let ranked = top_k(&logits, 2 * k);
        trained.add(&ranked[..k.min(ranked.len())], target);
        trained_2k.add(&ranked, target);
        persistence.add(inputs.persistence(t), target);
        let h = inputs.data.hidden(t, inputs.j);
        let scores: Vec<f32> = skip.chunks_exact(meta.hidden).map(|row| dot(row, h)).collect();
        router.add(&top_k(&scores, k), target);
    }
    HeadScore {
        samples: samples.len(),
        head: trained.into(),
        recall_2k: trained_2k.recall(),
        persistence: persistence.into(),
        router: router.into(),
    }
}

/// The mean of `v` (0 when empty).
pub fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}
