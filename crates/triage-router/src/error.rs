//! The error type of `triage-router`.

/// Errors from routing stages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouterError {
    #[error(transparent)]
    Engine(#[from] triage_engine::EngineError),
    #[error(transparent)]
    Model(#[from] triage_models::ModelError),
    #[error(transparent)]
    Retrieval(#[from] triage_retrieval::RetrievalError),
    #[error("{0}")]
    Invalid(String),
}

/// `Result` with [`RouterError`].
pub type Result<T> = std::result::Result<T, RouterError>;

/// A refused fit or an unreadable policy file is the caller's data at fault, as it was when the
/// policies lived here.
impl From<triage_policy::PolicyError> for RouterError {
    fn from(e: triage_policy::PolicyError) -> Self {
        Self::Invalid(e.to_string())
    }
}
