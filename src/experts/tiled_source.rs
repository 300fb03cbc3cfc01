//! Expert slots in the CPU layout's tiles: an [`ExpertSource`] reading another's experts and
//! reordering their int4 or f16 projections into tiles ([`crate::ops::weight_tiles`]) as they are
//! read, in the I/O threads, so streamed and resident slots hold what the CPU layout's expert
//! kernels read best.

use std::sync::Arc;

use super::source::ExpertSource;
use super::SlotLayout;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::ops::weight_tiles;

/// `inner`'s experts, their projections tiled where their layout can be.
pub struct TiledExperts {
    inner: Arc<dyn ExpertSource>,
}

impl TiledExperts {
    /// `source` with its slots tiled (each layer's where its layout can be,
    /// [`SlotLayout::tiled`]) where `gpu` tiles weights ([`weight_tiles::on`]); else `source`
    /// itself.
    pub fn over(gpu: &Gpu, source: Arc<dyn ExpertSource>) -> Arc<dyn ExpertSource> {
        match weight_tiles::on(gpu) {
            true => Arc::new(TiledExperts { inner: source }),
            false => source,
        }
    }
}

thread_local! {
    /// A copy of the row block being tiled (one per I/O thread, so reads do not allocate).
    static TILING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl ExpertSource for TiledExperts {
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        self.inner.read(layer, expert, buf)?;
        TILING.with_borrow_mut(|scratch| self.layer_layout(layer).tile(buf, scratch))
    }

    fn read_len(&self) -> usize {
        self.inner.read_len()
    }

    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes()
    }

    fn layout(&self) -> SlotLayout {
        self.inner.layout().tiled()
    }

    fn layer_layout(&self, layer: usize) -> SlotLayout {
        self.inner.layer_layout(layer).tiled()
    }
}
