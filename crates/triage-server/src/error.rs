//! Errors of the server library itself (configuration, binding, engine start-up); what HTTP
//! clients see is `ApiError`.

/// Errors from setting up or running the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("config: {0}")]
    Config(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("engine: {0}")]
    Engine(#[from] triage_engine::EngineError),
    #[error(transparent)]
    Host(#[from] triage_host::HostError),
}

/// `Result` with [`ServerError`].
pub type Result<T> = std::result::Result<T, ServerError>;
