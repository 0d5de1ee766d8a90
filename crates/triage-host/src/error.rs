//! `HostError` and its [`ErrorKind`]: the one rule for whose fault a failure is. The server maps
//! a kind to an HTTP status, the CLI to an exit code.

use triage_engine::EngineError;
use triage_fetch::FetchError;
use triage_retrieval::RetrievalError;
use triage_router::RouterError;

/// Whose fault a failure is, and so what a client should do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request or the config asks for something invalid: fix it and retry (HTTP 400).
    Caller,
    /// A named thing (corpus, model file, data set) does not exist (HTTP 404).
    NotFound,
    /// What is stored contradicts the configuration (a corpus embedded with another embedder
    /// than the host's) (HTTP 409).
    Conflict,
    /// Busy now (another writer holds the corpus): retry later (HTTP 429).
    Overloaded,
    /// Over a configured size limit (a corpus's bytes): send less (HTTP 413).
    TooLarge,
    /// The engine failed (HTTP 500).
    Internal,
}

impl ErrorKind {
    /// The process exit code the CLI uses: 1 for internal failures (as any crash), 2 for the
    /// caller's mistakes (as clap's usage errors), then 3, 4 and 5.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Internal => 1,
            Self::Caller | Self::TooLarge => 2,
            Self::NotFound => 3,
            Self::Conflict => 4,
            Self::Overloaded => 5,
        }
    }
}

/// Errors of the host, and of the library API built on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    #[error("config: {0}")]
    Config(String),
    #[error("loading {what}: {message}")]
    Load { what: String, message: String },
    #[error("no corpus named {0:?}")]
    UnknownCorpus(String),
    #[error("corpus {0:?} already exists")]
    CorpusExists(String),
    #[error("corpus {corpus:?} was embedded with {corpus_embedder}, the engine's embedder is {embedder}")]
    EmbedderMismatch {
        corpus: String,
        corpus_embedder: String,
        embedder: String,
    },
    /// The caller's mistake not covered above.
    #[error("{0}")]
    Invalid(String),
    /// A change that would take a corpus past its configured size.
    #[error("{0}")]
    TooLarge(String),
    /// The host's own failure (a poisoned lock).
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Router(#[from] RouterError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Retrieval(#[from] RetrievalError),
    #[error(transparent)]
    Model(#[from] triage_models::ModelError),
}

/// `Result` with [`HostError`].
pub type Result<T> = std::result::Result<T, HostError>;

impl HostError {
    /// Whose fault this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            // A name taken is the request's mistake (a 400, as OpenAI answers a duplicate).
            Self::Config(_) | Self::Invalid(_) | Self::CorpusExists(_) => ErrorKind::Caller,
            Self::UnknownCorpus(_) => ErrorKind::NotFound,
            Self::TooLarge(_) => ErrorKind::TooLarge,
            Self::EmbedderMismatch { .. } => ErrorKind::Conflict,
            Self::Load { .. } | Self::Internal(_) | Self::Model(_) => ErrorKind::Internal,
            Self::Fetch(e) => fetch_kind(e),
            Self::Router(e) => router_kind(e),
            Self::Engine(e) => engine_kind(e),
            Self::Retrieval(e) => retrieval_kind(e),
        }
    }

    /// Whether the caller is at fault (bad input, or a name that does not exist) rather than
    /// the engine.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::Caller | ErrorKind::NotFound | ErrorKind::Conflict | ErrorKind::TooLarge
        )
    }

    /// The engine error inside, when there is one (the server names the parameter of a
    /// sampling error and the context length of an overflow).
    pub fn engine_error(&self) -> Option<&EngineError> {
        match self {
            Self::Engine(e) | Self::Router(RouterError::Engine(e)) => Some(e),
            _ => None,
        }
    }

    /// The corpus that does not exist, when that is the failure.
    pub fn unknown_corpus(&self) -> Option<&str> {
        match self {
            Self::UnknownCorpus(name)
            | Self::Retrieval(RetrievalError::UnknownCorpus(name))
            | Self::Router(RouterError::Retrieval(RetrievalError::UnknownCorpus(name))) => {
                Some(name)
            }
            _ => None,
        }
    }
}

/// The kind of `error` when it is one of the library's errors (a host, engine, router,
/// retrieval or fetch error); what a caller holding a type-erased error (the CLI's) maps.
pub fn error_kind(error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
    if let Some(e) = error.downcast_ref::<HostError>() {
        return Some(e.kind());
    }
    if let Some(e) = error.downcast_ref::<EngineError>() {
        return Some(engine_kind(e));
    }
    if let Some(e) = error.downcast_ref::<RouterError>() {
        return Some(router_kind(e));
    }
    if let Some(e) = error.downcast_ref::<RetrievalError>() {
        return Some(retrieval_kind(e));
    }
    error.downcast_ref::<FetchError>().map(fetch_kind)
}

