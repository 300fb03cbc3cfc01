//! [`StoreError`]: everything that can go wrong writing or reading an expert store.

use std::path::PathBuf;

use crate::quant::QuantError;

/// Errors of the expert store; each names the file and, where relevant, the expert.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A read, write, open or rename failed.
    #[error("I/O error on expert store {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file does not start with `MOEXPRT1`.
    #[error("{path} is not a moestream expert store (magic {found:02x?}, expected \"MOEXPRT1\")")]
    BadMagic {
        /// The file involved.
        path: PathBuf,
        /// The first 8 bytes found.
        found: [u8; 8],
    },
    /// The format version is not one this build reads.
    #[error(
        "expert store {path} has format version {found}; this build reads version {expected} (re-convert the model)"
    )]
    UnsupportedVersion {
        /// The file involved.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// The store was written for another model architecture.
    #[error("expert store {path} was built for architecture hash {found:#018x}, but the model has {expected:#018x} (re-convert the model)")]
    ArchMismatch {
        /// The file involved.
        path: PathBuf,
        /// Hash in the file.
        found: u64,
        /// Hash the caller expected.
        expected: u64,
    },
    /// The header or index fails its checksum or is inconsistent.
    #[error("expert store {path}: header/index is corrupt: {detail}")]
    IndexCorrupt {
        /// The file involved.
        path: PathBuf,
        /// What check failed.
        detail: String,
    },
    /// The file is shorter than its header or index requires.
    #[error("expert store {path} is truncated: it needs at least {expected_len} bytes but has {file_len}")]
    Truncated {
        /// The file involved.
        path: PathBuf,
        /// Bytes the header/index requires.
        expected_len: u64,
        /// Actual file length.
        file_len: u64,
    },
    /// The (layer, expert) pair is not in the store.
    #[error("expert store {path} holds no expert {expert} of layer {layer}")]
    IndexOutOfRange {
        /// The file involved.
        path: PathBuf,
        /// Model layer index requested.
        layer: usize,
        /// Expert index requested.
        expert: usize,
    },
    /// An expert's extent does not match its crc32.
    #[error("expert store {path}: checksum mismatch in layer {layer} expert {expert} (extent corrupt)")]
    Checksum {
        /// The file involved.
        path: PathBuf,
        /// Model layer index.
        layer: usize,
        /// Expert index.
        expert: usize,
    },
    /// The destination buffer cannot hold one extent.
    #[error("buffer of {got} bytes is too small for an expert extent of {needed} bytes")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// Quantizing, encoding or decoding a projection failed.
    #[error("{context}: {source}")]
    Quant {
        /// Which expert/projection (or `"quantization"`).
        context: String,
        /// The quantization error.
        #[source]
        source: QuantError,
    },
    /// The writer was asked to write the same expert twice.
    #[error("expert store {path}: layer {layer} expert {expert} written twice")]
    DuplicateExpert {
        /// The file being written.
        path: PathBuf,
        /// Model layer index.
        layer: usize,
        /// Expert index.
        expert: usize,
    },
    /// `finish` was called before every expert was written.
    #[error("expert store {path}: {missing} experts never written (first: layer {layer} expert {expert})")]
    Incomplete {
        /// The file being written.
        path: PathBuf,
        /// Number of missing experts.
        missing: usize,
        /// Model layer of the first missing expert.
        layer: usize,
        /// Index of the first missing expert.
        expert: usize,
    },
    /// The store description given to the writer is invalid.
    #[error("invalid expert store description for {path}: {detail}")]
    InvalidSpec {
        /// The file to be written.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

impl From<QuantError> for StoreError {
    fn from(source: QuantError) -> Self {
        StoreError::Quant { context: "quantization".to_string(), source }
    }
}

impl StoreError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io { path: path.into(), source }
    }

    pub(crate) fn corrupt(path: &std::path::Path, detail: impl Into<String>) -> Self {
        StoreError::IndexCorrupt { path: path.to_path_buf(), detail: detail.into() }
    }
}
