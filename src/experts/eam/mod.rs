//! Expert activation matrices (EAMs), the EAM collection (EAMC) and the tracker that feeds
//! MoE-Infinity's predictions (paper §4.3–4.5).
//!
//! * An [`Eam`] is an `L × E` matrix of token counts: `M[l][e]` tokens routed to expert `e` of
//!   layer `l`. The tracker keeps the *iteration-level* EAM of the current step and the
//!   *request-level* EAM ([`RequestEam`]) of each running request (several when the scheduler
//!   batches them: each step's rows are attributed to their requests), the latter split in a
//!   prefill and a decode matrix.
//! * **Matching.** A request EAM is flattened as its prefill and decode matrices, each scaled to
//!   unit L2 norm, concatenated; similarity is the cosine of those vectors. So a long prompt's
//!   prefill counts do not drown the decode pattern: with both halves present the similarity is
//!   the mean of the two per-phase cosines. The query is the current request's EAM so far
//!   (including the step in progress) weighted towards recent steps (each earlier step's counts
//!   times [`QUERY_DECAY`] per step since), kept up to date incrementally so a match costs
//!   `O(collection)` per routed expert rather than `O(collection · L · E)`. The collection
//!   keeps the unweighted EAMs.
//! * The [`EamCollection`] holds at most `capacity` past request EAMs
//!   ([`DEFAULT_EAMC_CAPACITY`]); when full, an incoming EAM replaces the entry *most similar* to
//!   it, keeping the collection recent and diverse (paper appendix B.1).
//! * **PredictEAM.** The predicted matrix sums the `m` best matches ([`DEFAULT_MATCHES`]; only
//!   entries with positive similarity count), taking from each the matrix of the current phase
//!   (or its other one if that is empty); rows are normalised per layer when read
//!   ([`Prediction::probability`]). With an empty collection (or no positive match) the current
//!   request's own EAM stands in. With several running requests the prediction is the sum of
//!   each one's (the union of what they will need). [`EamTracker::predict`] weights a later layer `i` seen from
//!   layer `l` by `1 − (i − l)/L`.

mod collection;
mod tracker;

pub use collection::EamCollection;
pub use tracker::{EamTracker, Prediction, RequestKey, SOLO};

use std::path::PathBuf;

use crate::experts::policy::Phase;

/// Default number of request EAMs the collection keeps (`--eamc-capacity`).
pub const DEFAULT_EAMC_CAPACITY: usize = 300;

/// The weight per step of age of a step's counts in the query matched against the collection
/// (recent routing says more about what comes next; measured in `benches/LOG.md`, issue 48).
pub const QUERY_DECAY: f64 = 0.2;

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

    /// Multiplies every count by `f`.
    pub fn scale(&mut self, f: f32) {
        self.counts.iter_mut().for_each(|c| *c *= f);
        self.row_sums.iter_mut().for_each(|c| *c *= f);
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
