//! The routing pipeline over HTTP: chat completions addressed to the pipeline's alias (with the
//! `triage` request extension), `POST /v1/route`, and `/v1/corpora`. The pipeline blocks, so it
//! runs on tokio's blocking pool; a streamed answer starts once the pipeline has announced its
//! path (which the `x-triage-route` header carries), and the decision record rides in the last
//! chunk.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use triage_retrieval::Document;
use triage_router::{Answer, AnswerEvent, AskRequest, Route, RoutePath};

use crate::api_error::ApiError;
use crate::app::AppState;
use crate::corpus_header::{self, with_corpus, CorpusKey};
use crate::generation::Ticket;
use crate::routing::RoutingService;
use crate::wire::ChatCompletionRequest;
use triage_host::{DocumentsChange, HostError};

/// The response header naming the path that answered.
pub const ROUTE_HEADER: &str = "x-triage-route";

/// The `triage` object of a request: which corpus (or the `x-triage-corpus` header's), and
/// per-request overrides.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriageExtension {
    #[serde(default)]
    pub corpus: Option<String>,
    #[serde(default)]
    pub route: Option<String>,
    #[serde(default)]
    pub tau: Option<f32>,
}

fn service(state: &AppState) -> Result<Arc<RoutingService>, ApiError> {
    state.routing.clone().ok_or_else(|| {
        ApiError::invalid("routing is not enabled on this server (no model with role \"base\")")
    })
}

/// The body's `triage` object (none is an empty one) with its corpus resolved against the
/// `x-triage-corpus` header.
fn extension(
    value: Option<&serde_json::Value>,
    header: Option<&CorpusKey>,
) -> Result<TriageExtension, ApiError> {
    let mut ext: TriageExtension = match value {
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
            ApiError::invalid_param("triage", format!("invalid `triage` object: {e}"))
        })?,
        None => TriageExtension::default(),
    };
    ext.corpus = Some(corpus_header::corpus_name(header, ext.corpus.as_deref())?);
    Ok(ext)
}

fn ask_request(
    ext: TriageExtension,
    question: String,
    max_tokens: Option<usize>,
) -> Result<AskRequest, ApiError> {
    let corpus = ext
        .corpus
        .ok_or_else(|| ApiError::invalid_param("triage", "the pipeline needs a corpus"))?;
    let route = match &ext.route {
        Some(r) => r
            .parse::<Route>()
            .map_err(|e| ApiError::invalid_param("triage.route", e.to_string()))?,
        None => Route::Auto,
    };
    if ext.tau.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
        return Err(ApiError::invalid_param(
            "triage.tau",
            "tau must be a finite number >= 0",
        ));
    }
    if question.trim().is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "the pipeline needs a non-empty last user message",
        ));
    }
    Ok(AskRequest {
        corpus,
        question,
        route,
        tau: ext.tau,
        max_tokens,
    })
}

/// What the blocking pipeline sends back to a handler.
enum Message {
    Event(AnswerEvent),
    Done(Box<Result<Answer, ApiError>>),
}

/// Sets its flag when dropped: held by whatever serves the answer (the handler, or the SSE
/// stream), so a client that goes away stops the pipeline at its next token.
pub struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Run the pipeline on the blocking pool, holding `ticket` until it is done.
fn spawn_ask(
    service: Arc<RoutingService>,
    request: AskRequest,
    ticket: Ticket,
) -> (mpsc::UnboundedReceiver<Message>, CancelOnDrop) {
    let (tx, rx) = mpsc::unbounded_channel();
    let cancelled = Arc::new(AtomicBool::new(false));
    let flag = cancelled.clone();
    tokio::task::spawn_blocking(move || {
        let events = tx.clone();
        let result = service
            .host
            .ask_stream_until(&request, &flag, |e| {
                let _ = events.send(Message::Event(e));
            })
            .map_err(ApiError::from);
        drop(ticket);
        let _ = tx.send(Message::Done(Box::new(result)));
    });
    (rx, CancelOnDrop(cancelled))
}

