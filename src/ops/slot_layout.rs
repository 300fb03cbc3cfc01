//! Where an expert's three projections lie inside a slot of the expert arena, and in which
//! format each is read: the layout the expert kernels bind and the arena allocates by.

use super::matrix::{write_gguf_blob, BlobOffsets};
use super::weight_tiles;
use super::WeightFormat;
use crate::error::{Error, Result};
use crate::store::ExpertLayout;

/// Where an expert's three projections lie inside a slot, and in which format each is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    /// Weight format of gate and up (read by `expert_gate_up`).
    pub format: WeightFormat,
    /// Weight format of down (read by `expert_down`): `format` except for GGUF experts whose
    /// down projection has its own ggml type (Q4_K_M: gate/up Q4_K, down Q6_K).
    pub down_format: WeightFormat,
    /// Hidden size.
    pub hidden: usize,
    /// Expert intermediate size.
    pub inter: usize,
    /// Byte offsets of gate, up and down within the slot.
    pub proj_bytes: [usize; 3],
    /// Bytes per slot (a multiple of 256).
    pub slot_bytes: usize,
    /// The three projections are in the CPU layout's tiles ([`crate::ops::weight_tiles`]), not
    /// row-major ([`SlotLayout::tiled`]).
    pub tiles: bool,
}

impl SlotLayout {
    /// The layout of an expert of `hidden` × `inter` in `format`: the expert store's extent
    /// layout (without its 4 KiB tail padding) for f16/int4, the same scheme for f32.
    pub fn new(format: WeightFormat, hidden: usize, inter: usize) -> Result<SlotLayout> {
        SlotLayout::mixed(format, format, hidden, inter)
    }

    /// The layout of an expert whose gate and up are in `format` and down in `down_format`:
    /// [`SlotLayout::new`]'s when they agree, else the three blobs back to back, each in its
    /// own format.
    pub fn mixed(format: WeightFormat, down_format: WeightFormat, hidden: usize, inter: usize) -> Result<SlotLayout> {
        let (proj_bytes, slot_bytes) = match format.encoding().filter(|_| format == down_format) {
            Some(enc) => {
                let l = ExpertLayout::new(enc, hidden, inter).map_err(|e| Error::UnsupportedConfig(e.to_string()))?;
                ([l.gate.offset, l.up.offset, l.down.offset], l.data_len)
            }
            None => {
                let a = format.blob_bytes(inter, hidden)?;
                let d = down_format.blob_bytes(hidden, inter)?;
                ([0, a, 2 * a], 2 * a + d)
            }
        };
        Ok(SlotLayout { format, down_format, hidden, inter, proj_bytes, slot_bytes, tiles: false })
    }

    /// This layout with its projections in tiles where all three can be
    /// ([`weight_tiles::fits`]); the same offsets and sizes.
    pub fn tiled(&self) -> SlotLayout {
        let tiles = (0..3).all(|i| {
            let (rows, cols) = self.proj_shape(i);
            weight_tiles::fits(self.proj_format(i), rows, cols)
        });
        SlotLayout { tiles, ..*self }
    }

    /// This layout with row-major projections.
    pub fn row_major(&self) -> SlotLayout {
        SlotLayout { tiles: false, ..*self }
    }

    /// Reorders the row-major projections of `slot` (this layout's bytes) into tiles where this
    /// layout holds them tiled, through `scratch` ([`weight_tiles::tile`]).
    pub fn tile(&self, slot: &mut [u8], scratch: &mut Vec<u8>) -> Result<()> {
        if !self.tiles {
            return Ok(());
        }
        for i in 0..3 {
            let (rows, cols) = self.proj_shape(i);
            let format = self.proj_format(i);
            let blob = &mut slot[self.proj_bytes[i]..self.proj_bytes[i] + format.blob_bytes(rows, cols)?];
            weight_tiles::tile(blob, rows, cols, format, format.offsets(rows, cols)?, scratch)?;
        }
        Ok(())
    }

