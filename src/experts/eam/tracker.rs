//! The tracker of the current step's and request's EAMs, and PredictEAM.

use std::path::Path;

use super::{combine, phase_index, top_m, Eam, EamCollection, EamError, RequestEam, QUERY_DECAY};
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

    /// How many collection entries were summed (0: the running requests' own EAMs were used).
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

/// Identifies a running request to the tracker (the scheduler's request id; [`SOLO`] for the
/// one request of a caller that runs one at a time).
pub type RequestKey = u64;

/// The key of [`EamTracker::begin_request`]'s request.
pub const SOLO: RequestKey = RequestKey::MAX;

/// A running request: its EAM so far and how it matches the collection, kept up to date
/// incrementally.
struct Running {
    key: RequestKey,
    eam: RequestEam,
    /// The EAM matched against the collection: `eam` with each earlier step's counts weighted
    /// by [`QUERY_DECAY`] per step since.
    query: RequestEam,
    /// Per entry, dot products of the request's (prefill, decode) with the entry's.
    dots: Vec<[f64; 2]>,
    /// Squared norms of the request's (prefill, decode).
    query_norm2: [f64; 2],
    /// The best matches for the request.
    best: Vec<(usize, f64)>,
}

impl Running {
    fn new(key: RequestKey, layers: usize, experts: usize, collection: &EamCollection, m: usize) -> Running {
        let mut r = Running {
            key,
            eam: RequestEam::new(layers, experts),
            query: RequestEam::new(layers, experts),
            dots: Vec::new(),
            query_norm2: [0.0; 2],
            best: vec![],
        };
        r.reset_query(collection, m);
        r
    }

    /// Adds `n` tokens of `phase` at flat index `i` = (layer, expert).
    fn add(&mut self, collection: &EamCollection, phase: Phase, (layer, expert): (usize, usize), n: f64) {
        let h = phase_index(phase);
        let i = layer * self.eam.phase(phase).experts() + expert;
        let old = self.query.phase(phase).counts()[i] as f64;
        self.query.add(phase, layer, expert, n as f32);
        self.query_norm2[h] += 2.0 * old * n + n * n;
        for (d, e) in self.dots.iter_mut().zip(&collection.entries) {
            d[h] += n * e.phase(phase).counts()[i] as f64;
        }
        self.eam.add(phase, layer, expert, n as f32);
    }

    /// Weights everything counted so far by [`QUERY_DECAY`] in the query (a new step starts);
    /// the similarities, being cosines, only change with the steps that follow.
    fn decay_query(&mut self) {
        let g = QUERY_DECAY;
        self.query.prefill.scale(g as f32);
        self.query.decode.scale(g as f32);
        self.dots.iter_mut().for_each(|d| *d = d.map(|x| x * g));
        self.query_norm2 = self.query_norm2.map(|x| x * g * g);
    }

    /// Re-ranks the collection against the request.
    fn refresh_matches(&mut self, collection: &EamCollection, m: usize) {
        let qn = self.query_norm2.map(f64::sqrt);
        let sims = self.dots.iter().zip(&collection.norms).map(|(&d, &n)| combine(d, qn, n)).enumerate();
        self.best = top_m(sims, m);
    }

    /// Recomputes the match state from scratch (the collection changed).
    fn reset_query(&mut self, collection: &EamCollection, m: usize) {
        let q = &self.query;
        self.dots = collection.entries.iter().map(|e| [q.prefill.dot(&e.prefill), q.decode.dot(&e.decode)]).collect();
        let n = q.norms();
        self.query_norm2 = [n[0] * n[0], n[1] * n[1]];
        self.refresh_matches(collection, m);
    }
}

/// Tracks the current step's EAM and each running request's, owns the collection and predicts
/// (for the union of the running requests: the sum of each one's prediction).
pub struct EamTracker {
    collection: EamCollection,
    running: Vec<Running>,
    iteration: Eam,
    phase: Phase,
    matches: usize,
}

