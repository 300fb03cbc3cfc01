//! [`GgufError`]: everything that can be wrong with a GGUF file, by name.

use std::path::PathBuf;

/// A GGUF file (or split set) that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file does not start with `GGUF`.
    #[error("{path}: not a GGUF file (magic {magic:02x?})")]
    BadMagic {
        /// The file involved.
        path: PathBuf,
        /// The first four bytes.
        magic: [u8; 4],
    },
    /// A GGUF version other than 2 or 3.
    #[error("{path}: GGUF version {version} is not supported (2 and 3 are)")]
    Version {
        /// The file involved.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
    /// The file ends inside the header, metadata or tensor table.
    #[error("{path}: truncated while reading {what} at byte {offset}")]
    Truncated {
        /// The file involved.
        path: PathBuf,
        /// What was being read.
        what: String,
        /// Where.
        offset: usize,
    },
    /// A malformed header field (unknown value type, bad UTF-8, absurd count, bad alignment...).
    #[error("{path}: {message}")]
    Malformed {
        /// The file involved.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor's data lies (partly) beyond the end of the file.
    #[error("{path}: tensor `{name}` ({bytes} bytes at {offset}) extends past the end of the file ({file_len} bytes)")]
    TensorOutOfBounds {
        /// The file involved.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// Absolute offset of its data.
        offset: usize,
        /// Its byte length.
        bytes: usize,
        /// The file length.
        file_len: usize,
    },
    /// A tensor type moestream does not read (with the ones it does).
    #[error("tensor `{name}` has ggml type {ggml_type}, which moestream does not read (it reads F32, F16, BF16, Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4)")]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// The type: its name when known, else its number.
        ggml_type: String,
    },
    /// A tensor's row length is not a whole number of its type's blocks.
    #[error("tensor `{name}`: row of {cols} values is not a multiple of the {block}-value block of {ggml_type}")]
    PartialBlock {
        /// Tensor name.
        name: String,
        /// Row length.
        cols: usize,
        /// Block size of the type.
        block: usize,
        /// Type name.
        ggml_type: &'static str,
    },
    /// A tensor's data does not start where the previous tensor's (padded) data ends: tensors
    /// would overlap or leave gaps, which no GGUF writer does (llama.cpp refuses it too).
    #[error("{path}: tensor `{name}` has offset {offset}, expected {expected} (where the previous tensor ends)")]
    Misplaced {
        /// The file.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// Its offset in the data section.
        offset: u64,
        /// The end of the previous tensor's data, aligned.
        expected: u64,
    },
    /// The parts of a split model do not belong together.
    #[error("split GGUF {path}: {message}")]
    Split {
        /// The file involved.
        path: PathBuf,
        /// What is inconsistent.
        message: String,
    },
    /// A metadata key the model needs is absent or has another type.
    #[error("GGUF metadata: missing or invalid key `{0}`")]
    MissingKey(String),
    /// A tensor the model needs is absent.
    #[error("GGUF: missing tensor `{0}`")]
    MissingTensor(String),
}
