//! MoE-Infinity's activation-aware replacement (Algorithm 1 of the paper), with the layer
//! factor measured from the layer being routed.
//!
//! For every candidate the priority is
//! `p = (pEAM[l][e] + ε) / (Σ_e' pEAM[l][e'] + E·ε) / (1 + β·d/L)`, where `pEAM` is the predicted
//! activation matrix of [`EamTracker::prediction`](crate::experts::eam::EamTracker::prediction)
//! (the best-matching EAMs of the collection, or the current request's own EAM while the
//! collection is empty), `l` the candidate's layer, `L` the number of layers and `d` how many
//! layers are routed before `l` comes again (`(l − c − 1) mod L` from the layer `c` being routed:
//! 0 for the next layer). The `E·ε` in the denominator keeps an empty row finite (every expert of
//! it gets `1/E`). The lowest priority is evicted; ties (e.g. experts never seen in the
//! prediction) go to the least recently used.
//!
//! The paper's factor is `1 − l/L`, fixed per layer (early layers kept, as prefetch helps late
//! ones more); measured against Belady in the simulator (`benches/LOG.md`, issue 48) the
//! distance to the next use of the layer does better at every capacity, with `β = 2`.

use super::{CachePolicy, EvictionKey, ExpertId, PolicyContext, Recency};
use crate::experts::eam::Prediction;

/// The ε added to every predicted count before normalising a row.
pub const EPSILON: f32 = 1e-4;

/// The weight `β` of a layer's distance from the layer being routed.
pub const DISTANCE_WEIGHT: f32 = 2.0;

/// Eviction priority of `id` under `prediction` while `current` is routed, in a model of `layers`
/// layers (higher = keep).
pub fn priority(prediction: &Prediction, id: ExpertId, current: usize, layers: usize) -> f32 {
    (prediction.count(id.layer as usize, id.expert as usize) + EPSILON)
        * layer_scale(prediction, id.layer as usize, current, layers)
}

/// The priority the EAMC prefetcher compares a candidate with its victim by: the paper's
/// `(pEAM[l][e] + ε) / (Σ_e' pEAM[l][e'] + E·ε) · (1 − l/L)`, fixed per layer. With
/// [`priority`]'s distance factor instead, the prefetcher evicts the experts of the layers just
/// routed for its guesses of the next ones (which the next token needs back): on the held-out
/// workload at a quarter of the experts it reads 2.5× the bytes for 10 points of hit rate
/// (`benches/LOG.md`, issue 48).
pub fn prefetch_priority(prediction: &Prediction, id: ExpertId, layers: usize) -> f32 {
    let l = id.layer as usize;
    (prediction.count(l, id.expert as usize) + EPSILON) * row_scale(prediction, l) * (1.0 - l as f32 / layers as f32)
}

/// `1 / (Σ_e' pEAM[l][e'] + E·ε)`: what turns a count of `layer`'s row into a share of it.
fn row_scale(prediction: &Prediction, layer: usize) -> f32 {
    1.0 / (prediction.row_sum(layer) + prediction.experts() as f32 * EPSILON)
}

/// The per-layer factor of [`priority`]: [`row_scale`] `/ (1 + β·d/L)`.
fn layer_scale(prediction: &Prediction, layer: usize, current: usize, layers: usize) -> f32 {
    let distance = ((layer + layers - current % layers - 1) % layers) as f32 / layers as f32;
    row_scale(prediction, layer) / (1.0 + DISTANCE_WEIGHT * distance)
}

/// The EAMC policy; keeps recency only to break ties.
#[derive(Default)]
pub struct EamcPolicy {
    recency: Recency,
}

impl CachePolicy for EamcPolicy {
    fn name(&self) -> &'static str {
        "eamc"
    }

    fn on_access(&mut self, id: ExpertId, ctx: &PolicyContext) {
        self.recency.touch(id, ctx);
    }

    fn on_insert(&mut self, id: ExpertId, ctx: &PolicyContext) {
        self.recency.touch(id, ctx);
    }

    /// (priority, last use): the lowest priority goes first, ties to the least recently used.
    fn eviction_keys(&self, candidates: &[ExpertId], ctx: &PolicyContext) -> Vec<EvictionKey> {
        let prediction = ctx.eam.prediction();
        let layers = ctx.layers();
        let scale: Vec<f32> = (0..layers).map(|l| layer_scale(&prediction, l, ctx.layer, layers)).collect();
        candidates
            .iter()
            .map(|&c| {
                let count = prediction.count(c.layer as usize, c.expert as usize);
                (((count + EPSILON) * scale[c.layer as usize]) as f64, self.recency.last(c, ctx))
            })
            .collect()
    }
}
