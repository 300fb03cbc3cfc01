//! The expert slot arena: N fixed slots of one expert's size, allocated once, split into
//! buffers that each fit one storage binding. A slot holds one expert as the expert store lays
//! out an extent (gate `[I, H]`, up `[I, H]`, down `[H, I]` blobs back to back), so a read from
//! `experts.bin` is copied into a slot byte for byte — except a GGUF store's Q4_0 and Q6_K
//! blobs, which [`SlotLayout::restage`] rewrites into int4 and padded Q6_K blocks.

use super::SlotTable;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::ops::experts::SlotBinding;
pub use crate::ops::slot_layout::SlotLayout;

/// Fixed GPU slots for routed experts.
pub struct SlotArena {
    /// Layout of every slot.
    pub layout: SlotLayout,
    /// Total slots.
    pub slots: usize,
    /// Slots per buffer.
    pub slots_per_chunk: usize,
    /// The buffers; slot `s` lives in `chunks[s / slots_per_chunk]`.
    pub chunks: Vec<wgpu::Buffer>,
}

impl SlotArena {
    /// The slots as the expert kernels bind them, with `table` ([`SlotBinding`]).
    pub fn binding<'a>(&'a self, table: &'a SlotTable) -> SlotBinding<'a> {
        SlotBinding {
            chunks: &self.chunks,
            slots_per_chunk: self.slots_per_chunk,
            slots: self.slots,
            slot_bytes: self.layout.slot_bytes,
            table: &table.buffer,
            experts: table.experts(),
        }
    }

    /// Allocates `slots` slots of `layout`.
    pub fn new(gpu: &Gpu, slots: usize, layout: SlotLayout) -> Result<SlotArena> {
        let slot_bytes = layout.slot_bytes as u64;
        let slots_per_chunk = (gpu.caps.max_binding / slot_bytes) as usize;
        if slots_per_chunk == 0 {
            return Err(Error::Gpu(format!(
                "one expert ({slot_bytes} bytes) exceeds the storage binding limit ({})",
                gpu.caps.max_binding
            )));
        }
        let chunks = (0..slots.div_ceil(slots_per_chunk))
            .map(|c| {
                let n = slots_per_chunk.min(slots - c * slots_per_chunk);
                gpu.storage("expert slots", n as u64 * slot_bytes)
            })
            .collect();
        Ok(SlotArena { layout, slots, slots_per_chunk, chunks })
    }

    /// Bytes of GPU memory the arena holds.
    pub fn bytes(&self) -> u64 {
        (self.slots * self.layout.slot_bytes) as u64
    }

    /// Copies one expert's slot bytes (`layout.slot_bytes` long, or a store extent that starts
    /// with them) into `slot` (queued; visible to work submitted afterwards).
    pub fn write(&self, gpu: &Gpu, slot: usize, bytes: &[u8]) {
        let chunk = &self.chunks[slot / self.slots_per_chunk];
        let offset = ((slot % self.slots_per_chunk) * self.layout.slot_bytes) as u64;
        gpu.queue.write_buffer(chunk, offset, &bytes[..self.layout.slot_bytes]);
    }
}
