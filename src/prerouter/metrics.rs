//! Scoring predicted expert sets against routed ones: recall@k and exact-set match.

use serde::Serialize;

/// The `k` highest-scoring indices, best first (ties: lower index first).
pub fn top_k(scores: &[f32], k: usize) -> Vec<u16> {
    let mut idx: Vec<u16> = (0..scores.len() as u16).collect();
    idx.sort_by(|&a, &b| scores[usize::from(b)].total_cmp(&scores[usize::from(a)]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Running totals of recall@k and exact-set match over predictions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Tally {
    /// Σ |predicted ∩ routed| / |routed|.
    recall_sum: f64,
    /// Predictions whose set equals the routed set.
    exact: usize,
    /// Predictions scored.
    count: usize,
}

impl Tally {
    /// Scores one prediction (`predicted` and `routed` hold distinct ids; exact match needs
    /// equal counts).
    pub fn add(&mut self, predicted: &[u16], routed: &[u16]) {
        let hits = routed.iter().filter(|e| predicted.contains(e)).count();
        self.recall_sum += hits as f64 / routed.len().max(1) as f64;
        self.exact += usize::from(hits == routed.len() && predicted.len() == routed.len());
        self.count += 1;
    }

    /// Share of routed experts that were predicted (0 before any prediction).
    pub fn recall(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.recall_sum / self.count as f64
        }
    }

    /// Share of predictions that got the whole set.
    pub fn exact_match(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.exact as f64 / self.count as f64
        }
    }

    /// Predictions scored.
    pub fn count(&self) -> usize {
        self.count
    }
}
