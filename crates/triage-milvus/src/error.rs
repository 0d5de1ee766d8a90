//! The error type of `triage-milvus`.

/// Errors from talking to Milvus.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MilvusError {
    #[error("milvus at {uri}: {message}")]
    Connect { uri: String, message: String },
    #[error("milvus: {what}: {source}")]
    Request {
        what: &'static str,
        // Boxed: the SDK's error is large, and every `Result` here would carry its size.
        source: Box<milvus::v2::error::Error>,
    },
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
}

/// `Result` with [`MilvusError`].
pub type Result<T> = std::result::Result<T, MilvusError>;

impl From<MilvusError> for triage_retrieval::RetrievalError {
    fn from(e: MilvusError) -> Self {
        triage_retrieval::RetrievalError::Index(e.to_string())
    }
}

/// Label a Milvus call's error with what was being done.
pub(crate) fn during<T>(
    what: &'static str,
    r: std::result::Result<T, milvus::v2::error::Error>,
) -> Result<T> {
    r.map_err(|source| MilvusError::Request {
        what,
        source: Box::new(source),
    })
}

/// Building a request (the SDK validates it) or decoding a response.
impl From<milvus::v2::error::Error> for MilvusError {
    fn from(source: milvus::v2::error::Error) -> Self {
        MilvusError::Request {
            what: "request",
            source: Box::new(source),
        }
    }
}
