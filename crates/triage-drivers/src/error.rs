//! `DriverError`: what a driver's failure was, worded as the command line has always printed
//! it, and the [`ErrorKind`] of a library error inside, which the CLI turns into an exit code.

use triage_host::ErrorKind;

/// Errors of the drivers. A library error passes through unchanged (its message and its
/// sources are the library's); the driver's own failures say what it was doing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// A failure the driver itself reports: a setting or an input it refuses, a fit that
    /// failed, a result missing that should be there (the message says which).
    #[error("{0}")]
    Invalid(String),
    /// A file or folder the driver could not read, write or create; `context` names it
    /// ("writing /x/report.md").
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A failure of a helper crate (a file that is not the JSON expected, a TOML writer), with
    /// what the driver was doing.
    #[error("{context}")]
    Other {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Another failure, with what the driver was doing when it happened.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<DriverError>,
    },
    #[error(transparent)]
    Host(#[from] triage_host::HostError),
    #[error(transparent)]
    Eval(#[from] triage_eval::EvalError),
    #[error(transparent)]
    Router(#[from] triage_router::RouterError),
    #[error(transparent)]
    Retrieval(#[from] triage_retrieval::RetrievalError),
    #[error(transparent)]
    Engine(#[from] triage_engine::EngineError),
    #[error(transparent)]
    Model(#[from] triage_models::ModelError),
    #[error(transparent)]
    Fetch(#[from] triage_fetch::FetchError),
    #[error(transparent)]
    Milvus(#[from] triage_milvus::MilvusError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// A policy's failure (a refused fit, an unreadable policy file) is the router's `Invalid`, as it
/// was when the policies lived in triage-router: the same message and the same exit code.
impl From<triage_policy::PolicyError> for DriverError {
    fn from(e: triage_policy::PolicyError) -> Self {
        Self::Router(e.into())
    }
}

/// `Result` with [`DriverError`].
pub type Result<T> = std::result::Result<T, DriverError>;

impl DriverError {
    /// The kind of the library error inside (whose fault the failure is), as
    /// [`triage_host::error_kind`] judges it; none for the driver's own failures, which the
    /// command line reports as internal (exit code 1).
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Invalid(_) | Self::Io { .. } | Self::Other { .. } => None,
            Self::Context { source, .. } => source.kind(),
            Self::Host(e) => Some(e.kind()),
            Self::Eval(e) => triage_host::error_kind(e),
            Self::Router(e) => triage_host::error_kind(e),
            Self::Retrieval(e) => triage_host::error_kind(e),
            Self::Engine(e) => triage_host::error_kind(e),
            Self::Model(e) => triage_host::error_kind(e),
            Self::Fetch(e) => triage_host::error_kind(e),
            Self::Milvus(e) => triage_host::error_kind(e),
            Self::Candle(e) => triage_host::error_kind(e),
            Self::Json(e) => triage_host::error_kind(e),
        }
    }

    /// The message with its sources after it, joined by ": " (as the command line prints a
    /// failure).
    pub fn with_sources(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(e) = source {
            text.push_str(": ");
            text.push_str(&e.to_string());
            source = e.source();
        }
        text
    }
}

/// Fails with [`DriverError::Invalid`] and a formatted message (the drivers' `bail!`).
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::DriverError::Invalid(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// Adds what the driver was doing to a failure (the drivers' `with_context`).
pub(crate) trait Context<T> {
    fn with_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<DriverError>> Context<T> for std::result::Result<T, E> {
    fn with_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| DriverError::Context {
            context: context(),
            source: Box::new(e.into()),
        })
    }
}

/// An I/O failure on `path`, said as "`verb` `path`" ("writing /x/report.md").
pub(crate) fn io(
    verb: &str,
    path: impl AsRef<std::path::Path>,
) -> impl FnOnce(std::io::Error) -> DriverError {
    let context = format!("{verb} {}", path.as_ref().display());
    move |source| DriverError::Io { context, source }
}

/// A fit that failed (too few answers, one class only), as its message says: the solvers'
/// error carries no source.
pub(crate) fn fit_error(e: impl std::error::Error) -> DriverError {
    DriverError::Invalid(e.to_string())
}

/// An I/O failure while doing `context` ("creating a scratch corpus store").
pub(crate) fn io_doing(context: &str) -> impl FnOnce(std::io::Error) -> DriverError + '_ {
    move |source| DriverError::Io {
        context: context.to_string(),
        source,
    }
}

/// Another crate's failure while doing `context` (parsing a file, writing TOML).
pub(crate) fn other<E: std::error::Error + Send + Sync + 'static>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> DriverError {
    let context = context.into();
    move |source| DriverError::Other {
        context,
        source: Box::new(source),
    }
}
