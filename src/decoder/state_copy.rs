//! Copies of a sequence's linear-attention states: what an optimistic step or a step of draft
//! tokens saves before it runs and puts back when it is discarded or cut back. A cache makes
//! them with itself when the model streams experts (optimistic steps then run on the default
//! path), else at the first step of drafts, reserving their bytes from the KV budget then; a
//! sequence that never needs them holds each state once, as llama.cpp does.

use std::sync::atomic::Ordering;

use super::cache::{LayerCache, LinearCache, SequenceCache};
use crate::error::Result;
use crate::gpu::context::counting_allocations;

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
