//! Nibble packing: 8 four-bit codes per little-endian `u32`, low nibble first.

/// Packs one row of 4-bit codes (each `0..=15`, `codes.len() == 8 * out.len()`) into words:
/// code `8w + j` goes to bits `4j..4j+3` of `out[w]`.
///
/// # Panics
/// If the lengths disagree (an internal invariant: callers size both from `cols`).
pub fn pack_row(codes: &[u8], out: &mut [u32]) {
    assert_eq!(codes.len(), out.len() * 8, "pack_row: codes/words length mismatch");
    for (word, chunk) in out.iter_mut().zip(codes.chunks_exact(8)) {
        let mut w = 0u32;
        for (j, &n) in chunk.iter().enumerate() {
            w |= u32::from(n & 0xF) << (4 * j);
        }
        *word = w;
    }
}

/// The 4-bit code of column `col` within a packed row.
#[inline]
pub fn unpack_nibble(row_words: &[u32], col: usize) -> u8 {
    ((row_words[col / 8] >> (4 * (col % 8))) & 0xF) as u8
}