    /// The shader defines of projection `i`'s (0 gate, 1 up, 2 down) weight reader: its format's,
    /// and `TILES` for tiles.
    pub fn reader_defines(&self, i: usize) -> Vec<&'static str> {
        weight_tiles::reader_defines(self.proj_format(i), self.tiles)
    }

    /// The format of projection `i` (0 gate, 1 up, 2 down).
    pub fn proj_format(&self, i: usize) -> WeightFormat {
        if i == 2 {
            self.down_format
        } else {
            self.format
        }
    }

    /// The `[rows, cols]` shape of projection `i` (0 gate, 1 up, 2 down).
    fn proj_shape(&self, i: usize) -> (usize, usize) {
        if i == 2 {
            (self.hidden, self.inter)
        } else {
            (self.inter, self.hidden)
        }
    }

    /// Kernel offsets of projection `i` (0 gate, 1 up, 2 down) relative to the slot start.
    pub fn proj_offsets(&self, i: usize) -> Result<BlobOffsets> {
        let (rows, cols) = self.proj_shape(i);
        let format = self.proj_format(i);
        Ok(format.offsets(rows, cols)?.shifted(format, self.proj_bytes[i]))
    }

    /// This layout with each projection in the format the GPU reads it in best
    /// ([`WeightFormat::for_gpu`]: GGUF Q4_0 as int4, Q6_K in padded blocks): the slots of
    /// experts stored in GGUF blocks.
    pub fn for_gpu(&self) -> Result<SlotLayout> {
        SlotLayout::mixed(self.format.for_gpu(), self.down_format.for_gpu(), self.hidden, self.inter)
    }

    /// Writes into `slot` (this layout's `slot_bytes`) the expert `stored` holds in the layout
    /// `from`, whose [`SlotLayout::for_gpu`] this is: each projection stored in another format
    /// rewritten by [`write_gguf_blob`] (the same weights), the others copied.
    pub fn restage(&self, from: &SlotLayout, stored: &[u8], slot: &mut [u8]) -> Result<()> {
        if from.for_gpu()? != *self || stored.len() < from.slot_bytes || slot.len() != self.slot_bytes {
            return Err(Error::InvalidArgument(format!(
                "cannot restage {} bytes of {} experts into {} bytes of {} slots",
                stored.len(),
                from.format_name(),
                slot.len(),
                self.format_name()
            )));
        }
        slot.fill(0);
        for i in 0..3 {
            let (rows, cols) = self.proj_shape(i);
            let (src_format, dst_format) = (from.proj_format(i), self.proj_format(i));
            let src = &stored[from.proj_bytes[i]..from.proj_bytes[i] + src_format.blob_bytes(rows, cols)?];
            let dst = &mut slot[self.proj_bytes[i]..self.proj_bytes[i] + dst_format.blob_bytes(rows, cols)?];
            match src_format {
                WeightFormat::Ggml(t) if dst_format != src_format => {
                    write_gguf_blob(t, rows, cols, &src[..rows * t.row_bytes(cols)], dst)?
                }
                _ => dst.copy_from_slice(src),
            }
        }
        Ok(())
    }

    /// The formats' name: `q4_k` when all three agree, `q4_k+q6_k` (gate/up + down) else.
    pub fn format_name(&self) -> String {
        match self.format == self.down_format {
            true => self.format.name(),
            false => format!("{}+{}", self.format.name(), self.down_format.name()),
        }
    }

    /// An expert's slot bytes from its three projections' stored blobs (GGUF bytes in this
    /// layout's formats), copied unchanged.
    pub fn place(&self, blobs: [&[u8]; 3]) -> Vec<u8> {
        let mut bytes = vec![0u8; self.slot_bytes];
        for (i, blob) in blobs.into_iter().enumerate() {
            bytes[self.proj_bytes[i]..self.proj_bytes[i] + blob.len()].copy_from_slice(blob);
        }
        bytes
    }

    /// Encodes an expert's f32 weights into slot bytes.
    pub fn encode(&self, gate: &[f32], up: &[f32], down: &[f32]) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.slot_bytes];
        let parts = [(gate, self.inter, self.hidden), (up, self.inter, self.hidden), (down, self.hidden, self.inter)];
        for (i, (w, rows, cols)) in parts.into_iter().enumerate() {
            let blob = self.proj_format(i).encode(w, rows, cols)?;
            bytes[self.proj_bytes[i]..self.proj_bytes[i] + blob.len()].copy_from_slice(&blob);
        }
        Ok(bytes)
    }
}
