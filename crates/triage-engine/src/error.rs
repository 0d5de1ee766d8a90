//! The error type of `triage-engine`.

/// Errors from generation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("ops: {0}")]
    Ops(#[from] triage_ops::OpsError),
    #[error("model: {0}")]
    Model(#[from] triage_models::ModelError),
    #[error("invalid sampling parameter {param}: {message}")]
    InvalidSampling {
        param: &'static str,
        message: String,
    },
    #[error("prompt of {prompt_tokens} tokens (+{max_tokens} to generate) exceeds the context length {context_length}")]
    ContextOverflow {
        prompt_tokens: usize,
        max_tokens: usize,
        context_length: usize,
    },
    #[error("{0}")]
    Invalid(String),
    /// An admitted request failed inside the engine (it ended with `FinishReason::Error`); not
    /// the caller's fault.
    #[error("generation failed: {0}")]
    RequestFailed(String),
}

/// `Result` with [`EngineError`].
pub type Result<T> = std::result::Result<T, EngineError>;
