//! Least recently used: evict the expert whose last access (or load) is oldest.

use super::{entry, lowest, CachePolicy, ExpertId, PolicyContext};

/// LRU over the logical clock; a load counts as a use.
#[derive(Default)]
pub struct Lru {
    last: Vec<u64>,
}

impl CachePolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn on_access(&mut self, id: ExpertId, ctx: &PolicyContext) {
        *entry(&mut self.last, ctx.index(id)) = ctx.clock;
    }

    fn on_insert(&mut self, id: ExpertId, ctx: &PolicyContext) {
        *entry(&mut self.last, ctx.index(id)) = ctx.clock;
    }

    fn on_evict(&mut self, _id: ExpertId) {}

    fn victim(&mut self, candidates: &[ExpertId], ctx: &PolicyContext) -> usize {
        lowest(&self.keys(candidates, ctx), 1)[0]
    }

    fn victims(&mut self, candidates: &[ExpertId], n: usize, ctx: &PolicyContext) -> Vec<usize> {
        lowest(&self.keys(candidates, ctx), n)
    }
}

impl Lru {
    /// Last use of each candidate (smallest is evicted first).
    fn keys(&self, candidates: &[ExpertId], ctx: &PolicyContext) -> Vec<u64> {
        candidates.iter().map(|&c| self.last.get(ctx.index(c)).copied().unwrap_or(0)).collect()
    }
}
