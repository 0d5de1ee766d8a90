//! The error type of `triage-fetch`.

use std::path::PathBuf;

/// Errors from fetching, importing or resolving a model or data set.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// A file operation failed; `what` says which (`creating /x`, `reading y in z.whl`).
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A wheel could not be read as a zip archive.
    #[error("{what}: {source}")]
    Zip {
        what: String,
        source: zip::result::ZipError,
    },
    /// pip could not run or failed.
    #[error("{0}")]
    Pip(String),
    /// The Hugging Face Hub could not be reached, or answered what a Hub would not.
    #[error("{0}")]
    Hub(String),
    /// A file does not have the size or hash the catalog (or the Hub) says.
    #[error("{0}")]
    Integrity(String),
    #[error("model: {0}")]
    Model(#[from] triage_models::ModelError),
    /// The caller asked for something that does not exist or is not fetched yet.
    #[error("{0}")]
    NotFound(String),
    /// The caller's request is wrong (a data set named where a model belongs, ...).
    #[error("{0}")]
    Invalid(String),
    /// One entry failed; `source` says how.
    #[error("{what}: {source}")]
    Entry {
        what: String,
        source: Box<FetchError>,
    },
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

impl FetchError {
    /// `self` with `what` before its message. Message-only kinds keep their kind and carry no
    /// source, so an error chain printed with `{:#}` says it once; others nest as `Entry`.
    pub(crate) fn context(self, what: impl std::fmt::Display) -> Self {
        let prefixed = |message: String| format!("{what}: {message}");
        match self {
            Self::NotFound(m) => Self::NotFound(prefixed(m)),
            Self::Invalid(m) => Self::Invalid(prefixed(m)),
            Self::Hub(m) => Self::Hub(prefixed(m)),
            Self::Integrity(m) => Self::Integrity(prefixed(m)),
            Self::Pip(m) => Self::Pip(prefixed(m)),
            other => Self::Entry {
                what: what.to_string(),
                source: Box::new(other),
            },
        }
    }
}

/// `Result` with [`FetchError`].
pub type Result<T> = std::result::Result<T, FetchError>;

/// Names the file operation an I/O error came from.
pub(crate) trait IoContext<T> {
    fn at(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| FetchError::Io {
            what: what(),
            source,
        })
    }
}

impl<T> IoContext<T> for zip::result::ZipResult<T> {
    fn at(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| FetchError::Zip {
            what: what(),
            source,
        })
    }
}
