//! The error type of `triage-ops`.

/// Errors from the custom ops.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A captured step (`step_graph`) failed in a layer above the ops.
    #[error("captured step: {0}")]
    Step(String),
    #[error("triage-ops was not compiled with the cuda feature")]
    NotCompiledWithCuda,
}

/// `Result` with [`OpsError`].
pub type Result<T> = std::result::Result<T, OpsError>;
