//! Sliding-window rings: what a layer keeping `window + max_batch - 1` positions still holds
//! after its steps, so that a step or a rollback that needs keys it has written over is caught.

use crate::model::{ArchSpec, CacheShape};

/// A sliding-window layer's ring: its window and the positions it keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Ring {
    pub(super) window: usize,
    pub(super) positions: usize,
}

impl Ring {
    /// Whether a step at `pos` finds the keys it needs (`pos + 1 - window .. pos`) in a ring
    /// that has written as far as `written_end`: the ring holds `written_end - positions ..`.
    pub(super) fn holds_window_before(&self, pos: usize, written_end: usize) -> bool {
        (pos + 1).saturating_sub(self.window) + self.positions >= written_end
    }

    /// The rings of a sequence's caches of `shape`: one per distinct window whose ring is
    /// shorter than the context (others never write over a position).
    pub(super) fn all(spec: &ArchSpec, shape: CacheShape) -> Vec<Ring> {
        let mut rings: Vec<Ring> = (0..spec.layers)
            .filter_map(|i| spec.window(i).map(|window| Ring { window, positions: shape.positions(Some(window)) }))
            .filter(|r| r.positions < shape.context)
            .collect();
        rings.dedup();
        rings
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;

    #[test]
    fn a_ring_holds_the_window_until_a_step_past_it_writes_over_it() {
        // 16 keys, 23 positions: after writing up to 64 it holds 41..64.
        let r = Ring { window: 16, positions: 23 };
        assert!(r.holds_window_before(56, 64), "needs 41..56");
        assert!(!r.holds_window_before(55, 64), "needs 40..55");
        assert!(r.holds_window_before(10, 23), "nothing written over yet");
        assert!(!r.holds_window_before(10, 24));
    }
}
