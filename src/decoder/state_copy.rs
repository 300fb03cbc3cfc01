//! Copies of a sequence's linear-attention states.
//!
//! - The saved copy: what an optimistic step or a step of draft tokens saves before it runs and
//!   puts back when it is discarded or cut back. A cache makes it with itself when the model
//!   streams experts (optimistic steps then run on the default path), else at the first step of
//!   drafts, reserving its bytes from the KV budget then; a sequence that never needs it holds
//!   each state once, as llama.cpp does.
//! - Snapshots: the states as they were at a position (the engine takes one where a prompt's
//!   last chunk starts), so a sequence rolled back past where its states are (a regenerated
//!   answer, an edited turn) resumes from the nearest snapshot at or before the point it wants
//!   instead of position 0. At most `state_snapshots` per sequence, each made when first needed
//!   from the KV budget (none when it is spent) and reused: a new snapshot takes a free one (a
//!   step before a snapshot's position frees it), else the earliest position's.

use std::sync::atomic::Ordering;

use super::cache::{LayerCache, LinearCache, SequenceCache};
use crate::error::Result;
use crate::gpu::context::counting_allocations;

/// A copy of every linear-attention state of a sequence: per linear layer, its conv window and
/// recurrent state.
pub(super) type StateCopy = Vec<(wgpu::Buffer, wgpu::Buffer)>;

/// The states as they were when they held `pos` positions.
pub(super) struct Snapshot {
    /// Positions the copied states hold; `None`: free.
    pos: Option<usize>,
    copy: StateCopy,
}

impl SequenceCache {
    /// The linear-attention layers' caches.
    fn linear_layers(&self) -> impl Iterator<Item = &LinearCache> {
        self.layers.iter().filter_map(|l| match l {
            LayerCache::Linear(c) => Some(c),
            _ => None,
        })
    }

    /// New buffers for a copy of every state, their bytes reserved from the KV budget
    /// ([`crate::Error::KvCacheTooLarge`] when they do not fit) and held by the cache.
    fn allocate_state_copy(&self, what: &str) -> Result<StateCopy> {
        let bytes: u64 = self.linear_layers().map(|l| l.window.size() + l.state.size()).sum();
        self.ledger.reserve(bytes)?;
        let gpu = &self.gpu;
        let (copy, allocated) = counting_allocations(|| {
            self.linear_layers()
                .map(|l| (gpu.storage(what, l.window.size()), gpu.storage(what, l.state.size())))
                .collect()
        });
        debug_assert_eq!(allocated, bytes, "state buffers are whole multiples of 16 bytes");
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        Ok(copy)
    }

    /// Records copies of every state into `copy` (`into_copy`) or back from it.
    fn record_state_copy(&self, encoder: &mut wgpu::CommandEncoder, copy: &StateCopy, into_copy: bool) {
        for (l, (window, state)) in self.linear_layers().zip(copy) {
            for (live, copied) in [(&l.window, window), (&l.state, state)] {
                let (from, to) = if into_copy { (live, copied) } else { (copied, live) };
                encoder.copy_buffer_to_buffer(from, 0, to, 0, live.size());
            }
        }
    }

    /// Gives the states their saved copy unless they have one, reserving its bytes from the KV
    /// budget.
    pub(super) fn ensure_state_copies(&self) -> Result<()> {
        if self.saved.get().is_none() && self.has_linear_state() {
            let copy = self.allocate_state_copy("saved linear-attention state")?;
            let _ = self.saved.set(copy);
        }
        Ok(())
    }

    /// Records copies of every linear-attention state into the saved copy (made beforehand by
    /// [`SequenceCache::ensure_state_copies`]; nothing without linear layers).
    pub(super) fn save_linear_state(&self, encoder: &mut wgpu::CommandEncoder) {
        if let Some(copy) = self.saved.get() {
            self.record_state_copy(encoder, copy, true);
        }
    }

    /// Records copies of every saved linear-attention state back (after a discarded step).
    pub(super) fn restore_linear_state(&self, encoder: &mut wgpu::CommandEncoder) {
        if let Some(copy) = self.saved.get() {
            self.record_state_copy(encoder, copy, false);
        }
    }

    /// Takes a snapshot of the linear-attention states, which must hold `pos` positions (else,
    /// or without linear layers or snapshots allowed, nothing happens).
    pub fn snapshot_states(&self, pos: usize) {
        if self.snapshot_limit == 0 || pos == 0 || !self.has_linear_state() {
            return;
        }
        if self.state_len.load(Ordering::Acquire) != pos {
            return;
        }
        let mut snapshots = self.snapshots.lock().expect("snapshots lock");
        if snapshots.iter().any(|s| s.pos == Some(pos)) {
            return;
        }
        let slot = match snapshots.iter().position(|s| s.pos.is_none()) {
            Some(free) => free,
            None if snapshots.len() < self.snapshot_limit => match self.allocate_state_copy("state snapshot") {
                Ok(copy) => {
                    snapshots.push(Snapshot { pos: None, copy });
                    snapshots.len() - 1
                }
                Err(e) => {
                    log::debug!("no state snapshot: {e}");
                    return;
                }
            },
            None => (0..snapshots.len()).min_by_key(|&i| snapshots[i].pos).expect("at least one snapshot"),
        };
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        self.record_state_copy(&mut encoder, &snapshots[slot].copy, true);
        self.gpu.queue.submit([encoder.finish()]);
        snapshots[slot].pos = Some(pos);
    }

    /// Frees the snapshots past `pos` (a step at `pos` writes over what they continued).
    pub(super) fn free_snapshots_past(&self, pos: usize) {
        for s in self.snapshots.lock().expect("snapshots lock").iter_mut() {
            if s.pos.is_some_and(|p| p > pos) {
                s.pos = None;
            }
        }
    }

    /// Puts back the latest snapshot at or before `limit` whose position `usable` accepts, and
    /// returns its position (the states then hold it).
    pub(super) fn restore_snapshot(&self, limit: usize, usable: impl Fn(usize) -> bool) -> Option<usize> {
        let snapshots = self.snapshots.lock().expect("snapshots lock");
        let best = snapshots.iter().filter(|s| s.pos.is_some_and(|p| p <= limit && usable(p))).max_by_key(|s| s.pos)?;
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        self.record_state_copy(&mut encoder, &best.copy, false);
        self.gpu.queue.submit([encoder.finish()]);
        let pos = best.pos.expect("a taken snapshot");
        self.state_len.store(pos, Ordering::Release);
        Some(pos)
    }
}
