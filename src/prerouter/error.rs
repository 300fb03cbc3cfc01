//! What can go wrong reading prerouter data and heads.

use std::path::PathBuf;

/// A failure of the prerouter's files or arguments.
#[derive(Debug, thiserror::Error)]
pub enum PrerouterError {
    /// A file could not be read or written.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A dataset or heads file is malformed (truncated, wrong sizes, bad header, bad values).
    #[error("corrupt prerouter file {path}: {detail}")]
    Corrupt {
        /// The file involved.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A heads file or dataset was made for a model with other dimensions.
    #[error("{path} was made for a model with {what} = {found}, this model has {expected}")]
    Mismatch {
        /// The file involved.
        path: PathBuf,
        /// The dimension that differs.
        what: &'static str,
        /// The value the model (or the other file) has.
        expected: usize,
        /// The value the file records.
        found: usize,
    },
    /// The request cannot be honoured (too little data, no layer pair to predict, bad flag).
    #[error("prerouter: {0}")]
    InvalidArgument(String),
    /// Loading the model or running it failed.
    #[error(transparent)]
    Model(#[from] crate::Error),
}

impl PrerouterError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PrerouterError::Io { path: path.into(), source }
    }

    /// A corrupt-file error.
    pub fn corrupt(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        PrerouterError::Corrupt { path: path.into(), detail: detail.into() }
    }
}

impl From<PrerouterError> for crate::Error {
    /// For callers that speak the crate's error type (the CLI).
    fn from(e: PrerouterError) -> crate::Error {
        match e {
            PrerouterError::Io { path, source } => crate::Error::Io { path, source },
            PrerouterError::Corrupt { path, detail } => crate::Error::Corrupt { path, detail },
            PrerouterError::Model(e) => e,
            other => crate::Error::InvalidArgument(other.to_string()),
        }
    }
}
