//! Least frequently used, with global counts (BrainStorm-style statistical counting).
//!
//! Counts are kept for the whole run and survive eviction: an expert's frequency is how often it
//! was used since the cache was built, not since it was last loaded. Ties go to the least
//! recently used.

use super::{entry, CachePolicy, EvictionKey, ExpertId, PolicyContext, Recency};

/// LFU over global use counts, ties → LRU.
#[derive(Default)]
pub struct Lfu {
    count: Vec<u64>,
    recency: Recency,
}

impl CachePolicy for Lfu {
    fn name(&self) -> &'static str {
        "lfu"
    }

    fn on_access(&mut self, id: ExpertId, ctx: &PolicyContext) {
        *entry(&mut self.count, ctx.index(id)) += 1;
        self.recency.touch(id, ctx);
    }

    fn on_insert(&mut self, id: ExpertId, ctx: &PolicyContext) {
        self.recency.touch(id, ctx);
    }

    /// (use count, last use): the least used goes first, ties to the least recently used.
    fn eviction_keys(&self, candidates: &[ExpertId], ctx: &PolicyContext) -> Vec<EvictionKey> {
        candidates
            .iter()
            .map(|&c| (self.count.get(ctx.index(c)).copied().unwrap_or(0) as f64, self.recency.last(c, ctx)))
            .collect()
    }
}
