//! Least recently used: evict the expert whose last access (or load) is oldest.

use super::{argmin, entry, CachePolicy, ExpertId, PolicyContext};

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
        argmin(candidates.iter().map(|&c| self.last.get(ctx.index(c)).copied().unwrap_or(0)))
    }
}
