//! Least frequently used, with global counts (BrainStorm-style statistical counting).
//!
//! Counts are kept for the whole run and survive eviction: an expert's frequency is how often it
//! was used since the cache was built, not since it was last loaded. Ties go to the least
//! recently used.

use super::{entry, lowest, CachePolicy, ExpertId, PolicyContext};

/// LFU over global use counts, ties → LRU.
#[derive(Default)]
pub struct Lfu {
    count: Vec<u64>,
    last: Vec<u64>,
}

impl CachePolicy for Lfu {
    fn name(&self) -> &'static str {
        "lfu"
    }

    fn on_access(&mut self, id: ExpertId, ctx: &PolicyContext) {
        let i = ctx.index(id);
        *entry(&mut self.count, i) += 1;
        *entry(&mut self.last, i) = ctx.clock;
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

impl Lfu {
    /// (use count, last use) of each candidate (smallest is evicted first).
    fn keys(&self, candidates: &[ExpertId], ctx: &PolicyContext) -> Vec<(u64, u64)> {
        candidates
            .iter()
            .map(|&c| {
                let i = ctx.index(c);
                (self.count.get(i).copied().unwrap_or(0), self.last.get(i).copied().unwrap_or(0))
            })
            .collect()
    }
}
