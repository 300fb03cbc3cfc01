//! How big one sequence's caches are: the one KV-size computation that the caches' allocation,
//! the KV budget, the expert budget, `info` and `bench context` share.
//!
//! Layers with full attention keep every position. A sliding-window layer keeps a ring of its
//! `window` positions plus what one step writes past them (`window + max_step - 1`: the first
//! query of a step still sees its `window - 1` predecessors after the step's keys are stored),
//! unless the shape keeps every position there too ([`CacheShape::rings`] false, llama.cpp's
//! `--swa-full`). Linear-attention layers keep a fixed-size state instead.

use super::{ArchSpec, AttentionKind};
use crate::quant::KvDtype;

/// How one sequence's caches are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    /// Positions per sequence.
    pub context: usize,
    /// Most tokens one step writes (`max_batch`).
    pub max_step: usize,
    /// Sliding-window layers keep a ring of their window and a step; `false`: every position.
    pub rings: bool,
    /// Each linear-attention state is kept twice (the copy an optimistic step restores: models
    /// that stream experts); else once, its copy made only for drafts.
    pub state_copy: bool,
}

impl CacheShape {
    /// Positions a layer with sliding `window` (`None`: full attention) keeps.
    pub fn positions(&self, window: Option<usize>) -> usize {
        match window {
            Some(w) if self.rings => (w + self.max_step.max(1) - 1).min(self.context),
            _ => self.context,
        }
    }
}

impl ArchSpec {
    /// Bytes one position takes in one cached layer in `dtype`: a row per key and value head
    /// for grouped attention; for MLA what [`super::MlaSpec::cached_row_bytes`] says.
    pub fn kv_row_bytes(&self, dtype: KvDtype) -> u64 {
        (match &self.attention {
            AttentionKind::Mla(m) => m.cached_row_bytes(self.heads, dtype),
            AttentionKind::Grouped => 2 * self.kv_heads * dtype.row_bytes(self.head_dim),
        }) as u64
    }

    /// The layers with a KV cache (every layer but linear-attention ones), with their windows.
    fn cached_layer_windows(&self) -> impl Iterator<Item = Option<usize>> + '_ {
        (0..self.layers).filter(|&i| !self.is_linear_layer(i)).map(|i| self.window(i))
    }

    /// Bytes one sequence's cache grows by per position in `dtype`: the cached layers without a
    /// window, and with `rings` false the windowed ones too.
    pub fn kv_bytes_per_token(&self, dtype: KvDtype, rings: bool) -> u64 {
        let growing = self.cached_layer_windows().filter(|w| w.is_none() || !rings).count();
        self.kv_row_bytes(dtype) * growing as u64
    }

    /// GPU bytes of one sequence's caches of `shape` in `dtype`: its KV rows (rings included)
    /// and its linear-attention states (and their copies with `shape.state_copy`).
    pub fn kv_cache_bytes(&self, shape: CacheShape, dtype: KvDtype) -> u64 {
        let rows: usize = self.cached_layer_windows().map(|w| shape.positions(w)).sum();
        let states = self.linear_state_bytes() * if shape.state_copy { 2 } else { 1 };
        rows as u64 * self.kv_row_bytes(dtype) + states
    }

    /// GPU bytes of one sequence's caches that do not grow with its context: the rings at their
    /// longest (within the model's positions) and the linear-attention states.
    pub fn kv_fixed_bytes(&self, shape: CacheShape, dtype: KvDtype) -> u64 {
        let longest = CacheShape { context: self.max_positions, ..shape };
        self.kv_cache_bytes(longest, dtype) - self.kv_bytes_per_token(dtype, shape.rings) * self.max_positions as u64
    }

    /// Bytes of keys and values one query at position `depth - 1` attends in `dtype`: every
    /// cached layer's first `depth` positions, a windowed layer's last `window` (what a decode
    /// step at that depth reads, rings or not).
    pub fn kv_bytes_attended(&self, depth: usize, dtype: KvDtype) -> u64 {
        let rows: usize = self.cached_layer_windows().map(|w| w.map_or(depth, |w| w.min(depth))).sum();
        rows as u64 * self.kv_row_bytes(dtype)
    }

    /// Bytes of one sequence's fixed-size state: the conv windows and recurrent states of the
    /// linear-attention layers (f32), 0 for other models.
    pub fn linear_state_bytes(&self) -> u64 {
        self.hybrid
            .as_ref()
            .map_or(0, |h| (h.state_floats() * 4 * h.linear_layers.iter().filter(|l| **l).count()) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_keep_the_window_and_a_step() {
        let ring = CacheShape { context: 32768, max_step: 64, rings: true, state_copy: false };
        assert_eq!(ring.positions(Some(128)), 191);
        assert_eq!(ring.positions(None), 32768);
        assert_eq!(CacheShape { context: 100, ..ring }.positions(Some(128)), 100);
        assert_eq!(CacheShape { rings: false, ..ring }.positions(Some(128)), 32768);
    }
}
