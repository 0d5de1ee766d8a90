//! What a `/v1` request must show before a handler sees it, so that a web page cannot drive a
//! server on loopback: a body only as `application/json` (a page may send `text/plain` or a
//! form cross-site without a CORS preflight, never JSON, and this server grants no CORS), and a
//! `Host` header that names this server (DNS rebinding points the page's own domain at
//! 127.0.0.1 to read the answers).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api_error::ApiError;
use crate::app::AppState;

/// Whether the request carries a body (a length above zero, or chunked).
fn has_body(request: &Request) -> bool {
    let headers = request.headers();
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    length.is_some_and(|n| n > 0) || headers.contains_key(header::TRANSFER_ENCODING)
}

/// `application/json`, any parameters (`; charset=utf-8`), any case.
fn is_json(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// 415 for a body that is not declared JSON; 421 for a `Host` this server does not answer to
/// (400 without one).
pub async fn same_origin_only(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if has_body(&request) && !is_json(&request) {
        return ApiError::unsupported_media_type().into_response();
    }
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    match host {
        None => return ApiError::invalid("the request has no Host header").into_response(),
        Some(host) if !state.config.server.allows_host(&host) => {
            return ApiError::misdirected(&host).into_response()
        }
        Some(_) => {}
    }
    next.run(request).await
}