/// A queue ticket on the pipeline's base model (429 beyond the limit, as plain requests get),
/// or a 503 while any of its models' engines has stopped.
fn admit(state: &AppState, service: &RoutingService) -> Result<Ticket, ApiError> {
    if let Some(dead) = service.workers.iter().find(|w| !w.is_alive()) {
        return Err(ApiError::unavailable(format!(
            "the engine of model `{}`, which the routing pipeline uses, has stopped; retry on \
             another replica",
            dead.name
        )));
    }
    let base = service
        .workers
        .first()
        .ok_or_else(|| ApiError::internal("the routing pipeline has no models"))?;
    Ticket::take(base, state.config.server.max_pending_requests)
}

fn usage_json(answer: &Answer) -> serde_json::Value {
    json!({
        "prompt_tokens": answer.usage.prompt_tokens,
        "completion_tokens": answer.usage.completion_tokens,
        "total_tokens": answer.usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": answer.usage.cached_prompt_tokens},
    })
}

fn triage_json(answer: &Answer) -> serde_json::Value {
    json!({"route": answer.decision, "usage": answer.usage, "timings": answer.timings})
}

fn with_route(mut response: Response, path: RoutePath) -> Response {
    response
        .headers_mut()
        .insert(ROUTE_HEADER, HeaderValue::from_static(path.as_str()));
    response
}

/// A chat completion answered by the pipeline.
/// The pipeline decodes greedily, one answer, without logprobs or stop strings: a request
/// asking otherwise is refused naming the parameter rather than silently answered differently.
fn refuse_unhonoured(request: &ChatCompletionRequest) -> Result<(), ApiError> {
    let c = &request.common;
    let greedy =
        "the routing pipeline decodes greedily; leave it out or set it to its neutral value";
    let checks: [(&str, bool, &str); 13] = [
        (
            "n",
            c.n.is_some_and(|n| n != 1),
            "the routing pipeline gives one answer",
        ),
        (
            "logprobs",
            request.logprobs,
            "the routing pipeline returns no logprobs",
        ),
        (
            "top_logprobs",
            request.top_logprobs.is_some(),
            "the routing pipeline returns no logprobs",
        ),
        (
            "stop",
            c.stop.is_some(),
            "the routing pipeline takes no stop strings",
        ),
        (
            "stop_token_ids",
            !c.stop_token_ids.is_empty(),
            "the routing pipeline takes no stop tokens",
        ),
        (
            "ignore_eos",
            c.ignore_eos,
            "the routing pipeline stops at the end of an answer",
        ),
        (
            "temperature",
            c.temperature.is_some_and(|t| t != 0.0),
            greedy,
        ),
        ("top_p", c.top_p.is_some_and(|p| p != 1.0), greedy),
        ("top_k", c.top_k.is_some_and(|k| k != 0), greedy),
        ("min_p", c.min_p.is_some_and(|p| p != 0.0), greedy),
        (
            "presence_penalty",
            c.presence_penalty.is_some_and(|p| p != 0.0),
            greedy,
        ),
        (
            "frequency_penalty",
            c.frequency_penalty.is_some_and(|p| p != 0.0),
            greedy,
        ),
        (
            "repetition_penalty",
            c.repetition_penalty.is_some_and(|p| p != 1.0),
            greedy,
        ),
    ];
    match checks.iter().find(|(_, asked, _)| *asked) {
        Some((param, _, why)) => Err(ApiError::invalid_param(param, *why)),
        None => Ok(()),
    }
}

