//! Belady's MIN: evict the expert whose next use is farthest in the future (the optimum for
//! demand caching, used as the upper bound in `simulate`).
//!
//! The policy is built from the full access sequence, in the order the
//! [`CacheModel`](crate::experts::cache_model::CacheModel) accesses experts (see
//! [`crate::sim::access_sequence`]); each `on_access` consumes that expert's next position, so
//! the cursor advances by itself. Within one routed layer the order of accesses does not matter.

use std::collections::{HashMap, VecDeque};

use super::{argmin, CachePolicy, ExpertId, PolicyContext};

/// Belady's optimal offline policy (demand caching only).
pub struct Belady {
    next: HashMap<ExpertId, VecDeque<usize>>,
}

impl Belady {
    /// A policy that knows every future access, in order.
    pub fn new(sequence: &[ExpertId]) -> Belady {
        let mut next: HashMap<ExpertId, VecDeque<usize>> = HashMap::new();
        for (t, &id) in sequence.iter().enumerate() {
            next.entry(id).or_default().push_back(t);
        }
        Belady { next }
    }

    /// Position of the next use of `id`, `usize::MAX` if it is never used again.
    pub fn next_use(&self, id: ExpertId) -> usize {
        self.next.get(&id).and_then(|q| q.front().copied()).unwrap_or(usize::MAX)
    }
}

impl CachePolicy for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }

    fn on_access(&mut self, id: ExpertId, _ctx: &PolicyContext) {
        if let Some(q) = self.next.get_mut(&id) {
            q.pop_front();
        }
    }

    fn on_insert(&mut self, _id: ExpertId, _ctx: &PolicyContext) {}

    fn on_evict(&mut self, _id: ExpertId) {}

    fn victim(&mut self, candidates: &[ExpertId], _ctx: &PolicyContext) -> usize {
        // Farthest next use = smallest `Reverse(next)`; first candidate on ties.
        argmin(candidates.iter().map(|&c| std::cmp::Reverse(self.next_use(c))))
    }
}
