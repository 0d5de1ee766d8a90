//! The evaluation crate's error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EvalError {
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("plotting {path}: {message}")]
    Plot { path: String, message: String },
}

pub type Result<T> = std::result::Result<T, EvalError>;

/// An I/O error with the path it concerns.
pub(crate) fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> EvalError + '_ {
    move |source| EvalError::Io {
        path: path.display().to_string(),
        source,
    }
}