pub async fn chat(
    state: Arc<AppState>,
    request: ChatCompletionRequest,
    header: Option<CorpusKey>,
    id: String,
    created: u64,
) -> Result<Response, ApiError> {
    let service = service(&state)?;
    refuse_unhonoured(&request)?;
    let ext = extension(request.triage.as_ref(), header.as_ref())?;
    let question = match request
        .messages
        .iter()
        .enumerate()
        .rev()
        .find(|(_, m)| m.role == "user")
    {
        Some((i, m)) => m.text(i)?,
        None => String::new(),
    };
    let max_tokens = request.max_tokens();
    let ask = ask_request(ext, question, max_tokens)?;
    let corpus = ask.corpus.clone();
    let model = service.alias.clone();
    let ticket = admit(&state, &service)?;
    let (mut rx, cancel) = spawn_ask(service, ask, ticket);
    if !request.common.stream {
        loop {
            match rx.recv().await {
                Some(Message::Event(_)) => continue,
                Some(Message::Done(result)) => {
                    let answer = (*result)?;
                    let body = json!({
                        "id": id, "object": "chat.completion", "created": created, "model": model,
                        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
                                     "message": {"role": "assistant", "content": answer.text}}],
                        "usage": usage_json(&answer),
                        "triage": triage_json(&answer),
                    });
                    let response = with_route(Json(body).into_response(), answer.decision.path);
                    let generation = answer.decision.corpus_generation;
                    return Ok(with_corpus(response, &corpus, generation));
                }
                None => return Err(ApiError::internal("the pipeline stopped without an answer")),
            }
        }
    }
    // Streaming: wait for the corpus generation and the path (or an error before them) so the
    // headers can carry them.
    let mut generation = None;
    let path = loop {
        match rx.recv().await {
            Some(Message::Event(AnswerEvent::Corpus { generation: g })) => generation = Some(g),
            Some(Message::Event(AnswerEvent::Route(path))) => break path,
            Some(Message::Done(result)) => {
                let answer = (*result)?;
                generation = answer.decision.corpus_generation;
                break answer.decision.path;
            }
            Some(Message::Event(AnswerEvent::Delta(_))) | None => {
                return Err(ApiError::internal("the pipeline sent text before its path"))
            }
        }
    };
    let include_usage = request.common.include_usage();
    let chunk = move |delta: serde_json::Value,
                      finish: Option<&str>,
                      extra: Option<serde_json::Value>| {
        let mut c = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
        });
        if let Some(extra) = extra {
            c["triage"] = extra;
        }
        c
    };
    let first = chunk(
        json!({"role": "assistant", "content": ""}),
        None,
        Some(json!({"path": path})),
    );
    let stream = sse_stream(rx, first, chunk, include_usage, cancel);
    let response = Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response();
    Ok(with_corpus(with_route(response, path), &corpus, generation))
}

type Chunk =
    dyn Fn(serde_json::Value, Option<&str>, Option<serde_json::Value>) -> serde_json::Value + Send;

fn sse_stream(
    rx: mpsc::UnboundedReceiver<Message>,
    first: serde_json::Value,
    chunk: impl Fn(serde_json::Value, Option<&str>, Option<serde_json::Value>) -> serde_json::Value
        + Send
        + 'static,
    include_usage: bool,
    cancel: CancelOnDrop,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let chunk: Box<Chunk> = Box::new(chunk);
    let queued: std::collections::VecDeque<String> = [first.to_string()].into();
    // The stream owns `cancel`: hyper drops the stream when the client goes away.
    stream::unfold(
        (rx, queued, false, chunk, cancel),
        move |(mut rx, mut queued, mut done, chunk, cancel)| async move {
            loop {
                if let Some(data) = queued.pop_front() {
                    let next = (rx, queued, done, chunk, cancel);
                    return Some((Ok(Event::default().data(data)), next));
                }
                if done {
                    return None;
                }
                match rx.recv().await {
                    Some(Message::Event(AnswerEvent::Delta(text))) if !text.is_empty() => {
                        queued.push_back(chunk(json!({"content": text}), None, None).to_string());
                    }
                    Some(Message::Event(_)) => {}
                    Some(Message::Done(result)) => {
                        match *result {
                            Ok(answer) => {
                                let last =
                                    chunk(json!({}), Some("stop"), Some(triage_json(&answer)));
                                queued.push_back(last.to_string());
                                if include_usage {
                                    let mut u = chunk(json!({}), None, None);
                                    u["choices"] = json!([]);
                                    u["usage"] = usage_json(&answer);
                                    queued.push_back(u.to_string());
                                }
                            }
                            // Headers are gone: the error travels as the stream's last event.
                            Err(e) => queued.push_back(e.body().to_string()),
                        }
                        queued.push_back("[DONE]".into());
                        done = true;
                    }
                    None => {
                        queued.push_back("[DONE]".into());
                        done = true;
                    }
                }
            }
        },
    )
}

/// `POST /v1/route`: the path a question would take first, without answering it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRequest {
    #[serde(default)]
    pub corpus: Option<String>,
    pub question: String,
    #[serde(default)]
    pub route: Option<String>,
    #[serde(default)]
    pub tau: Option<f32>,
}

