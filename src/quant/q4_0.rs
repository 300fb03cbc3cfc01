//! ggml's Q4_0 blocks as an [`Int4Matrix`], losslessly. A Q4_0 block is 32 weights
//! `d * (q - 8)`, one f16 `d` and 4-bit codes `q`: exactly int4 symmetric in groups of 32 with
//! scale `d` and code `q` (`(n - 8) * scale`). Only the nibble order differs: a block's byte `j`
//! holds weights `j` (low nibble) and `j + 16` (high), an int4 word eight consecutive weights.
//! So a Q4_0 matrix runs on the int4 kernels (their 16-byte and shared-input loads) instead of
//! the ggml reader's unaligned 18-byte blocks, every weight the same value.

use super::{Int4Layout, Int4Matrix, Int4Scheme, QuantError, QuantParams};

/// Bytes of one Q4_0 block: the f16 scale, then 16 bytes of codes.
const BLOCK_BYTES: usize = 18;

/// The int4 parameters a Q4_0 matrix becomes.
pub const Q4_0_AS_INT4: QuantParams = QuantParams { scheme: Int4Scheme::Symmetric, group_size: 32 };

impl Int4Matrix {
    /// The `[rows, cols]` matrix whose rows of Q4_0 blocks are `bytes` (as a GGUF file stores
    /// them), in [`Q4_0_AS_INT4`]. Fails if `cols` is not a whole number of blocks or `bytes`
    /// is not `rows` rows of them.
    pub fn from_q4_0(bytes: &[u8], rows: usize, cols: usize) -> Result<Int4Matrix, QuantError> {
        let layout = Int4Layout::new(rows, cols, Q4_0_AS_INT4)?;
        let mut blob = vec![0u8; layout.total_len];
        write_q4_0_as_int4(bytes, rows, cols, &mut blob)?;
        Int4Matrix::read_from(&blob, &layout)
    }
}

/// Writes the int4 blob ([`Int4Matrix::write_into`]'s bytes, padding zeroed) of the `[rows,
/// cols]` Q4_0 matrix `bytes` into `out[..total_len]`, straight from the blocks (an expert's
/// slot is restaged this way on every read, so it runs at memory speed). Fails as
/// [`Int4Matrix::from_q4_0`] does, or if `out` is shorter than the blob.
pub fn write_q4_0_as_int4(bytes: &[u8], rows: usize, cols: usize, out: &mut [u8]) -> Result<(), QuantError> {
    let l = Int4Layout::new(rows, cols, Q4_0_AS_INT4)?;
    let needed = rows * cols / 32 * BLOCK_BYTES;
    if bytes.len() != needed {
        return Err(QuantError::BufferTooSmall { what: "Q4_0 matrix", needed, got: bytes.len() });
    }
    if out.len() < l.total_len {
        return Err(QuantError::BufferTooSmall { what: "int4 matrix blob", needed: l.total_len, got: out.len() });
    }
    let out = &mut out[..l.total_len];
    out.fill(0);
    let (packed, rest) = out.split_at_mut(l.scales_offset);
    let scales = &mut rest[..l.scales_len];
    let blocks = bytes.chunks_exact(BLOCK_BYTES);
    for ((block, words), scale) in blocks.zip(packed.chunks_exact_mut(16)).zip(scales.chunks_exact_mut(2)) {
        scale.copy_from_slice(&block[..2]);
        let lo = u64::from_le_bytes(block[2..10].try_into().expect("8 bytes"));
        let hi = u64::from_le_bytes(block[10..18].try_into().expect("8 bytes"));
        // Words 0 and 1: weights 0..16, the low nibbles; words 2 and 3: 16..32, the high.
        for (word, codes) in words.chunks_exact_mut(4).zip([lo, hi, lo >> 4, hi >> 4]) {
            word.copy_from_slice(&nibbles_of_bytes(codes).to_le_bytes());
        }
    }
    Ok(())
}

/// The low nibbles of `x`'s eight bytes packed into one word, byte `j`'s at bits `4j`.
fn nibbles_of_bytes(x: u64) -> u32 {
    let x = x & 0x0F0F_0F0F_0F0F_0F0F;
    let x = (x | x >> 4) & 0x00FF_00FF_00FF_00FF;
    let x = (x | x >> 8) & 0x0000_FFFF_0000_FFFF;
    (x | x >> 16) as u32
}
