//! The slot table: a GPU array mapping (layer, expert) to the arena slot holding it.

use crate::gpu::Gpu;

/// Marks an expert that is in no slot.
pub const NO_SLOT: u32 = u32::MAX;

/// Host mirror and GPU copy of the (layer, expert) → slot map.
pub struct SlotTable {
    /// The GPU buffer the expert kernels read, `[layers * experts]` u32.
    pub buffer: wgpu::Buffer,
    host: Vec<u32>,
    experts: usize,
}

impl SlotTable {
    /// A table for `layers` × `experts` with every entry empty.
    pub fn new(gpu: &Gpu, layers: usize, experts: usize) -> SlotTable {
        let host = vec![NO_SLOT; layers * experts];
        SlotTable { buffer: gpu.upload("slot table", bytemuck::cast_slice(&host)), host, experts }
    }

    /// Index of (layer, expert 0) in the table, as the kernels take it.
    pub fn base(&self, layer: usize) -> usize {
        layer * self.experts
    }

    /// Experts per layer.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Slot of (layer, expert), if resident.
    pub fn get(&self, layer: usize, expert: usize) -> Option<u32> {
        Some(self.host[self.base(layer) + expert]).filter(|&s| s != NO_SLOT)
    }

    /// Maps (layer, expert) to `slot` (or clears it with [`NO_SLOT`]) and queues the GPU update.
    pub fn set(&mut self, gpu: &Gpu, layer: usize, expert: usize, slot: u32) {
        let i = self.base(layer) + expert;
        self.host[i] = slot;
        gpu.queue.write_buffer(&self.buffer, (i * 4) as u64, bytemuck::bytes_of(&slot));
    }
}
