//! Running one accepted request: collect its events into a body, or stream them as OpenAI
//! server-sent events ending with `data: [DONE]`. Either way the request's timing goes into the
//! metrics, and its pending slot is released when the response ends or the client goes away.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use tokio::sync::mpsc::UnboundedReceiver;
use triage_engine::{StreamEvent, Usage};

use crate::api_error::ApiError;
use crate::metrics::{Metrics, ModelLabels};
use crate::responses::{self, Completed, Endpoint, Piece, ResponseMeta};
use crate::worker::EngineWorker;

/// A request's place in its model's pending count; released on drop.
pub struct Ticket {
    worker: Arc<EngineWorker>,
}

impl Ticket {
    /// Take a slot, or 429 when the model already holds `limit` requests.
    pub fn take(worker: &Arc<EngineWorker>, limit: usize) -> Result<Self, ApiError> {
        let taken = worker
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(Self {
                worker: worker.clone(),
            }),
            Err(_) => Err(ApiError::queue_full(&worker.name, limit)),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.worker.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Time to first token and between tokens, and token counts at the end.
pub struct RequestTimer {
    metrics: Arc<Metrics>,
    labels: ModelLabels,
    start: Instant,
    last: Option<Instant>,
}

impl RequestTimer {
    pub fn new(metrics: Arc<Metrics>, model: &str) -> Self {
        Self {
            metrics,
            labels: ModelLabels {
                model: model.to_string(),
            },
            start: Instant::now(),
            last: None,
        }
    }

    fn token(&mut self) {
        let now = Instant::now();
        let (histogram, since) = match self.last {
            None => (&self.metrics.time_to_first_token, self.start),
            Some(last) => (&self.metrics.inter_token_latency, last),
        };
        histogram
            .get_or_create(&self.labels)
            .observe((now - since).as_secs_f64());
        self.last = Some(now);
    }

    fn finish(&self, u: &Usage) {
        let m = &self.metrics;
        m.prompt_tokens
            .get_or_create(&self.labels)
            .inc_by(u.prompt_tokens as u64);
        m.generation_tokens
            .get_or_create(&self.labels)
            .inc_by(u.completion_tokens as u64);
        m.prefix_cache_queries
            .get_or_create(&self.labels)
            .inc_by(u.prompt_tokens as u64);
        m.prefix_cache_hits
            .get_or_create(&self.labels)
            .inc_by(u.cached_tokens as u64);
    }
}

/// Wait for the whole generation and build the non-streaming body.
pub async fn collect(
    mut rx: UnboundedReceiver<StreamEvent>,
    mut timer: RequestTimer,
    meta: &ResponseMeta,
    worker: &EngineWorker,
) -> Result<Response, ApiError> {
    let (mut text, mut tokens) = (String::new(), Vec::new());
    while let Some(event) = rx.recv().await {
        match event {
            StreamEvent::Token(t, piece) => {
                timer.token();
                text.push_str(&piece);
                tokens.push(t);
            }
            StreamEvent::Text(piece) => text.push_str(&piece),
            StreamEvent::Finished { reason, usage } => {
                timer.finish(&usage);
                let reason = responses::finish_reason(&reason)?;
                let done = Completed {
                    text,
                    tokens,
                    reason,
                    usage,
                };
                let body = responses::full_body(meta, &worker.model, &done);
                return Ok(axum::Json(body).into_response());
            }
        }
    }
    Err(ApiError::internal(
        "the engine ended the request without finishing it",
    ))
}

struct StreamState {
    rx: UnboundedReceiver<StreamEvent>,
    timer: RequestTimer,
    meta: ResponseMeta,
    worker: Arc<EngineWorker>,
    include_usage: bool,
    /// Bytes of text sent so far (legacy logprobs offsets).
    offset: usize,
    queued: VecDeque<Event>,
    done: bool,
    _ticket: Ticket,
}

impl StreamState {
    fn json(&self, piece: &Piece) -> Event {
        let body = responses::chunk(&self.meta, &self.worker.model, piece, self.include_usage);
        Event::default().data(body.to_string())
    }

    /// Turn one engine event into the chunks it produces.
    fn on_event(&mut self, event: Option<StreamEvent>) {
        match event {
            Some(StreamEvent::Token(t, text)) => {
                self.timer.token();
                let tokens = [t];
                let piece = Piece {
                    text: Some(&text),
                    tokens: &tokens,
                    offset: self.offset,
                    ..Piece::default()
                };
                let event = self.json(&piece);
                self.offset += text.len();
                self.queued.push_back(event);
            }
            Some(StreamEvent::Text(text)) => {
                let piece = Piece {
                    text: Some(&text),
                    offset: self.offset,
                    ..Piece::default()
                };
                let event = self.json(&piece);
                self.offset += text.len();
                self.queued.push_back(event);
            }
            Some(StreamEvent::Finished { reason, usage }) => {
                self.timer.finish(&usage);
                let reason = match responses::finish_reason(&reason) {
                    Ok(reason) => reason,
                    Err(error) => return self.end_with_error(&error),
                };
                let piece = Piece {
                    text: matches!(self.meta.endpoint, Endpoint::Completion { .. }).then_some(""),
                    finish: Some(reason),
                    ..Piece::default()
                };
                let event = self.json(&piece);
                self.queued.push_back(event);
                if self.include_usage {
                    let body = responses::usage_chunk(&self.meta, &usage);
                    self.queued
                        .push_back(Event::default().data(body.to_string()));
                }
                self.queued.push_back(Event::default().data("[DONE]"));
                self.done = true;
            }
            None => {
                let error = ApiError::internal("the engine ended the request without finishing it");
                self.end_with_error(&error);
            }
        }
    }

    /// End the stream with OpenAI's error object as its last chunk (the status line has long
    /// been sent): the official clients raise it as an `APIError` instead of treating the
    /// stream as complete, and no chunk carries a `finish_reason`.
    fn end_with_error(&mut self, error: &ApiError) {
        self.queued
            .push_back(Event::default().data(error.body().to_string()));
        self.queued.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }
}

/// Stream the request as server-sent events. Dropping the stream (client gone) drops the
/// receiver, which makes the engine cancel the request and free its blocks.
pub fn stream_response(
    rx: UnboundedReceiver<StreamEvent>,
    timer: RequestTimer,
    meta: ResponseMeta,
    worker: Arc<EngineWorker>,
    include_usage: bool,
    ticket: Ticket,
) -> Response {
    let mut state = StreamState {
        rx,
        timer,
        meta,
        worker,
        include_usage,
        offset: 0,
        queued: VecDeque::new(),
        done: false,
        _ticket: ticket,
    };
    if matches!(state.meta.endpoint, Endpoint::Chat { .. }) {
        let first = state.json(&Piece {
            role: true,
            text: Some(""),
            ..Piece::default()
        });
        state.queued.push_back(first);
    }
    Sse::new(events(state))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn events(state: StreamState) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.queued.pop_front() {
                return Some((Ok(event), state));
            }
            if state.done {
                return None;
            }
            let next = state.rx.recv().await;
            state.on_event(next);
        }
    })
}
