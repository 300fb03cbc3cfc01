//! [`WeightEncoding`]: how one weight matrix is stored in a blob (f16 or int4).

use half::f16;

use super::layout::{align_up, SEGMENT_ALIGN};
use super::serialize::{read_f16s, write_f16s};
use super::{quantize, Int4Layout, Int4Matrix, QuantError, QuantParams};

/// Storage encoding of a weight matrix blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightEncoding {
    /// Plain row-major little-endian f16, blob padded to a multiple of 256 bytes.
    F16,
    /// Int4 group quantization (see the [module docs](super)).
    Int4(QuantParams),
}

impl WeightEncoding {
    /// Human-readable name, e.g. `"f16"`, `"int4-affine-g32"`.
    pub fn name(&self) -> String {
        match self {
            WeightEncoding::F16 => "f16".to_string(),
            WeightEncoding::Int4(p) => format!("int4-{}-g{}", p.scheme.name(), p.group_size),
        }
    }

    /// Checks that a `[rows, cols]` matrix can be stored with this encoding.
    pub fn check_shape(&self, rows: usize, cols: usize) -> Result<(), QuantError> {
        match self {
            WeightEncoding::F16 if rows == 0 || cols == 0 => Err(QuantError::Empty { rows, cols }),
            WeightEncoding::F16 => Ok(()),
            WeightEncoding::Int4(p) => p.check_shape(rows, cols),
        }
    }

    /// Blob length in bytes of a `[rows, cols]` matrix (a multiple of 256).
    pub fn segment_bytes(&self, rows: usize, cols: usize) -> Result<usize, QuantError> {
        self.check_shape(rows, cols)?;
        Ok(match self {
            WeightEncoding::F16 => align_up(rows * cols * 2, SEGMENT_ALIGN),
            WeightEncoding::Int4(p) => Int4Layout::new(rows, cols, *p)?.total_len,
        })
    }

    /// Encodes a row-major `[rows, cols]` f32 matrix into `out[..segment_bytes]`
    /// (quantizing for int4). Padding is zeroed.
    pub fn encode(&self, weights: &[f32], rows: usize, cols: usize, out: &mut [u8]) -> Result<(), QuantError> {
        let needed = self.segment_bytes(rows, cols)?;
        if out.len() < needed {
            return Err(QuantError::BufferTooSmall { what: "weight blob", needed, got: out.len() });
        }
        match self {
            WeightEncoding::F16 => {
                if weights.len() != rows * cols {
                    return Err(QuantError::LengthMismatch { rows, cols, len: weights.len() });
                }
                let mut h = Vec::with_capacity(weights.len());
                for (i, &v) in weights.iter().enumerate() {
                    let x = f16::from_f32(v);
                    if !x.is_finite() {
                        let (row, col) = (i / cols, i % cols);
                        return Err(if v.is_finite() {
                            QuantError::F16Overflow { row, col, value: v }
                        } else {
                            QuantError::NonFinite { row, col, value: v }
                        });
                    }
                    h.push(x);
                }
                out[..needed].fill(0);
                write_f16s(out, &h);
                Ok(())
            }
            WeightEncoding::Int4(p) => quantize(weights, rows, cols, *p)?.write_into(out),
        }
    }

    /// Decodes (dequantizes) a blob written by [`WeightEncoding::encode`] to row-major f32.
    pub fn decode(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>, QuantError> {
        let needed = self.segment_bytes(rows, cols)?;
        if bytes.len() < needed {
            return Err(QuantError::BufferTooSmall { what: "weight blob", needed, got: bytes.len() });
        }
        match self {
            WeightEncoding::F16 => Ok(read_f16s(bytes, rows * cols).into_iter().map(f16::to_f32).collect()),
            WeightEncoding::Int4(p) => {
                let l = Int4Layout::new(rows, cols, *p)?;
                Ok(Int4Matrix::read_from(bytes, &l)?.dequantize())
            }
        }
    }
}
