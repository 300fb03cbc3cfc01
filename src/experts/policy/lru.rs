//! Least recently used: evict the expert whose last access (or load) is oldest.

use super::{CachePolicy, EvictionKey, ExpertId, PolicyContext, Recency};

/// LRU over the logical clock; a load counts as a use.
#[derive(Default)]
pub struct Lru {
    recency: Recency,
}

impl CachePolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn on_access(&mut self, id: ExpertId, ctx: &PolicyContext) {
        self.recency.touch(id, ctx);
    }

    fn on_insert(&mut self, id: ExpertId, ctx: &PolicyContext) {
        self.recency.touch(id, ctx);
    }

    fn eviction_keys(&self, candidates: &[ExpertId], ctx: &PolicyContext) -> Vec<EvictionKey> {
        candidates.iter().map(|&c| (self.recency.last(c, ctx) as f64, 0)).collect()
    }
}
