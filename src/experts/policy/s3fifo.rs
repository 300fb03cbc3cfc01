//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23).
//!
//! Three FIFO queues: a small one (S, about 10% of the slots) that a loaded expert enters, a
//! main one (M, the rest) and a ghost one (G, ids only, as many as M's share). Each resident
//! expert has a 2-bit use count: the uses after the one that loaded it, capped at 3. To free a
//! slot, S3-FIFO takes from S while S holds at least its share, else from M:
//! * from S: the oldest expert moves to M (count cleared) if it was used again since it was
//!   loaded, else it is evicted and its id enters G;
//! * from M: the oldest expert goes back to M's new end with its count lowered by one if it is
//!   not zero, else it is evicted.
//!
//! An expert loaded while its id is in G enters M directly. So a scan (experts used once) only
//! churns S and never flushes M.
//!
//! Only the experts the cache offers as candidates may be evicted: the others keep their place
//! in their queue and are passed over (a queue without candidates yields to the other one).

use std::collections::HashMap;

use super::lists::Lists;
use super::{keys_in_order, CachePolicy, EvictionKey, ExpertId, PolicyContext};

/// The queues of S3-FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
    Ghost,
}

impl From<Queue> for usize {
    fn from(q: Queue) -> usize {
        q as usize
    }
}

/// Highest use count kept (two bits).
const MAX_USES: u8 = 3;

/// The share of the slots the small queue aims at.
pub const SMALL_SHARE: f64 = 0.1;

/// A resident expert's uses since it was loaded.
#[derive(Clone, Copy)]
struct Uses {
    /// Uses after the loading one, capped at [`MAX_USES`].
    count: u8,
    /// Loaded and not used yet (the next use is the one it was loaded for).
    fresh: bool,
}

/// The S3-FIFO policy.
#[derive(Clone)]
pub struct S3Fifo {
    small_share: usize,
    ghost_capacity: usize,
    queues: Lists<Queue, 3>,
    uses: HashMap<ExpertId, Uses>,
}

impl S3Fifo {
    /// S3-FIFO for a cache of `capacity` slots: S aims at 10% of them (at least one), G holds
    /// as many ids as the rest.
    pub fn new(capacity: usize) -> S3Fifo {
        let small_share = ((capacity as f64 * SMALL_SHARE).round() as usize).max(1);
        S3Fifo {
            small_share,
            ghost_capacity: capacity.saturating_sub(small_share).max(1),
            queues: Lists::default(),
            uses: HashMap::new(),
        }
    }

    /// Runs S3-FIFO's eviction `n` times over `candidates` (moving experts between queues as it
    /// goes); returns the victims as indices into `candidates`. The victims stay in their queue
    /// until [`CachePolicy::on_remove`].
    fn select(&mut self, candidates: &[ExpertId], n: usize) -> Vec<usize> {
        let mut open: HashMap<ExpertId, usize> = candidates.iter().enumerate().map(|(i, &c)| (c, i)).collect();
        let mut chosen_small = 0;
        let mut out = Vec::with_capacity(n);
        while out.len() < n.min(candidates.len()) {
            let small = self.queues.len(Queue::Small) - chosen_small;
            let (first, then) =
                if small >= self.small_share { (Queue::Small, Queue::Main) } else { (Queue::Main, Queue::Small) };
            let pick = self.evict_from(first, &open).or_else(|| self.evict_from(then, &open));
            // A candidate in neither queue (the policy was not told of its load) goes first.
            let id = match pick {
                Some(id) => id,
                None => *open.iter().min_by_key(|(_, &i)| i).expect("fewer victims than candidates").0,
            };
            if self.queues.which(id) == Some(Queue::Small) {
                chosen_small += 1;
            }
            out.push(open.remove(&id).expect("victims are open candidates"));
        }
        out
    }

    /// The oldest open expert of `queue` (S or M) with no uses left. Those with uses move to
    /// M's new end on the way: from S with their count cleared, from M with one use fewer.
    fn evict_from(&mut self, queue: Queue, open: &HashMap<ExpertId, usize>) -> Option<ExpertId> {
        loop {
            let id = self.queues.oldest_first(queue).find(|id| open.contains_key(id))?;
            let uses = self.uses.entry(id).or_insert(Uses { count: 0, fresh: false });
            if uses.count == 0 {
                return Some(id);
            }
            uses.count = if queue == Queue::Small { 0 } else { uses.count - 1 };
            self.queues.push(id, Queue::Main);
        }
    }
}

impl CachePolicy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    fn on_access(&mut self, id: ExpertId, _ctx: &PolicyContext) {
        if let Some(u) = self.uses.get_mut(&id) {
            if std::mem::take(&mut u.fresh) {
                return;
            }
            u.count = (u.count + 1).min(MAX_USES);
        }
    }

    fn on_insert(&mut self, id: ExpertId, _ctx: &PolicyContext) {
        let queue = match self.queues.which(id) {
            Some(Queue::Ghost) => Queue::Main,
            _ => Queue::Small,
        };
        self.queues.push(id, queue);
        self.uses.insert(id, Uses { count: 0, fresh: true });
    }

    fn on_remove(&mut self, id: ExpertId, _ctx: &PolicyContext) {
        self.uses.remove(&id);
        if self.queues.remove(id) == Some(Queue::Small) {
            self.queues.push(id, Queue::Ghost);
            while self.queues.len(Queue::Ghost) > self.ghost_capacity {
                self.queues.pop_oldest(Queue::Ghost);
            }
        }
    }

    /// The order in which S3-FIFO would evict every candidate (a dry run: no expert moves).
    fn eviction_keys(&self, candidates: &[ExpertId], _ctx: &PolicyContext) -> Vec<EvictionKey> {
        keys_in_order(&self.clone().select(candidates, candidates.len()), candidates.len())
    }

    fn victim(&mut self, candidates: &[ExpertId], _ctx: &PolicyContext) -> usize {
        self.select(candidates, 1)[0]
    }

    fn victims(&mut self, candidates: &[ExpertId], n: usize, _ctx: &PolicyContext) -> Vec<usize> {
        self.select(candidates, n)
    }
}
