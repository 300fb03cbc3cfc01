//! Byte layout of a serialized [`Int4Matrix`](super::Int4Matrix) blob.

use super::{QuantError, QuantParams};

/// Alignment (bytes) of every segment start and of every blob length.
pub const SEGMENT_ALIGN: usize = 256;

/// Rounds `n` up to a multiple of `a` (a power of two).
pub(crate) fn align_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// Where each segment of a serialized int4 matrix lies, in bytes from the blob start.
///
/// See the [module documentation](super) for the exact bit layout of each segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Int4Layout {
    /// Rows of the matrix.
    pub rows: usize,
    /// Columns of the matrix (the quantized, input dimension).
    pub cols: usize,
    /// Scheme and group size.
    pub params: QuantParams,
    /// Offset of the packed `u32` words (always 0).
    pub packed_offset: usize,
    /// Bytes of packed words: `rows * cols / 2`.
    pub packed_len: usize,
    /// Offset of the f16 scales (multiple of 256).
    pub scales_offset: usize,
    /// Bytes of scales including padding to 4 bytes: `align_up(rows * cols/group * 2, 4)`.
    pub scales_len: usize,
    /// Offset of the f16 mins (multiple of 256; equals `total_len` when there are none).
    pub mins_offset: usize,
    /// Bytes of mins including padding to 4 bytes (0 for symmetric).
    pub mins_len: usize,
    /// Total blob length (multiple of 256).
    pub total_len: usize,
}

impl Int4Layout {
    /// Lays out a `[rows, cols]` matrix; fails on bad group size, empty or misaligned shapes.
    pub fn new(rows: usize, cols: usize, params: QuantParams) -> Result<Self, QuantError> {
        params.check_shape(rows, cols)?;
        let packed_len = rows * cols / 2;
        let n_scales = rows * params.groups_per_row(cols);
        let scales_offset = align_up(packed_len, SEGMENT_ALIGN);
        let scales_len = align_up(n_scales * 2, 4);
        let mins_offset = align_up(scales_offset + scales_len, SEGMENT_ALIGN);
        let mins_len = if params.scheme.has_mins() { scales_len } else { 0 };
        let total_len = align_up(mins_offset + mins_len, SEGMENT_ALIGN);
        Ok(Int4Layout {
            rows,
            cols,
            params,
            packed_offset: 0,
            packed_len,
            scales_offset,
            scales_len,
            mins_offset,
            mins_len,
            total_len,
        })
    }

    /// Packed `u32` words per row (`cols / 8`).
    pub fn words_per_row(&self) -> usize {
        self.cols / 8
    }

    /// Groups (scales) per row (`ceil(cols / group_size)`).
    pub fn groups_per_row(&self) -> usize {
        self.params.groups_per_row(self.cols)
    }
}

/// Lays out a `[rows, cols]` int4 matrix: shorthand for [`Int4Layout::new`].
pub fn layout(rows: usize, cols: usize, params: QuantParams) -> Result<Int4Layout, QuantError> {
    Int4Layout::new(rows, cols, params)
}
