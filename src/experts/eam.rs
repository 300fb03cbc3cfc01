//! Expert activation matrices (EAMs), the EAM collection (EAMC) and the tracker that feeds
//! MoE-Infinity's predictions (paper §4.3–4.5).
//!
//! * An [`Eam`] is an `L × E` matrix of token counts: `M[l][e]` tokens routed to expert `e` of
//!   layer `l`. The tracker keeps the *iteration-level* EAM of the current step and the
//!   *request-level* EAM ([`RequestEam`]) of the current request, the latter split in a prefill
//!   and a decode matrix.
//! * **Matching.** A request EAM is flattened as its prefill and decode matrices, each scaled to
//!   unit L2 norm, concatenated; similarity is the cosine of those vectors. So a long prompt's
//!   prefill counts do not drown the decode pattern: with both halves present the similarity is
//!   the mean of the two per-phase cosines. The query is the current request's EAM so far
//!   (including the step in progress), kept up to date incrementally so a match costs
//!   `O(collection)` per routed expert rather than `O(collection · L · E)`.
//! * The [`EamCollection`] holds at most `capacity` past request EAMs
//!   ([`DEFAULT_EAMC_CAPACITY`]); when full, an incoming EAM replaces the entry *most similar* to
//!   it, keeping the collection recent and diverse (paper appendix B.1).
//! * **PredictEAM.** The predicted matrix sums the `m` best matches ([`DEFAULT_MATCHES`]; only
//!   entries with positive similarity count), taking from each the matrix of the current phase
//!   (or its other one if that is empty); rows are normalised per layer when read
//!   ([`Prediction::probability`]). With an empty collection (or no positive match) the current
//!   request's own EAM stands in. [`EamTracker::predict`] weights a later layer `i` seen from
//!   layer `l` by `1 − (i − l)/L`.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::experts::policy::{ExpertId, Phase};

/// Default number of request EAMs the collection keeps (`--eamc-capacity`).
pub const DEFAULT_EAMC_CAPACITY: usize = 300;

/// Default number of best-matching EAMs summed by PredictEAM.
pub const DEFAULT_MATCHES: usize = 3;

/// Errors of EAM collection persistence.
#[derive(Debug, thiserror::Error)]
pub enum EamError {
    /// The file could not be read or written.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not a version-1 EAM collection.
    #[error("invalid EAM collection {path}: {message}")]
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The file was recorded for a model of other dimensions.
    #[error("EAM collection {path} is for {found:?} (layers, experts), the model has {expected:?}")]
    Dims {
        /// The file involved.
        path: PathBuf,
        /// (layers, experts) of the model.
        expected: (usize, usize),
        /// (layers, experts) in the file.
        found: (usize, usize),
    },
}

impl From<EamError> for crate::Error {
    fn from(e: EamError) -> crate::Error {
        match e {
            EamError::Io { path, source } => crate::Error::Io { path, source },
            other => crate::Error::InvalidArgument(other.to_string()),
        }
    }
}

/// An `L × E` matrix of token counts.
#[derive(Clone, Debug, PartialEq)]
pub struct Eam {
    layers: usize,
    experts: usize,
    counts: Vec<f32>,
    row_sums: Vec<f32>,
}

impl Eam {
    /// An all-zero matrix.
    pub fn new(layers: usize, experts: usize) -> Eam {
        Eam { layers, experts, counts: vec![0.0; layers * experts], row_sums: vec![0.0; layers] }
    }

    /// Number of layers (rows).
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Number of experts per layer (columns).
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Adds `n` tokens to (layer, expert).
    pub fn add(&mut self, layer: usize, expert: usize, n: f32) {
        self.counts[layer * self.experts + expert] += n;
        self.row_sums[layer] += n;
    }

    /// Tokens counted at (layer, expert).
    pub fn get(&self, layer: usize, expert: usize) -> f32 {
        self.counts[layer * self.experts + expert]
    }

    /// The counts of one layer.
    pub fn row(&self, layer: usize) -> &[f32] {
        &self.counts[layer * self.experts..(layer + 1) * self.experts]
    }

    /// Sum of one layer's counts.
    pub fn row_sum(&self, layer: usize) -> f32 {
        self.row_sums[layer]
    }

    /// The flattened matrix, row-major.
    pub fn counts(&self) -> &[f32] {
        &self.counts
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.row_sums.iter().all(|&s| s == 0.0)
    }

    /// Resets every count to zero.
    pub fn clear(&mut self) {
        self.counts.fill(0.0);
        self.row_sums.fill(0.0);
    }

