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

/// A refused fit is the caller's data at fault, as it was when the fits lived here.
impl From<triage_types::linear::FitError> for RouterError {
    fn from(e: triage_types::linear::FitError) -> Self {
        Self::Invalid(e.0)
    }
}
