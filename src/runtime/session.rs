//! A sequence kept between calls: its tokens and its KV cache on the GPU, so that appending a
//! turn processes only the new tokens ([`super::Engine::generate_in`]).

use crate::decoder::SequenceCache;
use crate::experts::route_memory::RouteMemory;

/// One conversation's state: the token history and the caches holding it. Made by
/// [`super::Engine::new_session`]; usable only with the engine that made it. Each session
/// owns its own caches (reserved from the engine's KV budget, given back when dropped).
pub struct Session {
    pub(super) cache: SequenceCache,
    pub(super) tokens: Vec<u32>,
    /// Leading tokens whose keys and values the cache holds.
    pub(super) cached: usize,
    /// What its positions were routed to, while a request drafting by prompt lookup streams
    /// experts (`super::engine::draft_prefetch`).
    pub(super) routes: Option<Box<RouteMemory>>,
}

impl Session {
    pub(super) fn new(cache: SequenceCache) -> Session {
        Session { cache, tokens: Vec::new(), cached: 0, routes: None }
    }

    /// Every token of the sequence so far: prompts and generated tokens (end-of-sequence
    /// tokens that stopped a generation are not part of it).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Length of the sequence.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keeps the first `len` tokens (rollback, e.g. to regenerate an answer); the cache of the
    /// kept prefix stays valid. Longer `len` changes nothing.
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.cached = self.cached.min(len);
        self.forget_routes_from(len);
    }

    /// Forgets the routing remembered from position `pos` on (rows of rejected drafts).
    pub(super) fn forget_routes_from(&mut self, pos: usize) {
        if let Some(r) = &mut self.routes {
            r.truncate(pos);
        }
    }

    /// Takes `tokens` as the sequence so far, held by the cache, without computing them: the
    /// cache keeps what it holds (zeros in a new session). Only for benchmarks of a decode
    /// step's cost at a depth, which does not depend on the cached values.
    pub(crate) fn assume_cached(&mut self, tokens: &[u32]) {
        self.tokens = tokens.to_vec();
        self.cached = tokens.len();
        self.routes = None;
        self.cache.end_step(tokens.len());
    }

    /// GPU bytes of the session's caches.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.bytes()
    }
}
