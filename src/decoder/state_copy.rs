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

/// Every linear-attention state of a sequence as it was when it held `pos` positions.
pub(super) struct Snapshot {
    /// Positions the copied states hold; `None`: free.
    pos: Option<usize>,
    /// Per linear layer, its conv window and recurrent state.
    copies: Vec<(wgpu::Buffer, wgpu::Buffer)>,
}

impl SequenceCache {
    /// The linear-attention layers' caches.
    fn linear_layers(&self) -> impl Iterator<Item = &LinearCache> {
        self.layers.iter().filter_map(|l| match l {
            LayerCache::Linear(c) => Some(c),
            _ => None,
        })
    }

    /// Gives every linear-attention state its copy unless it has one, reserving the bytes from
    /// the KV budget ([`crate::Error::KvCacheTooLarge`] when they do not fit).
    pub(super) fn ensure_state_copies(&self) -> Result<()> {
        let missing: Vec<&LinearCache> = self.linear_layers().filter(|l| l.saved.get().is_none()).collect();
        let bytes: u64 = missing.iter().map(|l| l.window.size() + l.state.size()).sum();
        if bytes == 0 {
            return Ok(());
        }
        self.ledger.reserve(bytes)?;
        let gpu = &self.gpu;
        let ((), allocated) = counting_allocations(|| {
            for l in missing {
                let copy =
                    (gpu.storage("saved conv window", l.window.size()), gpu.storage("saved state", l.state.size()));
                l.saved.get_or_init(|| copy);
            }
        });
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        self.allocated.fetch_add(allocated, Ordering::AcqRel);
        Ok(())
    }

    /// Allocates one more snapshot's buffers from the KV budget, or `None` when it is spent.
    fn new_snapshot(&self) -> Option<Snapshot> {
        let bytes: u64 = self.linear_layers().map(|l| l.window.size() + l.state.size()).sum();
        if let Err(e) = self.ledger.reserve(bytes) {
            log::debug!("no state snapshot: {e}");
            return None;
        }
        let gpu = &self.gpu;
        let (copies, allocated) = counting_allocations(|| {
            self.linear_layers()
                .map(|l| {
                    (
                        gpu.storage("snapshot conv window", l.window.size()),
                        gpu.storage("snapshot state", l.state.size()),
                    )
                })
                .collect()
        });
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        self.allocated.fetch_add(allocated, Ordering::AcqRel);
        Some(Snapshot { pos: None, copies })
    }

    /// Takes a snapshot of the linear-attention states, which must hold `pos` positions (else,
    /// or without linear layers or snapshots allowed, nothing happens).
    pub fn snapshot_states(&self, pos: usize) {
        if self.snapshot_limit == 0 || pos == 0 || self.linear_layers().next().is_none() {
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
            None if snapshots.len() < self.snapshot_limit => match self.new_snapshot() {
                Some(s) => {
                    snapshots.push(s);
                    snapshots.len() - 1
                }
                None => return,
            },
            None => (0..snapshots.len()).min_by_key(|&i| snapshots[i].pos).expect("at least one snapshot"),
        };
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        for (l, (window, state)) in self.linear_layers().zip(&snapshots[slot].copies) {
            encoder.copy_buffer_to_buffer(&l.window, 0, window, 0, l.window.size());
            encoder.copy_buffer_to_buffer(&l.state, 0, state, 0, l.state.size());
        }
        self.gpu.queue.submit([encoder.finish()]);
        snapshots[slot].pos = Some(pos);
    }

    /// Frees the snapshots past `pos` (a step at `pos` writes over what they continued), or
    /// every one.
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
        for (l, (window, state)) in self.linear_layers().zip(&best.copies) {
            encoder.copy_buffer_to_buffer(window, 0, &l.window, 0, l.window.size());
            encoder.copy_buffer_to_buffer(state, 0, &l.state, 0, l.state.size());
        }
        self.gpu.queue.submit([encoder.finish()]);
        let pos = best.pos.expect("a taken snapshot");
        self.state_len.store(pos, Ordering::Release);
        Some(pos)
    }

    /// Records copies of every linear-attention state into its copy (made beforehand by
    /// [`SequenceCache::ensure_state_copies`]).
    pub(super) fn save_linear_state(&self, encoder: &mut wgpu::CommandEncoder) {
        self.copy_linear_state(encoder, true);
    }

    /// Records copies of every saved linear-attention state back (after a discarded step).
    pub(super) fn restore_linear_state(&self, encoder: &mut wgpu::CommandEncoder) {
        self.copy_linear_state(encoder, false);
    }

    fn copy_linear_state(&self, encoder: &mut wgpu::CommandEncoder, save: bool) {
        for l in self.linear_layers() {
            let (saved_window, saved_state) = l.saved.get().expect("state copies are made before a step saves them");
            for (live, copy) in [(&l.window, saved_window), (&l.state, saved_state)] {
                let (from, to) = if save { (live, copy) } else { (copy, live) };
                encoder.copy_buffer_to_buffer(from, 0, to, 0, live.size());
            }
        }
    }
}
