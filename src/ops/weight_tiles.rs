//! Int4 and f16 matrices in tiles for the CPU layout (`TILES`, shaders/weights_int4.wgsl and
//! shaders/weights_f16.wgsl).
//!
//! In the CPU layout a decode workgroup is one CPU thread whose 8 SIMD lanes take 4 (expert
//! kernels) or 8 (matvec) rows each, and every load is a loop over the lanes, so a row-major
//! matrix has one load touch 8 rows 4 or 8 rows' length apart and a workgroup walk 32-64 rows
//! side by side. Tiled, the same bytes are reordered so that each (row, 64-column pair) unit of
//! a block of 64 rows — int4: 32 code bytes, one word of scales, one of mins, each in its own
//! segment; f16: 128 bytes — sits beside those of the block's other rows, the lanes' side by
//! side, and the block's tiles follow one another: a load touches 4 (expert kernels) or 8
//! (matvec) neighbouring cache lines, and a workgroup reads each segment forward. Segment offsets
//! and sizes, and so every weight's value, are unchanged; only the kernels' addressing differs.
//! (ggml blocks tiled the same way made Q4_K_M decode slower, so they stay row-major.)

use super::{BlobOffsets, WeightFormat};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::ops::matmul::DecodeLayout;

/// Rows and columns of a tile.
pub const TILE: usize = 64;

/// Whether `gpu`'s kernels read a `[rows, cols]` matrix in `format` tiled: [`on`] it, and the
/// matrix [`fits`].
pub fn apply(gpu: &Gpu, format: WeightFormat, rows: usize, cols: usize) -> bool {
    on(gpu) && fits(format, rows, cols)
}

/// Whether `gpu` tiles weights: the CPU layout
/// ([`Caps::weight_tiles`](crate::gpu::Caps::weight_tiles) and lanes taking whole rows).
pub fn on(gpu: &Gpu) -> bool {
    gpu.caps.weight_tiles && DecodeLayout::for_gpu(gpu) == DecodeLayout::LaneRows
}

/// Whether a `[rows, cols]` matrix in `format` can be tiled: int4 in groups of 32 or f16, rows
/// and columns multiples of [`TILE`].
pub fn fits(format: WeightFormat, rows: usize, cols: usize) -> bool {
    let tiled_format = match format {
        WeightFormat::Int4(p) => p.group_size == 32,
        f => f == WeightFormat::F16,
    };
    tiled_format && rows.is_multiple_of(TILE) && cols.is_multiple_of(TILE)
}

/// The shader defines of the weight reader of a matrix in `format`: the format's, and `TILES`
/// where it is held tiled.
pub fn reader_defines(format: WeightFormat, tiles: bool) -> Vec<&'static str> {
    let mut d = format.defines();
    if tiles {
        d.push("TILES");
    }
    d
}

/// The tiled position of (row, pair) among a segment's units, as `tile_unit` in
/// shaders/weights_common.wgsl: tile after tile, and within a tile the units of rows 4 l + r
/// (lane l's row r in the expert kernels, 4 rows a lane) at r * 16 + l, so each row of the
/// lanes is side by side (the matvec's lanes, 8 rows each, two units apart).
fn tile_unit(row: usize, pair: usize, pairs: usize) -> usize {
    ((row / TILE) * pairs + pair) * TILE + (row % 4) * 16 + (row % TILE) / 4
}

/// Reorders the row-major `[rows, cols]` blob `blob` (int4 in groups of 32 or f16, segments at
/// `offsets`) into tiles, in place, copying each block of 64 rows through `scratch` (kept by
/// callers that tile often, such as the I/O threads, so they do not allocate per read).
pub fn tile(
    blob: &mut [u8],
    rows: usize,
    cols: usize,
    format: WeightFormat,
    offsets: BlobOffsets,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let has_mins = matches!(format, WeightFormat::Int4(p) if p.scheme.has_mins());
    if !fits(format, rows, cols) || blob.len() != format.blob_bytes(rows, cols)? {
        return Err(Error::InvalidArgument(format!(
            "a {}-byte blob is not a tileable [{rows}, {cols}] {} matrix",
            blob.len(),
            format.name()
        )));
    }
    let pairs = cols / TILE;
    if format == WeightFormat::F16 {
        let at = offsets.data as usize * 2;
        permute(&mut blob[at..at + rows * cols * 2], 128, pairs, scratch);
        return Ok(());
    }
    let codes = offsets.data as usize * 4;
    permute(&mut blob[codes..codes + rows * cols / 2], 32, pairs, scratch);
    let scales = offsets.scales as usize * 2;
    permute(&mut blob[scales..scales + rows * pairs * 4], 4, pairs, scratch);
    if has_mins {
        let mins = offsets.mins as usize * 2;
        permute(&mut blob[mins..mins + rows * pairs * 4], 4, pairs, scratch);
    }
    Ok(())
}

/// Moves each `unit`-byte (row, pair) unit of the row-major `segment` to its tiled position,
/// one block of [`TILE`] rows at a time (a block's tiles take the bytes its rows held), so
/// `scratch` holds one block.
fn permute(segment: &mut [u8], unit: usize, pairs: usize, scratch: &mut Vec<u8>) {
    for block in segment.chunks_exact_mut(TILE * pairs * unit) {
        scratch.clear();
        scratch.extend_from_slice(block);
        for (i, src) in scratch.chunks_exact(unit).enumerate() {
            let to = tile_unit(i / pairs, i % pairs, pairs) * unit;
            block[to..to + unit].copy_from_slice(src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (row, pair) of a 128 × 192 matrix lands on its own unit, the first block's before
    /// the second's.
    #[test]
    fn tiles_are_a_permutation_block_by_block() {
        let (rows, pairs) = (128, 3);
        let mut seen = vec![false; rows * pairs];
        for row in 0..rows {
            for pair in 0..pairs {
                let u = tile_unit(row, pair, pairs);
                assert!(!seen[u], "unit {u} taken twice");
                seen[u] = true;
                assert_eq!(u / (TILE * pairs), row / TILE, "row {row} left its block");
            }
        }
        // An expert kernel lane's row r (row 4 l + r) sits beside the next lane's.
        assert_eq!(tile_unit(4 + 3, 1, pairs), tile_unit(3, 1, pairs) + 1);
    }
}