    /// Dot product of the flattened matrices (same dimensions required).
    pub fn dot(&self, other: &Eam) -> f64 {
        assert_eq!(self.counts.len(), other.counts.len(), "EAM dimensions differ");
        self.counts.iter().zip(&other.counts).map(|(&a, &b)| a as f64 * b as f64).sum()
    }

    /// L2 norm of the flattened matrix.
    pub fn norm(&self) -> f64 {
        self.dot(self).sqrt()
    }

    /// Cosine similarity of the flattened matrices; 0 when either is empty.
    pub fn cosine(&self, other: &Eam) -> f64 {
        let n = self.norm() * other.norm();
        if n == 0.0 {
            0.0
        } else {
            self.dot(other) / n
        }
    }
}

/// A request-level EAM: prefill and decode counted separately.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestEam {
    /// Counts of the prompt steps.
    pub prefill: Eam,
    /// Counts of the generation steps.
    pub decode: Eam,
}

impl RequestEam {
    /// Empty matrices.
    pub fn new(layers: usize, experts: usize) -> RequestEam {
        RequestEam { prefill: Eam::new(layers, experts), decode: Eam::new(layers, experts) }
    }

    /// The matrix of `phase`.
    pub fn phase(&self, phase: Phase) -> &Eam {
        match phase {
            Phase::Prefill => &self.prefill,
            Phase::Decode => &self.decode,
        }
    }

    /// The matrix predictions use in `phase`: that phase's, or the other one if it is empty.
    pub fn for_phase(&self, phase: Phase) -> &Eam {
        let own = self.phase(phase);
        if own.is_empty() {
            self.phase(other(phase))
        } else {
            own
        }
    }

    /// Adds `n` tokens of `phase` to (layer, expert).
    pub fn add(&mut self, phase: Phase, layer: usize, expert: usize, n: f32) {
        match phase {
            Phase::Prefill => self.prefill.add(layer, expert, n),
            Phase::Decode => self.decode.add(layer, expert, n),
        }
    }

    /// Whether both matrices are empty.
    pub fn is_empty(&self) -> bool {
        self.prefill.is_empty() && self.decode.is_empty()
    }

    /// L2 norms of (prefill, decode).
    pub fn norms(&self) -> [f64; 2] {
        [self.prefill.norm(), self.decode.norm()]
    }

    /// Cosine similarity of the per-phase unit-normalised, concatenated matrices.
    pub fn similarity(&self, other: &RequestEam) -> f64 {
        combine([self.prefill.dot(&other.prefill), self.decode.dot(&other.decode)], self.norms(), other.norms())
    }
}

fn other(phase: Phase) -> Phase {
    match phase {
        Phase::Prefill => Phase::Decode,
        Phase::Decode => Phase::Prefill,
    }
}

fn phase_index(phase: Phase) -> usize {
    match phase {
        Phase::Prefill => 0,
        Phase::Decode => 1,
    }
}

/// Cosine of `[a_p/|a_p|, a_d/|a_d|]` and `[b_p/|b_p|, b_d/|b_d|]` (empty halves left out) from
/// the per-phase dot products and norms.
fn combine(dots: [f64; 2], a: [f64; 2], b: [f64; 2]) -> f64 {
    let halves = |n: [f64; 2]| n.iter().filter(|&&x| x > 0.0).count() as f64;
    let (na, nb) = (halves(a), halves(b));
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    let s: f64 = (0..2).filter(|&h| a[h] > 0.0 && b[h] > 0.0).map(|h| dots[h] / (a[h] * b[h])).sum();
    s / (na * nb).sqrt()
}

/// Keeps the `m` best (similarity, index) pairs with positive similarity, best first, ties → lower
/// index.
fn top_m(sims: impl Iterator<Item = (usize, f64)>, m: usize) -> Vec<(usize, f64)> {
    let mut best: Vec<(usize, f64)> = Vec::with_capacity(m + 1);
    for (i, s) in sims {
        if s <= 0.0 {
            continue;
        }
        let pos = best.iter().position(|&(_, b)| s > b).unwrap_or(best.len());
        if pos < m {
            best.insert(pos, (i, s));
            best.truncate(m);
        }
    }
    best
}

/// A bounded collection of past request EAMs.
#[derive(Clone, Debug)]
pub struct EamCollection {
    capacity: usize,
    layers: usize,
    experts: usize,
    entries: Vec<RequestEam>,
    norms: Vec<[f64; 2]>,
}

/// On-disk form of an [`EamCollection`]: sparse `(index, count)` pairs per matrix.
#[derive(Serialize, Deserialize)]
struct EamcFile {
    format: String,
    version: u32,
    layers: usize,
    experts: usize,
    entries: Vec<EntryFile>,
}

#[derive(Serialize, Deserialize)]
struct EntryFile {
    prefill: Vec<(u32, f32)>,
    decode: Vec<(u32, f32)>,
}

