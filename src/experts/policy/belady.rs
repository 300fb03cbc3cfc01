//! Belady's MIN: evict the expert whose next use is farthest in the future (the optimum for
//! demand caching, used as the upper bound in `simulate`).
//!
//! The policy is built from the full access sequence, in the order the
//! [`CacheModel`](crate::experts::cache_model::CacheModel) accesses experts (see
//! [`crate::sim::access_sequence`]); each `on_access` consumes that expert's next position, so
//! the cursor advances by itself. Within one routed layer the order of accesses does not matter.

use super::{CachePolicy, EvictionKey, ExpertId, PolicyContext};

/// Belady's optimal offline policy (demand caching only).
pub struct Belady {
    experts: usize,
    /// Per dense id (`layer × experts + expert`): the positions of its uses, ascending.
    uses: Vec<Vec<usize>>,
    /// Per dense id: how many of its uses are consumed.
    cursor: Vec<usize>,
}

impl Belady {
    /// A policy that knows every future access, in order, for a model of `experts` experts per
    /// layer.
    pub fn new(sequence: &[ExpertId], experts: usize) -> Belady {
        let index = |id: ExpertId| id.layer as usize * experts + id.expert as usize;
        let ids = sequence.iter().map(|&id| index(id) + 1).max().unwrap_or(0);
        let mut uses = vec![Vec::new(); ids];
        for (t, &id) in sequence.iter().enumerate() {
            uses[index(id)].push(t);
        }
        Belady { experts, uses, cursor: vec![0; ids] }
    }

    /// Position of the next use of `id`, `usize::MAX` if it is never used again.
    pub fn next_use(&self, id: ExpertId) -> usize {
        let i = id.layer as usize * self.experts + id.expert as usize;
        self.uses.get(i).and_then(|u| u.get(self.cursor[i])).copied().unwrap_or(usize::MAX)
    }
}

impl CachePolicy for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }

    fn on_access(&mut self, id: ExpertId, _ctx: &PolicyContext) {
        let i = id.layer as usize * self.experts + id.expert as usize;
        if let Some(c) = self.cursor.get_mut(i) {
            *c += 1;
        }
    }

    fn on_insert(&mut self, _id: ExpertId, _ctx: &PolicyContext) {}

    /// The farthest next use goes first.
    fn eviction_keys(&self, candidates: &[ExpertId], _ctx: &PolicyContext) -> Vec<EvictionKey> {
        candidates.iter().map(|&c| (-(self.next_use(c) as f64), 0)).collect()
    }
}
