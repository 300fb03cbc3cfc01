//! ARC, the adaptive replacement cache (Megiddo & Modha, FAST'03).
//!
//! Resident experts are in T1 (used once since they were loaded) or T2 (used again), each an
//! LRU list; evicted ones leave their id in the ghost list B1 or B2 of the list they left. A
//! target `p` for T1's size adapts: loading an expert whose id is in B1 (evicted from T1 too
//! early) raises it by `max(|B2|/|B1|, 1)`, one in B2 lowers it by `max(|B1|/|B2|, 1)`, within
//! `[0, capacity]`. To free a slot ARC evicts T1's least recently used expert while T1 holds
//! more than `p`, else T2's. Ghost lists are trimmed to `|T1| + |B1| ≤ c` and a total of `2c`.
//!
//! Two departures from the paper, both forced by the cache asking for victims before it loads:
//! the eviction does not know the expert about to be loaded (ARC's tie rule for a B2 hit at
//! `|T1| = p` is left out), and `p` adapts at the load, after the eviction. Only the offered
//! candidates may be evicted: a list without candidates yields to the other one.

use std::collections::HashSet;

use super::lists::Lists;
use super::{keys_in_order, CachePolicy, EvictionKey, ExpertId, PolicyContext};

/// ARC's lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    T1,
    T2,
    B1,
    B2,
}

impl From<List> for usize {
    fn from(l: List) -> usize {
        l as usize
    }
}

/// The ARC policy.
pub struct ArcPolicy {
    capacity: usize,
    target: f64,
    lists: Lists<List, 4>,
    /// Loaded and not used yet (the next use is the one it was loaded for, not a second one).
    fresh: HashSet<ExpertId>,
}

impl ArcPolicy {
    /// ARC for a cache of `capacity` slots (`p` starts at 0).
    pub fn new(capacity: usize) -> ArcPolicy {
        ArcPolicy { capacity, target: 0.0, lists: Lists::default(), fresh: HashSet::new() }
    }

    /// The adaptive target `p` for T1's size.
    pub fn target(&self) -> f64 {
        self.target
    }

    /// Trims the ghost lists to `|T1| + |B1| ≤ c` and `|T1| + |T2| + |B1| + |B2| ≤ 2c`.
    fn trim_ghosts(&mut self) {
        let len = |s: &Self, l| s.lists.len(l);
        while len(self, List::T1) + len(self, List::B1) > self.capacity && self.lists.pop_oldest(List::B1).is_some() {}
        let total = |s: &Self| [List::T1, List::T2, List::B1, List::B2].iter().map(|&l| len(s, l)).sum::<usize>();
        while total(self) > 2 * self.capacity
            && (self.lists.pop_oldest(List::B2).is_some() || self.lists.pop_oldest(List::B1).is_some())
        {}
    }
}

impl CachePolicy for ArcPolicy {
    fn name(&self) -> &'static str {
        "arc"
    }

    /// A use after the loading one moves the expert to T2's most recent end.
    fn on_access(&mut self, id: ExpertId, _ctx: &PolicyContext) {
        if self.fresh.remove(&id) {
            return;
        }
        if matches!(self.lists.which(id), Some(List::T1 | List::T2)) {
            self.lists.push(id, List::T2);
        }
    }

    fn on_insert(&mut self, id: ExpertId, _ctx: &PolicyContext) {
        let (b1, b2) = (self.lists.len(List::B1) as f64, self.lists.len(List::B2) as f64);
        let list = match self.lists.which(id) {
            Some(List::B1) => {
                self.target = (self.target + (b2 / b1).max(1.0)).min(self.capacity as f64);
                List::T2
            }
            Some(List::B2) => {
                self.target = (self.target - (b1 / b2).max(1.0)).max(0.0);
                List::T2
            }
            _ => List::T1,
        };
        self.lists.push(id, list);
        self.fresh.insert(id);
        self.trim_ghosts();
    }

    fn on_remove(&mut self, id: ExpertId, _ctx: &PolicyContext) {
        self.fresh.remove(&id);
        match self.lists.remove(id) {
            Some(List::T1) => self.lists.push(id, List::B1),
            Some(List::T2) => self.lists.push(id, List::B2),
            _ => {}
        }
        self.trim_ghosts();
    }

    /// ARC's eviction order of the candidates: T1's least recently used while T1 (less what is
    /// already chosen) holds more than `p`, else T2's; candidates in neither list go first.
    fn eviction_keys(&self, candidates: &[ExpertId], _ctx: &PolicyContext) -> Vec<EvictionKey> {
        let open: HashSet<ExpertId> = candidates.iter().copied().collect();
        let unknown = candidates.iter().filter(|&&c| !matches!(self.lists.which(c), Some(List::T1 | List::T2)));
        let mut order: Vec<ExpertId> = unknown.copied().collect();
        let mut t1 = self.lists.oldest_first(List::T1).filter(|id| open.contains(id)).peekable();
        let mut t2 = self.lists.oldest_first(List::T2).filter(|id| open.contains(id)).peekable();
        let mut t1_len = self.lists.len(List::T1);
        while t1.peek().is_some() || t2.peek().is_some() {
            let from_t1 = t2.peek().is_none() || (t1.peek().is_some() && t1_len as f64 > self.target);
            let next = if from_t1 { t1.next() } else { t2.next() };
            order.extend(next);
            t1_len -= usize::from(from_t1);
        }
        let index: std::collections::HashMap<ExpertId, usize> =
            candidates.iter().enumerate().map(|(i, &c)| (c, i)).collect();
        let order: Vec<usize> = order.iter().map(|id| index[id]).collect();
        keys_in_order(&order, candidates.len())
    }
}
