//! Cache replacement policies for the expert slot cache, and the ids they speak about.
//!
//! A policy only *chooses*: the [`CacheModel`](crate::experts::cache_model::CacheModel) owns
//! the slots and tells the policy about accesses, inserts and removals, then asks it for
//! victims among the resident experts it may evict (not always all of them: experts the current
//! layer uses are never offered).

pub mod arc;
pub mod belady;
pub mod eamc;
pub mod lfu;
mod lists;
pub mod lru;
pub mod s3fifo;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::experts::eam::EamTracker;

pub use arc::ArcPolicy;
pub use belady::Belady;
pub use eamc::EamcPolicy;
pub use lfu::Lfu;
pub use lru::Lru;
pub use s3fifo::S3Fifo;

/// One routed expert: its model layer and its index within that layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExpertId {
    /// Model layer (dense layers simply never appear).
    pub layer: u32,
    /// Expert index within the layer.
    pub expert: u32,
}

impl ExpertId {
    /// The id of `expert` in `layer`.
    pub fn new(layer: usize, expert: usize) -> ExpertId {
        ExpertId { layer: layer as u32, expert: expert as u32 }
    }
}

/// The phase a forward step belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The prompt: many tokens per step.
    Prefill,
    /// Generation: one token per step.
    Decode,
}

/// What a policy may look at when it is told about an event or asked for a victim.
pub struct PolicyContext<'a> {
    /// The layer being routed (or prefetched from).
    pub layer: usize,
    /// Logical clock: grows by one at every access and every insert.
    pub clock: u64,
    /// Phase of the current step.
    pub phase: Phase,
    /// Expert activation tracking (current request, EAM collection, predictions).
    pub eam: &'a EamTracker,
}

impl PolicyContext<'_> {
    /// Number of model layers.
    pub fn layers(&self) -> usize {
        self.eam.layers()
    }

    /// Dense index of `id` in a `layers × experts` table.
    pub fn index(&self, id: ExpertId) -> usize {
        id.layer as usize * self.eam.experts() + id.expert as usize
    }
}

/// A candidate's place in the eviction order: (primary key, tie-break), smallest first.
pub type EvictionKey = (f64, u64);

/// When each expert was last used (loaded or hit), by dense index: the LRU order, and the
/// tie-break of the other policies.
#[derive(Default)]
pub struct Recency {
    last: Vec<u64>,
}

impl Recency {
    /// Records a use of `id` now.
    pub fn touch(&mut self, id: ExpertId, ctx: &PolicyContext) {
        *entry(&mut self.last, ctx.index(id)) = ctx.clock;
    }

    /// The clock of `id`'s last use (0 if never used).
    pub fn last(&self, id: ExpertId, ctx: &PolicyContext) -> u64 {
        self.last.get(ctx.index(id)).copied().unwrap_or(0)
    }
}

/// A replacement policy: told about every event, asked for victims.
pub trait CachePolicy: Send {
    /// Short name, as used on the command line (`lru`, `lfu`, `eamc`, `s3fifo`, `arc`, `belady`).
    fn name(&self) -> &'static str;
    /// `id` is used by the current step (hit or just loaded).
    fn on_access(&mut self, id: ExpertId, ctx: &PolicyContext);
    /// `id` was loaded into a slot (on demand or by prefetch).
    fn on_insert(&mut self, id: ExpertId, ctx: &PolicyContext);
    /// `id` left its slot (evicted, or its read failed).
    fn on_remove(&mut self, _id: ExpertId, _ctx: &PolicyContext) {}
    /// The eviction order of `candidates`: the smallest key goes first (the second element
    /// breaks ties; equal keys go to the lower index).
    fn eviction_keys(&self, candidates: &[ExpertId], ctx: &PolicyContext) -> Vec<EvictionKey>;
    /// Index into `candidates` (never empty) of the expert to evict.
    fn victim(&mut self, candidates: &[ExpertId], ctx: &PolicyContext) -> usize {
        lowest(&self.eviction_keys(candidates, ctx), 1)[0]
    }
    /// The `n` experts to evict (`n ≤ candidates.len()`), in eviction order, as indices into
    /// `candidates`. The cache asks once per wave.
    fn victims(&mut self, candidates: &[ExpertId], n: usize, ctx: &PolicyContext) -> Vec<usize> {
        lowest(&self.eviction_keys(candidates, ctx), n)
    }
    /// A new request starts.
    fn begin_request(&mut self) {}
}

/// The policies selectable by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// Least frequently used (global counts, ties → LRU).
    Lfu,
    /// MoE-Infinity's activation-aware priority.
    Eamc,
    /// S3-FIFO (small, main and ghost FIFO queues).
    S3fifo,
    /// ARC (adaptive replacement: recency and frequency lists with ghosts).
    Arc,
    /// Belady's MIN: needs the future, so only the simulator can build it.
    Belady,
}

impl PolicyKind {
    /// Every kind, in plotting order (Belady last so it is drawn on top).
    pub const ALL: [PolicyKind; 6] =
        [PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::Eamc, PolicyKind::S3fifo, PolicyKind::Arc, PolicyKind::Belady];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Lfu => "lfu",
            PolicyKind::Eamc => "eamc",
            PolicyKind::S3fifo => "s3fifo",
            PolicyKind::Arc => "arc",
            PolicyKind::Belady => "belady",
        }
    }

    /// Builds an online policy for a cache of `capacity` slots; Belady needs a trace and is
    /// refused here.
    pub fn build(self, capacity: usize) -> crate::Result<Box<dyn CachePolicy>> {
        match self {
            PolicyKind::Lru => Ok(Box::new(Lru::default())),
            PolicyKind::Lfu => Ok(Box::new(Lfu::default())),
            PolicyKind::Eamc => Ok(Box::new(EamcPolicy::default())),
            PolicyKind::S3fifo => Ok(Box::new(S3Fifo::new(capacity))),
            PolicyKind::Arc => Ok(Box::new(ArcPolicy::new(capacity))),
            PolicyKind::Belady => Err(crate::Error::InvalidArgument(
                "the belady policy needs the future accesses; use it with `simulate`".into(),
            )),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|k| k.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| {
            crate::Error::InvalidArgument(format!(
                "unknown cache policy {s:?}; expected lru, lfu, eamc, s3fifo, arc or belady"
            ))
        })
    }
}

/// The entry `i` of a dense per-expert table, growing the table with zeros as needed.
pub(crate) fn entry(table: &mut Vec<u64>, i: usize) -> &mut u64 {
    if table.len() <= i {
        table.resize(i + 1, 0);
    }
    &mut table[i]
}

/// Eviction keys that put `candidates` in the order of `order` (indices into them, first
/// evicted first); candidates missing from `order` go last.
pub(crate) fn keys_in_order(order: &[usize], candidates: usize) -> Vec<EvictionKey> {
    let mut keys = vec![(order.len() as f64, 0); candidates];
    for (rank, &i) in order.iter().enumerate() {
        keys[i] = (rank as f64, 0);
    }
    keys
}

/// Indices of the `n` smallest keys, smallest first (ties → lower index).
pub(crate) fn lowest<K: PartialOrd>(keys: &[K], n: usize) -> Vec<usize> {
    let cmp =
        |a: &usize, b: &usize| keys[*a].partial_cmp(&keys[*b]).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..keys.len()).collect();
    let n = n.min(idx.len());
    if n == 0 {
        return Vec::new();
    }
    if n < idx.len() {
        idx.select_nth_unstable_by(n - 1, cmp);
        idx.truncate(n);
    }
    idx.sort_unstable_by(cmp);
    idx
}