/// A request's parameters, a prompt beyond the context, a chat the template cannot render:
/// the caller's. Tensor and kernel failures, and an admitted request that failed inside the
/// engine: the engine's.
fn engine_kind(e: &EngineError) -> ErrorKind {
    match e {
        EngineError::Candle(_) | EngineError::Ops(_) | EngineError::RequestFailed(_) => {
            ErrorKind::Internal
        }
        _ => ErrorKind::Caller,
    }
}

fn router_kind(e: &RouterError) -> ErrorKind {
    match e {
        RouterError::Invalid(_) => ErrorKind::Caller,
        RouterError::Engine(e) => engine_kind(e),
        RouterError::Retrieval(e) => retrieval_kind(e),
        _ => ErrorKind::Internal,
    }
}

fn retrieval_kind(e: &RetrievalError) -> ErrorKind {
    match e {
        RetrievalError::UnknownCorpus(_) => ErrorKind::NotFound,
        RetrievalError::Busy(_) => ErrorKind::Overloaded,
        RetrievalError::Invalid(_) | RetrievalError::BadDocument { .. } => ErrorKind::Caller,
        _ => ErrorKind::Internal,
    }
}

fn fetch_kind(e: &FetchError) -> ErrorKind {
    match e {
        FetchError::NotFound(_) => ErrorKind::NotFound,
        FetchError::Invalid(_) => ErrorKind::Caller,
        FetchError::Entry { source, .. } => fetch_kind(source),
        _ => ErrorKind::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one table of whose fault an error is; the server's statuses and the CLI's exit
    /// codes follow from it.
    #[test]
    fn every_error_has_the_kind_its_cause_implies() {
        let overflow = || EngineError::ContextOverflow {
            prompt_tokens: 900,
            max_tokens: 200,
            context_length: 1024,
        };
        let cases: Vec<(HostError, ErrorKind)> = vec![
            (HostError::Config("x".into()), ErrorKind::Caller),
            (HostError::Invalid("x".into()), ErrorKind::Caller),
            (overflow().into(), ErrorKind::Caller),
            (RouterError::Engine(overflow()).into(), ErrorKind::Caller),
            (
                EngineError::InvalidSampling {
                    param: "temperature",
                    message: "negative".into(),
                }
                .into(),
                ErrorKind::Caller,
            ),
            (RouterError::Invalid("x".into()).into(), ErrorKind::Caller),
            (
                RetrievalError::Invalid("empty query".into()).into(),
                ErrorKind::Caller,
            ),
            (HostError::UnknownCorpus("c".into()), ErrorKind::NotFound),
            (
                RetrievalError::UnknownCorpus("c".into()).into(),
                ErrorKind::NotFound,
            ),
            (
                RouterError::Retrieval(RetrievalError::UnknownCorpus("c".into())).into(),
                ErrorKind::NotFound,
            ),
            (
                FetchError::NotFound("not fetched".into()).into(),
                ErrorKind::NotFound,
            ),
            (
                FetchError::Entry {
                    what: "fetching m".into(),
                    source: Box::new(FetchError::Pip("failed".into())),
                }
                .into(),
                ErrorKind::Internal,
            ),
            (HostError::CorpusExists("c".into()), ErrorKind::Caller),
            (
                RetrievalError::Busy("c".into()).into(),
                ErrorKind::Overloaded,
            ),
            (
                HostError::EmbedderMismatch {
                    corpus: "c".into(),
                    corpus_embedder: "a".into(),
                    embedder: "b".into(),
                },
                ErrorKind::Conflict,
            ),
            (
                HostError::Load {
                    what: "m".into(),
                    message: "bad file".into(),
                },
                ErrorKind::Internal,
            ),
            (
                RetrievalError::Index("broken".into()).into(),
                ErrorKind::Internal,
            ),
            (HostError::TooLarge("x".into()), ErrorKind::TooLarge),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error:?}");
            assert_eq!(
                error.is_client_error(),
                !matches!(kind, ErrorKind::Internal | ErrorKind::Overloaded),
                "{error:?}"
            );
        }
        let codes: Vec<u8> = [
            ErrorKind::Internal,
            ErrorKind::Caller,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::Overloaded,
        ]
        .iter()
        .map(|k| k.exit_code())
        .collect();
        assert_eq!(codes, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_missing_corpus_is_named_wherever_it_came_from() {
        let nested: HostError =
            RouterError::Retrieval(RetrievalError::UnknownCorpus("docs".into())).into();
        assert_eq!(nested.unknown_corpus(), Some("docs"));
        assert_eq!(HostError::Invalid("x".into()).unknown_corpus(), None);
    }
}