impl EamTracker {
    /// A tracker for `layers × experts` with a collection of `capacity` entries, summing the `m`
    /// best matches.
    pub fn new(layers: usize, experts: usize, capacity: usize, m: usize) -> EamTracker {
        EamTracker {
            collection: EamCollection::new(capacity, layers, experts),
            running: Vec::new(),
            iteration: Eam::new(layers, experts),
            phase: Phase::Prefill,
            matches: m,
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

    /// The EAM so far of the first running request (`None` when none runs).
    pub fn current(&self) -> Option<&RequestEam> {
        self.running.first().map(|r| &r.eam)
    }

    /// The EAM so far of running request `key`.
    pub fn request(&self, key: RequestKey) -> Option<&RequestEam> {
        self.running.iter().find(|r| r.key == key).map(|r| &r.eam)
    }

    /// The current step's (iteration-level) EAM so far.
    pub fn iteration(&self) -> &Eam {
        &self.iteration
    }

    /// Starts a request that runs alone ([`SOLO`]): any other running request is dropped
    /// unfiled.
    pub fn begin_request(&mut self) {
        self.running.clear();
        self.iteration.clear();
        self.begin_request_of(SOLO);
    }

    /// Ends the request that ran alone (every running request): its EAM goes into the collection.
    pub fn end_request(&mut self) {
        let keys: Vec<RequestKey> = self.running.iter().map(|r| r.key).collect();
        keys.into_iter().for_each(|k| self.end_request_of(k));
        self.iteration.clear();
    }

    /// Starts request `key` beside those running: its EAM starts empty.
    pub fn begin_request_of(&mut self, key: RequestKey) {
        self.running.retain(|r| r.key != key);
        let r = Running::new(key, self.layers(), self.experts(), &self.collection, self.matches);
        self.running.push(r);
    }

    /// Ends request `key`: its EAM goes into the collection (the others' matches are computed
    /// again over the changed collection).
    pub fn end_request_of(&mut self, key: RequestKey) {
        let Some(i) = self.running.iter().position(|r| r.key == key) else { return };
        let done = self.running.remove(i);
        self.collection.insert(done.eam);
        for r in &mut self.running {
            r.reset_query(&self.collection, self.matches);
        }
    }

    /// Starts a step of `phase`.
    pub fn begin_step(&mut self, phase: Phase) {
        for r in &mut self.running {
            r.decay_query();
        }
        self.phase = phase;
        self.iteration.clear();
    }

    /// Counts `tokens` tokens routed to (layer, expert) in the current step, for the request
    /// when exactly one runs.
    pub fn record(&mut self, layer: usize, expert: usize, tokens: u32) {
        self.record_layer(layer, [(expert, tokens)]);
    }

    /// Counts a whole layer's routing at once: (expert, tokens) pairs, for the request when
    /// exactly one runs (with several, rows that [`EamTracker::record_layer_of`] does not
    /// attribute count in the step's EAM only).
    pub fn record_layer(&mut self, layer: usize, counts: impl IntoIterator<Item = (usize, u32)>) {
        let only = match &self.running[..] {
            [r] => Some((r.key, self.phase)),
            _ => None,
        };
        self.count(only, layer, counts);
    }

    /// Counts a layer's routing of request `key`'s rows of the step ((expert, tokens) pairs),
    /// in its `phase` (a prompt chunk beside other requests' decode tokens is prefill).
    pub fn record_layer_of(
        &mut self,
        key: RequestKey,
        phase: Phase,
        layer: usize,
        counts: impl IntoIterator<Item = (usize, u32)>,
    ) {
        self.count(Some((key, phase)), layer, counts);
    }

    /// Adds `counts` of `layer` to the step's EAM and, in its phase, to `request`'s (if it runs).
    fn count(
        &mut self,
        request: Option<(RequestKey, Phase)>,
        layer: usize,
        counts: impl IntoIterator<Item = (usize, u32)>,
    ) {
        let (collection, iteration) = (&self.collection, &mut self.iteration);
        let mut running =
            request.and_then(|(key, phase)| self.running.iter_mut().find(|r| r.key == key).map(|r| (r, phase)));
        for (expert, tokens) in counts {
            iteration.add(layer, expert, tokens as f32);
            if let Some((r, phase)) = running.as_mut() {
                r.add(collection, *phase, (layer, expert), tokens as f64);
            }
        }
        if let Some((r, _)) = running {
            r.refresh_matches(collection, self.matches);
        }
    }

    /// The `m` entries best matching the first running request: (index, similarity), best
    /// first.
    pub fn best_matches(&self) -> &[(usize, f64)] {
        self.running.first().map_or(&[], |r| &r.best[..])
    }

    /// PredictEAM for the current phase, for the union of the running requests: each one's best
    /// matches, or its own EAM where it has none, summed.
    pub fn prediction(&self) -> Prediction<'_> {
        let phase = self.phase;
        let mut sources = Vec::new();
        let mut matched = 0;
        for r in &self.running {
            match r.best.is_empty() {
                true => sources.push(r.eam.for_phase(phase)),
                false => sources.extend(r.best.iter().map(|&(i, _)| self.collection.entries[i].for_phase(phase))),
            }
            matched += r.best.len();
        }
        Prediction { experts: self.experts(), sources, matched }
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
        for r in &mut self.running {
            r.reset_query(&self.collection, self.matches);
        }
        Ok(())
    }
}
