//! Errors of quantization, layout and (de)serialization.

/// Why a matrix could not be quantized, laid out or read back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// The group size is not one of the supported values.
    #[error("unsupported int4 group size {0}; supported: 32, 64")]
    BadGroupSize(usize),
    /// The number of columns is not a multiple of the group size.
    #[error(
        "a [{rows}, {cols}] matrix cannot be stored in int4: {cols} columns is not a multiple of 8 (one packed word)"
    )]
    ColsNotMultiple {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// A matrix with zero rows or columns was given.
    #[error("cannot quantize an empty [{rows}, {cols}] matrix")]
    Empty {
        /// Rows of the matrix.
        rows: usize,
        /// Columns of the matrix.
        cols: usize,
    },
    /// The weight slice does not hold `rows * cols` values.
    #[error("a [{rows}, {cols}] matrix needs {} values, got {len}", rows * cols)]
    LengthMismatch {
        /// Rows of the matrix.
        rows: usize,
        /// Columns of the matrix.
        cols: usize,
        /// Length of the slice given.
        len: usize,
    },
    /// A weight is NaN or infinite.
    #[error("weight at row {row}, column {col} is not finite ({value})")]
    NonFinite {
        /// Row of the offending weight.
        row: usize,
        /// Column of the offending weight.
        col: usize,
        /// The value.
        value: f32,
    },
    /// A weight, scale or min does not fit in f16.
    #[error("row {row}, column {col}: magnitude {value} exceeds the f16 range")]
    F16Overflow {
        /// Row concerned.
        row: usize,
        /// First column of the group (int4) or the column (f16).
        col: usize,
        /// The value that overflowed.
        value: f32,
    },
    /// A byte buffer is shorter than the layout requires.
    #[error("buffer of {got} bytes is too small for a {what} needing {needed} bytes")]
    BufferTooSmall {
        /// What was being read or written.
        what: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
}
