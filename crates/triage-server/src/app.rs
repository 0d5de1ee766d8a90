//! The HTTP application: routes, the API-key check, request counting, and `serve` with graceful
//! shutdown (stop accepting, let in-flight requests finish within a deadline, stop the engines).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::api_error::ApiError;
use crate::corpus_header::CorpusKey;
use crate::generation::{collect, stream_response, RequestTimer, Ticket};
use crate::guard;
use crate::loads::{worker_loads, WorkerLoads};
use crate::metrics::{Metrics, RequestLabels};
use crate::responses::{Endpoint, ResponseMeta};
use crate::routed;
use crate::routing::RoutingService;
use crate::wire::{ChatCompletionRequest, CommonParams, CompletionRequest};
use crate::worker::EngineWorker;
use triage_host::role_name;
use triage_host::TriageConfig;

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    pub workers: Vec<Arc<EngineWorker>>,
    /// The routing pipeline, answering chat completions addressed to its alias.
    pub routing: Option<Arc<RoutingService>>,
    pub metrics: Arc<Metrics>,
    pub config: TriageConfig,
    started: u64,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(config: TriageConfig, workers: Vec<EngineWorker>) -> Arc<Self> {
        Self::with_routing(config, workers.into_iter().map(Arc::new).collect(), None)
    }

    /// State whose workers may be shared with the routing pipeline.
    pub fn with_routing(
        config: TriageConfig,
        workers: Vec<Arc<EngineWorker>>,
        routing: Option<Arc<RoutingService>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            workers,
            routing,
            metrics: Arc::new(Metrics::default()),
            config,
            started: unix_now(),
            next_id: AtomicU64::new(1),
        })
    }

    fn worker(&self, model: &str) -> Result<&Arc<EngineWorker>, ApiError> {
        self.workers
            .iter()
            .find(|w| w.name == model)
            .ok_or_else(|| {
                let known: Vec<String> = self.workers.iter().map(|w| w.name.clone()).collect();
                ApiError::model_not_found(model, &known)
            })
    }

    fn response_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.started)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// All routes. `/v1/*` sits behind the API key when one is configured; `/health`, `/version`,
/// `/metrics` and `/v1/loads` (what a gateway polls, like the metrics) stay open.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(list_models))
        .route("/v1/route", post(route))
        .route("/v1/corpora", post(create_corpus).get(routed::list_corpora))
        .route(
            "/v1/corpora/{name}",
            get(routed::get_corpus).delete(routed::delete_corpus),
        )
        .route(
            "/v1/corpora/{name}/documents",
            post(add_documents)
                .get(routed::list_documents)
                .delete(delete_documents),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            guard::same_origin_only,
        ));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/v1/loads", get(loads))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.server.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            read_body_in_time,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// Equal-length byte strings compared without an early exit, so the time taken does not tell
/// how much of a guessed key was right (the length itself is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(key) = &state.config.server.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// Read the whole body within `body_timeout_s` (408 otherwise), so a client that trickles its
/// body cannot hold a handler; bodies past `max_body_bytes` are a 413 here already.
async fn read_body_in_time(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let settings = &state.config.server;
    let (parts, body) = request.into_parts();
    let deadline = Duration::from_secs(settings.body_timeout_s);
    let read = axum::body::to_bytes(body, settings.max_body_bytes);
    let bytes = match tokio::time::timeout(deadline, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return if too_large {
                ApiError::from_body_rejection(StatusCode::PAYLOAD_TOO_LARGE, e.to_string())
            } else {
                ApiError::invalid(format!("reading the request body: {e}"))
            }
            .into_response();
        }
        Err(_) => return ApiError::body_timeout(settings.body_timeout_s).into_response(),
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

async fn count_requests(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let response = next.run(request).await;
    let labels = RequestLabels {
        endpoint,
        status: response.status().as_u16(),
    };
    state.metrics.requests.get_or_create(&labels).inc();
    response
}

/// The body as `T`, or a 4xx: too large (413), not JSON or the wrong shape (400).
fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| ApiError::from_body_rejection(r.status(), r.body_text()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))
}

/// `GET /version`, as vLLM's server answers it; gateways (SMG) read it to tell an
/// OpenAI-compatible engine from another kind of worker.
async fn version() -> Json<serde_json::Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

/// `GET /v1/loads` (any query string): the load SMG polls to spill a busy replica's keys.
async fn loads(State(state): State<Arc<AppState>>) -> Json<WorkerLoads> {
    Json(worker_loads(&state.workers))
}

/// 200 while every engine thread runs; 503 naming the models whose engine has stopped (a load
/// balancer then takes this replica out).
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let models: Vec<&str> = state.workers.iter().map(|w| w.name.as_str()).collect();
    let stopped: Vec<&str> = state
        .workers
        .iter()
        .filter(|w| !w.is_alive())
        .map(|w| w.name.as_str())
        .collect();
    if stopped.is_empty() {
        return Json(json!({"status": "ok", "models": models})).into_response();
    }
    let body = json!({"status": "unavailable", "models": models, "stopped": stopped});
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let prefixes = state
        .routing
        .as_ref()
        .map(|r| r.resident_prefixes())
        .unwrap_or_default();
    let text = state.metrics.render(&state.workers, &prefixes);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The served models, then the pipeline's alias (a `model` value clients may send, as a
