//! The tracker of the current step's and request's EAMs, and PredictEAM.

use std::path::Path;

use super::{combine, phase_index, top_m, Eam, EamCollection, EamError, RequestEam};
use crate::experts::policy::{ExpertId, Phase};

/// A predicted EAM: the sum of some source matrices, read row-normalised.
pub struct Prediction<'a> {
    experts: usize,
    sources: Vec<&'a Eam>,
    matched: usize,
}

impl Prediction<'_> {
    /// Experts per layer.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// How many collection entries were summed (0: the current request's own EAM was used).
    pub fn matched(&self) -> usize {
        self.matched
    }

    /// Summed predicted count of (layer, expert).
    pub fn count(&self, layer: usize, expert: usize) -> f32 {
        self.sources.iter().map(|s| s.get(layer, expert)).sum()
    }

    /// Summed predicted count of a whole layer.
    pub fn row_sum(&self, layer: usize) -> f32 {
        self.sources.iter().map(|s| s.row_sum(layer)).sum()
    }

    /// Likelihood of (layer, expert): its count over its layer's (0 for an empty row).
    pub fn probability(&self, layer: usize, expert: usize) -> f32 {
        let sum = self.row_sum(layer);
        if sum == 0.0 {
            0.0
        } else {
            self.count(layer, expert) / sum
        }
    }
}

/// Tracks the current step's and request's EAMs, owns the collection and predicts.
pub struct EamTracker {
    collection: EamCollection,
    current: RequestEam,
    iteration: Eam,
    phase: Phase,
    matches: usize,
    /// Per entry, dot products of the current request's (prefill, decode) with the entry's.
    dots: Vec<[f64; 2]>,
    /// Squared norms of the current request's (prefill, decode).
    query_norm2: [f64; 2],
    /// The best matches for the current request, kept up to date by every change.
    best: Vec<(usize, f64)>,
}

impl EamTracker {
    /// A tracker for `layers × experts` with a collection of `capacity` entries, summing the `m`
    /// best matches.
    pub fn new(layers: usize, experts: usize, capacity: usize, m: usize) -> EamTracker {
        EamTracker {
            collection: EamCollection::new(capacity, layers, experts),
            current: RequestEam::new(layers, experts),
            iteration: Eam::new(layers, experts),
            phase: Phase::Prefill,
            matches: m,
            dots: Vec::new(),
            query_norm2: [0.0; 2],
            best: Vec::new(),
        }
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.iteration.layers()
    }

    /// Experts per layer.
    pub fn experts(&self) -> usize {
        self.iteration.experts()
    }

    /// Phase of the current step.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The collection of past request EAMs.
    pub fn collection(&self) -> &EamCollection {
        &self.collection
    }

    /// The current request's EAM so far.
    pub fn current(&self) -> &RequestEam {
        &self.current
    }

    /// The current step's (iteration-level) EAM so far.
    pub fn iteration(&self) -> &Eam {
        &self.iteration
    }

    /// Starts a request: its EAM starts empty.
    pub fn begin_request(&mut self) {
        self.current = RequestEam::new(self.layers(), self.experts());
        self.iteration.clear();
        self.reset_query();
    }

    /// Ends a request: its EAM goes into the collection.
    pub fn end_request(&mut self) {
        let fresh = RequestEam::new(self.layers(), self.experts());
        let done = std::mem::replace(&mut self.current, fresh);
        self.collection.insert(done);
        self.iteration.clear();
        self.reset_query();
    }

    /// Starts a step of `phase`.
    pub fn begin_step(&mut self, phase: Phase) {
        self.phase = phase;
        self.iteration.clear();
    }

    /// Counts `tokens` tokens routed to (layer, expert) in the current step.
    pub fn record(&mut self, layer: usize, expert: usize, tokens: u32) {
        self.add(layer, expert, tokens);
        self.refresh_matches();
    }

    /// Counts a whole layer's routing at once: (expert, tokens) pairs.
    pub fn record_layer(&mut self, layer: usize, counts: &[(usize, u32)]) {
        for &(expert, tokens) in counts {
            self.add(layer, expert, tokens);
        }
        self.refresh_matches();
    }

    fn add(&mut self, layer: usize, expert: usize, tokens: u32) {
        let n = tokens as f64;
        let h = phase_index(self.phase);
        let i = layer * self.experts() + expert;
        let old = self.current.phase(self.phase).counts()[i] as f64;
        self.query_norm2[h] += 2.0 * old * n + n * n;
        for (d, e) in self.dots.iter_mut().zip(&self.collection.entries) {
            d[h] += n * e.phase(self.phase).counts()[i] as f64;
        }
        self.current.add(self.phase, layer, expert, tokens as f32);
        self.iteration.add(layer, expert, tokens as f32);
    }

    /// Re-ranks the collection against the current request.
    fn refresh_matches(&mut self) {
        let qn = self.query_norm2.map(f64::sqrt);
        let sims = self.dots.iter().zip(&self.collection.norms).map(|(&d, &n)| combine(d, qn, n)).enumerate();
        self.best = top_m(sims, self.matches);
    }

    /// Recomputes the incremental match state from scratch.
    fn reset_query(&mut self) {
        let q = &self.current;
        self.dots =
            self.collection.entries.iter().map(|e| [q.prefill.dot(&e.prefill), q.decode.dot(&e.decode)]).collect();
        let n = q.norms();
        self.query_norm2 = [n[0] * n[0], n[1] * n[1]];
        self.refresh_matches();
    }

    /// The `m` entries best matching the current request: (index, similarity), best first.
    pub fn best_matches(&self) -> &[(usize, f64)] {
        &self.best
    }

    /// PredictEAM for the current phase: the best matches, or the current request's own EAM.
    pub fn prediction(&self) -> Prediction<'_> {
        let matches = &self.best;
        let sources: Vec<&Eam> = if matches.is_empty() {
            vec![self.current.for_phase(self.phase)]
        } else {
            matches.iter().map(|&(i, _)| self.collection.entries[i].for_phase(self.phase)).collect()
        };
        Prediction { experts: self.experts(), sources, matched: matches.len() }
    }

    /// Likely experts of the next `lookahead` layers after `layer` that have any predicted
    /// activation, scored `probability · (1 − (i − layer)/L)`, best first (ties by id).
    pub fn predict(&self, layer: usize, lookahead: usize) -> Vec<(ExpertId, f32)> {
        let prediction = self.prediction();
        let layers = self.layers();
        let mut out = Vec::new();
        let future = (layer + 1..layers).filter(|&i| prediction.row_sum(i) > 0.0);
        for i in future.take(lookahead) {
            let decay = 1.0 - (i - layer) as f32 / layers as f32;
            for e in 0..self.experts() {
                let p = prediction.probability(i, e);
                if p > 0.0 {
                    out.push((ExpertId::new(i, e), p * decay));
                }
            }
        }
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// Saves the collection (see [`EamCollection::save`]).
    pub fn save(&self, path: &Path) -> Result<(), EamError> {
        self.collection.save(path)
    }

    /// Replaces the collection with one saved earlier; the file must match this model's
    /// dimensions.
    pub fn load(&mut self, path: &Path) -> Result<(), EamError> {
        self.collection = EamCollection::load(path, self.collection.capacity(), self.layers(), self.experts())?;
        self.reset_query();
        Ok(())
    }
}
