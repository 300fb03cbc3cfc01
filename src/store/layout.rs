//! [`ExpertLayout`]: where the gate, up and down blobs lie inside one expert extent.

use crate::quant::{Int4Layout, QuantError, WeightEncoding};

/// Alignment of every extent's file offset and length (for O_DIRECT).
pub const EXTENT_ALIGN: usize = 4096;

/// One projection's blob inside an extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProjectionLayout {
    /// Byte offset of the blob from the extent start (multiple of 256).
    pub offset: usize,
    /// Blob length in bytes (multiple of 256).
    pub len: usize,
    /// Rows of the weight (output dimension).
    pub rows: usize,
    /// Columns of the weight (input dimension).
    pub cols: usize,
}

impl ProjectionLayout {
    /// The blob's int4 segment layout (offsets relative to the blob, not the extent), if int4.
    pub fn int4_layout(&self, encoding: WeightEncoding) -> Option<Int4Layout> {
        match encoding {
            WeightEncoding::F16 => None,
            WeightEncoding::Int4(p) => Int4Layout::new(self.rows, self.cols, p).ok(),
        }
    }

    /// The blob's bytes within an extent.
    pub fn slice<'a>(&self, extent: &'a [u8]) -> &'a [u8] {
        &extent[self.offset..self.offset + self.len]
    }
}

/// The sub-layout shared by every expert extent of a store.
///
/// gate and up are `[intermediate, hidden]`, down is `[hidden, intermediate]`; the blobs follow
/// each other in that order from extent offset 0, each encoded with `encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpertLayout {
    /// Storage encoding of all three projections.
    pub encoding: WeightEncoding,
    /// Model hidden size.
    pub hidden: usize,
    /// Expert intermediate (FFN) size.
    pub intermediate: usize,
    /// gate_proj blob.
    pub gate: ProjectionLayout,
    /// up_proj blob.
    pub up: ProjectionLayout,
    /// down_proj blob.
    pub down: ProjectionLayout,
    /// Bytes holding data (`down.offset + down.len`).
    pub data_len: usize,
    /// Extent length: `data_len` rounded up to 4096.
    pub extent_len: usize,
}

impl ExpertLayout {
    /// Computes the layout; fails if the shapes do not suit the encoding.
    pub fn new(encoding: WeightEncoding, hidden: usize, intermediate: usize) -> Result<Self, QuantError> {
        let proj = |offset: usize, rows: usize, cols: usize| -> Result<ProjectionLayout, QuantError> {
            Ok(ProjectionLayout { offset, len: encoding.segment_bytes(rows, cols)?, rows, cols })
        };
        let gate = proj(0, intermediate, hidden)?;
        let up = proj(gate.offset + gate.len, intermediate, hidden)?;
        let down = proj(up.offset + up.len, hidden, intermediate)?;
        let data_len = down.offset + down.len;
        Ok(ExpertLayout {
            encoding,
            hidden,
            intermediate,
            gate,
            up,
            down,
            data_len,
            extent_len: data_len.div_ceil(EXTENT_ALIGN) * EXTENT_ALIGN,
        })
    }

    /// The three projections with their HF names, in extent order.
    pub fn projections(&self) -> [(&'static str, ProjectionLayout); 3] {
        [("gate_proj", self.gate), ("up_proj", self.up), ("down_proj", self.down)]
    }
}