const EAMC_FORMAT: &str = "moestream-eamc";
const EAMC_VERSION: u32 = 1;

impl EamCollection {
    /// An empty collection for `layers × experts` holding at most `capacity` entries.
    pub fn new(capacity: usize, layers: usize, experts: usize) -> EamCollection {
        EamCollection { capacity, layers, experts, entries: Vec::new(), norms: Vec::new() }
    }

    /// Most entries kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries kept now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entry `i`.
    pub fn get(&self, i: usize) -> Option<&RequestEam> {
        self.entries.get(i)
    }

    /// Adds a finished request's EAM. Empty EAMs and a zero capacity keep nothing. When full, the
    /// entry most similar to `eam` is replaced and its index returned; otherwise `None`.
    pub fn insert(&mut self, eam: RequestEam) -> Option<usize> {
        if self.capacity == 0 || eam.is_empty() {
            return None;
        }
        let norms = eam.norms();
        if self.entries.len() < self.capacity {
            self.entries.push(eam);
            self.norms.push(norms);
            return None;
        }
        let i = self.most_similar(&eam);
        self.entries[i] = eam;
        self.norms[i] = norms;
        Some(i)
    }

    /// Index of the entry most similar to `eam` (first on ties; 0 when all are dissimilar).
    fn most_similar(&self, eam: &RequestEam) -> usize {
        let sims = self.similarities(eam);
        let mut best = 0;
        for (i, &s) in sims.iter().enumerate() {
            if s > sims[best] {
                best = i;
            }
        }
        best
    }

    fn similarities(&self, query: &RequestEam) -> Vec<f64> {
        let qn = query.norms();
        self.entries
            .iter()
            .zip(&self.norms)
            .map(|(e, &n)| combine([query.prefill.dot(&e.prefill), query.decode.dot(&e.decode)], qn, n))
            .collect()
    }

    /// The `m` entries most similar to `query` with positive similarity: (index, similarity),
    /// best first.
    pub fn best_matches(&self, query: &RequestEam, m: usize) -> Vec<(usize, f64)> {
        top_m(self.similarities(query).into_iter().enumerate(), m)
    }

    /// Writes the collection as JSON (format `moestream-eamc`, version 1, sparse counts).
    pub fn save(&self, path: &Path) -> Result<(), EamError> {
        let sparse =
            |m: &Eam| m.counts().iter().enumerate().filter(|(_, &c)| c != 0.0).map(|(i, &c)| (i as u32, c)).collect();
        let file = EamcFile {
            format: EAMC_FORMAT.into(),
            version: EAMC_VERSION,
            layers: self.layers,
            experts: self.experts,
            entries: self
                .entries
                .iter()
                .map(|e| EntryFile { prefill: sparse(&e.prefill), decode: sparse(&e.decode) })
                .collect(),
        };
        let text =
            serde_json::to_string(&file).map_err(|e| EamError::Format { path: path.into(), message: e.to_string() })?;
        fs::write(path, text).map_err(|source| EamError::Io { path: path.into(), source })
    }

    /// Reads a collection written by [`save`](Self::save) for a `layers × experts` model; entries
    /// beyond `capacity` go through the usual most-similar replacement.
    pub fn load(path: &Path, capacity: usize, layers: usize, experts: usize) -> Result<EamCollection, EamError> {
        let format = |message: String| EamError::Format { path: path.into(), message };
        let text = fs::read_to_string(path).map_err(|source| EamError::Io { path: path.into(), source })?;
        let file: EamcFile = serde_json::from_str(&text).map_err(|e| format(e.to_string()))?;
        if file.format != EAMC_FORMAT || file.version != EAMC_VERSION {
            return Err(format(format!(
                "expected format {EAMC_FORMAT:?} version {EAMC_VERSION}, found {:?} version {}",
                file.format, file.version
            )));
        }
        if (file.layers, file.experts) != (layers, experts) {
            return Err(EamError::Dims {
                path: path.into(),
                expected: (layers, experts),
                found: (file.layers, file.experts),
            });
        }
        let mut collection = EamCollection::new(capacity, layers, experts);
        for entry in file.entries {
            let mut eam = RequestEam::new(layers, experts);
            for (phase, cells) in [(Phase::Prefill, entry.prefill), (Phase::Decode, entry.decode)] {
                for (i, c) in cells {
                    let i = i as usize;
                    if i >= layers * experts || !c.is_finite() || c < 0.0 {
                        return Err(format(format!("bad cell ({i}, {c})")));
                    }
                    eam.add(phase, i / experts, i % experts, c);
                }
            }
            collection.insert(eam);
        }
        Ok(collection)
    }
}

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
