//! The bounded collection of past request EAMs, with most-similar replacement and persistence.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{combine, top_m, Eam, EamError, RequestEam};
use crate::experts::policy::Phase;

/// A bounded collection of past request EAMs.
#[derive(Clone, Debug)]
pub struct EamCollection {
    capacity: usize,
    layers: usize,
    experts: usize,
    pub(super) entries: Vec<RequestEam>,
    pub(super) norms: Vec<[f64; 2]>,
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
