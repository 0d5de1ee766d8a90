//! `ApiError`: the one place where failures become HTTP responses, with OpenAI's body
//! `{"error": {"message", "type", "param", "code"}}`. Client mistakes are 4xx and logged at debug
//! level; only internal failures are 500s and logged as errors.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use triage_engine::EngineError;
use triage_host::{ErrorKind, HostError};

/// A host error as a response: its kind picks the status (the one rule, in `triage-host`);
/// a sampling error names its parameter, an overflow says so in `code`, a missing corpus says
/// how to make one.
impl From<HostError> for ApiError {
    fn from(e: HostError) -> Self {
        if let Some(name) = e.unknown_corpus() {
            return Self::corpus_not_found(name);
        }
        match e.engine_error() {
            Some(EngineError::InvalidSampling { param, message }) => {
                return Self::invalid_param(param, message.clone())
            }
            Some(overflow @ EngineError::ContextOverflow { .. }) => {
                return Self {
                    code: Some("context_length_exceeded"),
                    ..Self::invalid_param("max_tokens", overflow.to_string())
                }
            }
            _ => {}
        }
        let message = e.to_string();
        match e.kind() {
            ErrorKind::Caller => Self::invalid(message),
            ErrorKind::NotFound => Self::new(StatusCode::NOT_FOUND, message),
            ErrorKind::Conflict => Self {
                code: Some("conflict"),
                ..Self::new(StatusCode::CONFLICT, message)
            },
            ErrorKind::TooLarge => Self {
                code: Some("corpus_too_large"),
                ..Self::new(StatusCode::PAYLOAD_TOO_LARGE, message)
            },
            ErrorKind::Overloaded => Self {
                code: Some("overloaded"),
                ..Self::new(StatusCode::TOO_MANY_REQUESTS, message)
            },
            // The host's internal errors name files (a corpus's index, a model's path): they are
            // logged whole, and the client is told only that the server failed.
            ErrorKind::Internal => {
                tracing::error!(%message, "internal error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal server error; the server log has the details",
                )
            }
        }
    }
}

/// An error answer to an HTTP request.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400: the request is malformed or asks for something invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 naming the offending parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::invalid(message)
        }
    }

    pub fn model_not_found(model: &str, known: &[String]) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("The model `{model}` does not exist; this server has {known:?}"),
            )
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "Missing or incorrect API key: send `Authorization: Bearer <key>`",
            )
        }
    }

    pub fn queue_full(model: &str, limit: usize) -> Self {
        Self {
            code: Some("queue_full"),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("model `{model}` already holds {limit} requests; retry later"),
            )
        }
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("no route for {path}"))
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed on this route",
        )
    }

    /// 415: a body not declared `application/json`.
    pub fn unsupported_media_type() -> Self {
        Self {
            code: Some("unsupported_media_type"),
            ..Self::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the request body as JSON with `Content-Type: application/json`",
            )
        }
    }

    /// 421: a `Host` header that does not name this server.
    pub fn misdirected(host: &str) -> Self {
        Self {
            code: Some("misdirected_request"),
            ..Self::new(
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "this server does not answer to the host {host:?}; add it to allowed_hosts"
                ),
            )
        }
    }

    /// 408: the body did not arrive in time.
    pub fn body_timeout(seconds: u64) -> Self {
        Self {
            code: Some("request_timeout"),
            ..Self::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {seconds} s"),
            )
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500: our fault. Logged here, once.
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        tracing::error!(%message, "internal error");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// An error from the body-reading layer (too large → 413, unreadable → 400).
    pub fn from_body_rejection(status: StatusCode, message: String) -> Self {
        Self {
            code: (status == StatusCode::PAYLOAD_TOO_LARGE).then_some("request_too_large"),
            ..Self::new(status, message)
        }
    }

    /// An engine error for a request being added (see [`ApiError::from`] for a host error).
    pub fn from_admission(error: EngineError) -> Self {
        HostError::from(error).into()
    }

    fn corpus_not_found(name: &str) -> Self {
        Self {
            param: Some("corpus".into()),
            code: Some("corpus_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("no corpus named {name:?}; create it with POST /v1/corpora"),
            )
        }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::NOT_FOUND => "not_found_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The OpenAI error object.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_client_error() {
            tracing::debug!(status = %self.status, message = %self.message, "client error");
        }
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_admission_errors_are_client_errors_with_params() {
        let e = ApiError::from_admission(EngineError::InvalidSampling {
            param: "top_p",
            message: "must be in (0, 1]".into(),
        });
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.body()["error"]["param"], "top_p");
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
        let e = ApiError::from_admission(EngineError::ContextOverflow {
            prompt_tokens: 10,
            max_tokens: 5,
            context_length: 12,
        });
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.body()["error"]["code"], "context_length_exceeded");
    }

    /// The pipeline's errors take the same statuses as a plain request's: an overflow inside
    /// a routed answer is the caller's 400, not a 500.
    #[test]
    fn pipeline_errors_take_their_kinds_status() {
        use triage_retrieval::RetrievalError;
        use triage_router::RouterError;
        let overflow = RouterError::Engine(EngineError::ContextOverflow {
            prompt_tokens: 10,
            max_tokens: 5,
            context_length: 12,
        });
        let e = ApiError::from(HostError::from(overflow));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.body()["error"]["code"], "context_length_exceeded");
        let missing = RouterError::Retrieval(RetrievalError::UnknownCorpus("docs".into()));
        let e = ApiError::from(HostError::from(missing));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.body()["error"]["code"], "corpus_not_found");
        let e = ApiError::from(HostError::CorpusExists("docs".into()));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = ApiError::from(HostError::EmbedderMismatch {
            corpus: "docs".into(),
            corpus_embedder: "minilm-l6:384:256".into(),
            embedder: "other:768:512".into(),
        });
        assert_eq!(e.status, StatusCode::CONFLICT);
        let e = ApiError::from(HostError::from(RetrievalError::Busy("docs".into())));
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body()["error"]["code"], "overloaded");
        let e = ApiError::from(HostError::TooLarge(
            "corpus \"docs\" would hold 3000 bytes".into(),
        ));
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(e.body()["error"]["code"], "corpus_too_large");
        let e = ApiError::from(HostError::Invalid("no such document".into()));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.body()["error"]["message"], "no such document");
        let e = ApiError::from(HostError::Internal("lock poisoned".into()));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.body()["error"]["type"], "server_error");
        // No server path reaches the client.
        let io = RetrievalError::Io {
            path: "/srv/triage/corpora/docs/gen-000002/vectors.bin".into(),
            source: std::io::Error::other("disk on fire"),
        };
        for e in [
            HostError::from(io),
            HostError::Load {
                what: "/srv/models/secret.gguf".into(),
                message: "truncated".into(),
            },
        ] {
            let body = ApiError::from(e).body().to_string();
            assert!(!body.contains("/srv"), "{body}");
        }
    }
}
