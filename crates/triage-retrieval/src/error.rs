//! The error type of `triage-retrieval`.

use std::path::PathBuf;

/// Errors from ingesting and searching corpora.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetrievalError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    BadDocument { path: PathBuf, message: String },
    #[error("no corpus named {0:?} (ingest one first)")]
    UnknownCorpus(String),
    /// Another process (or request) is writing the corpus now.
    #[error("corpus {0:?} is being written by another ingest; retry when it is done")]
    Busy(String),
    #[error("corpus {name:?} is damaged: {message}")]
    Damaged { name: String, message: String },
    #[error("model: {0}")]
    Model(#[from] triage_models::ModelError),
    #[error("index: {0}")]
    Index(String),
    #[error("reranker: {0}")]
    Reranker(Box<dyn std::error::Error + Send + Sync>),
    #[error("{0}")]
    Invalid(String),
}

/// `Result` with [`RetrievalError`].
pub type Result<T> = std::result::Result<T, RetrievalError>;

pub(crate) fn io_at(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> RetrievalError {
    let path = path.to_path_buf();
    move |source| RetrievalError::Io { path, source }
}
