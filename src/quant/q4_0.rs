//! ggml's Q4_0 blocks as an [`Int4Matrix`], losslessly. A Q4_0 block is 32 weights
//! `d * (q - 8)`, one f16 `d` and 4-bit codes `q`: exactly int4 symmetric in groups of 32 with
//! scale `d` and code `q` (`(n - 8) * scale`). Only the nibble order differs: a block's byte `j`
//! holds weights `j` (low nibble) and `j + 16` (high), an int4 word eight consecutive weights.
//! So a Q4_0 matrix runs on the int4 kernels (their 16-byte and shared-input loads) instead of
//! the ggml reader's unaligned 18-byte blocks, every weight the same value.

use half::f16;

use super::{Int4Matrix, Int4Scheme, QuantError, QuantParams};

/// Bytes of one Q4_0 block: the f16 scale, then 16 bytes of codes.
const BLOCK_BYTES: usize = 18;

/// The int4 parameters a Q4_0 matrix becomes.
pub const Q4_0_AS_INT4: QuantParams = QuantParams { scheme: Int4Scheme::Symmetric, group_size: 32 };

impl Int4Matrix {
    /// The `[rows, cols]` matrix whose rows of Q4_0 blocks are `bytes` (as a GGUF file stores
    /// them), in [`Q4_0_AS_INT4`]. Fails if `cols` is not a whole number of blocks or `bytes`
    /// is not `rows` rows of them.
    pub fn from_q4_0(bytes: &[u8], rows: usize, cols: usize) -> Result<Int4Matrix, QuantError> {
        Q4_0_AS_INT4.check_shape(rows, cols)?;
        let needed = rows * cols / 32 * BLOCK_BYTES;
        if bytes.len() != needed {
            return Err(QuantError::BufferTooSmall { what: "Q4_0 matrix", needed, got: bytes.len() });
        }
        let blocks = bytes.chunks_exact(BLOCK_BYTES);
        let scales = blocks.clone().map(|b| f16::from_le_bytes([b[0], b[1]])).collect();
        let packed = blocks
            .flat_map(|b| {
                let qs = &b[2..];
                // Words 0 and 1: weights 0..16, the low nibbles; words 2 and 3: 16..32, the high.
                [(0, 0), (8, 0), (0, 4), (8, 4)].map(|(first, shift)| {
                    (0..8).fold(0u32, |w, j| w | u32::from((qs[first + j] >> shift) & 15) << (4 * j))
                })
            })
            .collect();
        Ok(Int4Matrix { rows, cols, params: Q4_0_AS_INT4, packed, scales, mins: Vec::new() })
    }
}
