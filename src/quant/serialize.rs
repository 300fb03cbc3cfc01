//! Writing an [`Int4Matrix`] into its blob and reading it back.

use half::f16;

use super::{Int4Layout, Int4Matrix, QuantError};

impl Int4Matrix {
    /// Writes the blob described by [`Int4Matrix::layout`] into `out[..total_len]`.
    ///
    /// Padding bytes are set to zero. Fails if `out` is shorter than `total_len`.
    pub fn write_into(&self, out: &mut [u8]) -> Result<(), QuantError> {
        let l = self.layout();
        if out.len() < l.total_len {
            return Err(QuantError::BufferTooSmall { what: "int4 matrix blob", needed: l.total_len, got: out.len() });
        }
        let out = &mut out[..l.total_len];
        out.fill(0);
        let packed = &mut out[l.packed_offset..l.packed_offset + l.packed_len];
        for (dst, w) in packed.chunks_exact_mut(4).zip(&self.packed) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
        write_f16s(&mut out[l.scales_offset..l.scales_offset + l.scales_len], &self.scales);
        write_f16s(&mut out[l.mins_offset..l.mins_offset + l.mins_len], &self.mins);
        Ok(())
    }

    /// Reads a matrix back from a blob written by [`Int4Matrix::write_into`].
    ///
    /// Fails if `bytes` is shorter than `layout.total_len`. Any bit pattern is accepted
    /// (integrity is the container's job, e.g. the expert store's crc32).
    pub fn read_from(bytes: &[u8], layout: &Int4Layout) -> Result<Int4Matrix, QuantError> {
        let l = Int4Layout::new(layout.rows, layout.cols, layout.params)?;
        if bytes.len() < l.total_len {
            return Err(QuantError::BufferTooSmall { what: "int4 matrix blob", needed: l.total_len, got: bytes.len() });
        }
        let n_groups = l.rows * l.groups_per_row();
        let packed = bytes[l.packed_offset..l.packed_offset + l.packed_len]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let scales = read_f16s(&bytes[l.scales_offset..], n_groups);
        let mins = if l.mins_len > 0 { read_f16s(&bytes[l.mins_offset..], n_groups) } else { Vec::new() };
        Ok(Int4Matrix { rows: l.rows, cols: l.cols, params: l.params, packed, scales, mins })
    }
}

/// Writes little-endian f16 values at the start of `out`.
pub(crate) fn write_f16s(out: &mut [u8], vals: &[f16]) {
    for (dst, v) in out.chunks_exact_mut(2).zip(vals) {
        dst.copy_from_slice(&v.to_bits().to_le_bytes());
    }
}

/// Reads `n` little-endian f16 values from the start of `bytes` (which must hold them).
pub(crate) fn read_f16s(bytes: &[u8], n: usize) -> Vec<f16> {
    bytes[..n * 2].chunks_exact(2).map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]]))).collect()
}