/// vLLM user expects of every accepted name; gateways that register models from this list
/// then route `"model": "triage"` too).
async fn list_models(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let pipeline = state.routing.as_ref().map(|r| {
        json!({
            "id": r.alias,
            "object": "model",
            "created": state.started,
            "owned_by": "triage",
            "triage": {"role": "pipeline"},
        })
    });
    let data: Vec<serde_json::Value> = state
        .workers
        .iter()
        .map(|w| {
            json!({
                "id": w.name,
                "object": "model",
                "created": state.started,
                "owned_by": "triage",
                "max_model_len": w.model.context_length(),
                "triage": {"role": role_name(w.role)},
            })
        })
        .chain(pipeline)
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: ChatCompletionRequest = parse_body(body)?;
    if let Some(routing) = &state.routing {
        if request.common.model == routing.alias {
            let id = state.response_id("chatcmpl");
            let key = CorpusKey::from_headers(&headers)?;
            return routed::chat(state.clone(), request, key, id, unix_now()).await;
        }
    }
    state.worker(&request.common.model)?;
    let endpoint = Endpoint::Chat {
        logprobs: request.logprobs,
    };
    let generate = request.to_generate()?;
    run(&state, &request.common, endpoint, "chatcmpl", generate).await
}

async fn route(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = CorpusKey::from_headers(&headers)?;
    routed::route(state, parse_body(body)?, key).await
}

async fn create_corpus(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: routed::CreateCorpus = parse_body(body)?;
    same_corpus(&headers, &body.name)?;
    routed::create_corpus(state, body).await
}

/// A request about corpus `name` whose `x-triage-corpus` header names another is refused: the
/// gateway routed it by a key other than what it changes.
fn same_corpus(headers: &HeaderMap, name: &str) -> Result<(), ApiError> {
    let key = CorpusKey::from_headers(headers)?;
    crate::corpus_header::corpus_name(key.as_ref(), Some(name)).map(|_| ())
}

/// The corpus name in the path, or a 400 in OpenAI's shape (not a bad percent-encoding's
/// plain-text rejection).
pub(crate) fn corpus_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(name)| name)
        .map_err(|e| ApiError::invalid_param("name", format!("the corpus name: {}", e.body_text())))
}

async fn add_documents(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let name = corpus_name(path)?;
    same_corpus(&headers, &name)?;
    routed::add_documents(state, name, parse_body(body)?).await
}

async fn delete_documents(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let name = corpus_name(path)?;
    same_corpus(&headers, &name)?;
    routed::delete_documents(state, name, parse_body(body)?).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse_body(body)?;
    state.worker(&request.common.model)?;
    let endpoint = Endpoint::Completion {
        logprobs: request.logprobs.is_some(),
    };
    let generate = request.to_generate()?;
    run(&state, &request.common, endpoint, "cmpl", generate).await
}

/// Admit the request to its model's engine, then stream or collect the answer.
async fn run(
    state: &Arc<AppState>,
    common: &CommonParams,
    endpoint: Endpoint,
    id_prefix: &str,
    generate: triage_engine::GenerateRequest,
) -> Result<Response, ApiError> {
    let worker = state.worker(&common.model)?.clone();
    if !worker.is_alive() {
        return Err(ApiError::unavailable(format!(
            "the engine of model `{}` has stopped; retry on another replica",
            worker.name
        )));
    }
    let ticket = Ticket::take(&worker, state.config.server.max_pending_requests)?;
    let timer = RequestTimer::new(state.metrics.clone(), &worker.name);
    let rx = worker
        .submit(generate)
        .await
        .map_err(ApiError::from_admission)?;
    let meta = ResponseMeta {
        id: state.response_id(id_prefix),
        created: unix_now(),
        model: worker.name.clone(),
        endpoint,
    };
    if common.stream {
        let include_usage = common.include_usage();
        return Ok(stream_response(
            rx,
            timer,
            meta,
            worker,
            include_usage,
            ticket,
        ));
    }
    let response = collect(rx, timer, &meta, &worker).await;
    drop(ticket);
    response
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Serve until `shutdown` resolves; then stop accepting, give in-flight requests
/// `shutdown_timeout_s` to finish, cancel whatever is left and stop the engine threads.
///
/// Connections are served by hyper directly (not `axum::serve`) for what a server facing slow
/// or hostile clients needs: a header timeout that also closes idle kept-alive connections,
/// and at most `max_connections` connections at once.
pub async fn serve(
    state: Arc<AppState>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let settings = state.config.server.clone();
    let permits = Arc::new(Semaphore::new(settings.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(settings.header_timeout_s))
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    drop(listener);
    let deadline = Duration::from_secs(settings.shutdown_timeout_s);
    let timed_out = tokio::time::timeout(deadline, graceful.shutdown())
        .await
        .is_err();
    if timed_out {
        tracing::warn!("shutdown deadline passed with requests in flight; cancelling them");
    }
    let workers = state.workers.clone();
    let _ = tokio::task::spawn_blocking(move || {
        for w in &workers {
            w.shutdown(timed_out);
        }
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn keys_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret!"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