pub async fn route(
    state: Arc<AppState>,
    body: RouteRequest,
    header: Option<CorpusKey>,
) -> Result<Response, ApiError> {
    let service = service(&state)?;
    let corpus = corpus_header::corpus_name(header.as_ref(), body.corpus.as_deref())?;
    let ask = ask_request(
        TriageExtension {
            corpus: Some(corpus.clone()),
            route: body.route,
            tau: body.tau,
        },
        body.question,
        None,
    )?;
    let ticket = admit(&state, &service)?;
    let record = tokio::task::spawn_blocking(move || {
        let record = service.host.plan(&ask);
        drop(ticket);
        record
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    let path = record.path;
    let generation = record.corpus_generation;
    let body = json!({"object": "triage.route", "path": path, "route": record});
    let response = with_route(Json(body).into_response(), path);
    Ok(with_corpus(response, &corpus, generation))
}

/// A document as clients send it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocumentIn {
    pub id: String,
    #[serde(default)]
    pub title: Option<String>,
    pub text: String,
}

fn documents(docs: Vec<DocumentIn>) -> Vec<Document> {
    docs.into_iter()
        .map(|d| Document {
            title: d.title.unwrap_or_else(|| d.id.clone()),
            id: d.id,
            text: d.text,
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCorpus {
    pub name: String,
    #[serde(default)]
    pub documents: Vec<DocumentIn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddDocuments {
    pub documents: Vec<DocumentIn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteDocuments {
    pub ids: Vec<String>,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, HostError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::from)
}

pub async fn create_corpus(state: Arc<AppState>, body: CreateCorpus) -> Result<Response, ApiError> {
    let service = service(&state)?;
    let docs = documents(body.documents);
    let change = blocking(move || service.host.create_corpus(&body.name, &docs)).await?;
    let mut response = change_response(&change);
    *response.status_mut() = StatusCode::CREATED;
    Ok(response)
}

pub async fn list_corpora(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let service = service(&state)?;
    let list = blocking(move || service.host.list_corpora()).await?;
    Ok(Json(json!({"object": "list", "data": list})).into_response())
}

pub async fn add_documents(
    state: Arc<AppState>,
    name: String,
    body: AddDocuments,
) -> Result<Response, ApiError> {
    let service = service(&state)?;
    let docs = documents(body.documents);
    let change = blocking(move || service.host.add_documents(&name, &docs)).await?;
    Ok(change_response(&change))
}

/// `GET /v1/corpora/{name}`: the corpus as it is served, with the state of its long-context
/// prefix's pin (`pinning` with tokens done and total, `pinned`, `unpinned`, `unavailable`
/// with the reason). A corpus only in the store is loaded first, without pinning.
pub async fn get_corpus(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = crate::app::corpus_name(path)?;
    let service = service(&state)?;
    let corpus = blocking(move || service.host.corpus(&name)).await?;
    let mut body = serde_json::to_value(&corpus).map_err(|e| ApiError::internal(e.to_string()))?;
    body["object"] = json!("corpus");
    let response = Json(body).into_response();
    Ok(with_corpus(response, &corpus.name, corpus.generation))
}

/// `DELETE /v1/corpora/{name}`: the corpus and its pinned prefix are gone.
pub async fn delete_corpus(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = crate::app::corpus_name(path)?;
    let service = service(&state)?;
    let deleted = name.clone();
    blocking(move || service.host.delete_corpus(&deleted)).await?;
    Ok(Json(json!({"id": name, "object": "corpus.deleted", "deleted": true})).into_response())
}

pub async fn list_documents(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = crate::app::corpus_name(path)?;
    let service = service(&state)?;
    let list = blocking(move || service.host.list_documents(&name)).await?;
    Ok(Json(json!({"object": "list", "data": list})).into_response())
}

pub async fn delete_documents(
    state: Arc<AppState>,
    name: String,
    body: DeleteDocuments,
) -> Result<Response, ApiError> {
    let service = service(&state)?;
    let change = blocking(move || service.host.delete_documents(&name, &body.ids)).await?;
    Ok(change_response(&change))
}

/// A corpus change's response, with the header naming the generation now served.
fn change_response(change: &DocumentsChange) -> Response {
    let response = Json(json!({"object": "corpus", "result": change})).into_response();
    with_corpus(response, &change.corpus.name, change.corpus.generation)
}
