//! The expert slot arena: N fixed slots of one expert's size, allocated once, split into
//! buffers that each fit one storage binding. A slot holds an expert's gate `[I, H]`, up
//! `[I, H]` and down `[H, I]` projections back to back.

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::ops::WeightFormat;

/// Fixed GPU slots for routed experts.
pub struct SlotArena {
    /// Weight format of every slot.
    pub format: WeightFormat,
    /// Hidden size.
    pub hidden: usize,
    /// Expert intermediate size.
    pub inter: usize,
    /// Total slots.
    pub slots: usize,
    /// Slots per buffer.
    pub slots_per_chunk: usize,
    /// The buffers; slot `s` lives in `chunks[s / slots_per_chunk]`.
    pub chunks: Vec<wgpu::Buffer>,
}

impl SlotArena {
    /// Allocates `slots` slots for experts of `hidden` × `inter`.
    pub fn new(
        gpu: &Gpu,
        slots: usize,
        hidden: usize,
        inter: usize,
        format: WeightFormat,
    ) -> Result<SlotArena> {
        let slot_bytes = (Self::elems(hidden, inter) * format.bytes()) as u64;
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
        Ok(SlotArena {
            format,
            hidden,
            inter,
            slots,
            slots_per_chunk,
            chunks,
        })
    }

    /// Weights per slot.
    pub fn elems(hidden: usize, inter: usize) -> usize {
        3 * hidden * inter
    }

    /// Weights per slot of this arena.
    pub fn slot_elems(&self) -> usize {
        Self::elems(self.hidden, self.inter)
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> u64 {
        (self.slot_elems() * self.format.bytes()) as u64
    }

    /// Uploads an expert into `slot` (queued; visible to work submitted afterwards).
    pub fn write(&self, gpu: &Gpu, slot: usize, gate: &[f32], up: &[f32], down: &[f32]) {
        let mut bytes = self.format.encode(gate);
        bytes.extend(self.format.encode(up));
        bytes.extend(self.format.encode(down));
        let chunk = &self.chunks[slot / self.slots_per_chunk];
        let offset = (slot % self.slots_per_chunk) as u64 * self.slot_bytes();
        gpu.queue.write_buffer(chunk, offset, &bytes);
    }
}
