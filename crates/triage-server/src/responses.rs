//! OpenAI response bodies and stream chunks, built from the engine's events. The standard
//! fields are exactly OpenAI's; triage's routing signal rides in a `triage` object per choice
//! (`{"entropies": [...], "mean_entropy": ..., "entropy_unit": "nats"}`) that clients may ignore.

use serde_json::{json, Value};
use triage_engine::{FinishReason, TokenOutput, Usage};
use triage_models::model::Model;

use crate::api_error::ApiError;

/// Tokens whose entropy is averaged for the routing signal (the brief's m = 30).
pub const ENTROPY_WINDOW: usize = 30;

/// Which endpoint a response is for, and how it reports logprobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat { logprobs: bool },
    Completion { logprobs: bool },
}

/// What every body and chunk of one response shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
}

/// A finished generation, collected from its events.
#[derive(Debug, Clone)]
pub struct Completed {
    pub text: String,
    pub tokens: Vec<TokenOutput>,
    /// OpenAI's `finish_reason` (see [`finish_reason`]).
    pub reason: &'static str,
    pub usage: Usage,
}

/// OpenAI's `finish_reason` for a generation that ended by itself; a request the engine cut off
/// has none and is answered with an error instead, never a normal-looking `"stop"`:
/// - an engine error (its sampling failed, or the step it was in) is a logged 500;
/// - a cancellation reaches a live request only at a forced shutdown (a client that went away
///   has nobody to tell), so it is a 503: the request was not at fault, and a retry once the
///   server is back can succeed.
pub fn finish_reason(reason: &FinishReason) -> Result<&'static str, ApiError> {
    match reason {
        FinishReason::Length => Ok("length"),
        FinishReason::Stop | FinishReason::Escalate => Ok("stop"),
        FinishReason::Cancelled => Err(ApiError::unavailable(
            "the server cancelled this request before it finished (shutting down); retry later",
        )),
        FinishReason::Error(message) => Err(ApiError::internal(format!(
            "generation failed for this request: {message}"
        ))),
    }
}

pub fn usage(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn token_text(model: &Model, id: u32) -> String {
    model.tokenizer.decode(&[id], false).unwrap_or_default()
}

/// Chat-style logprobs of some tokens: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(model: &Model, tokens: &[TokenOutput]) -> Value {
    let entry = |text: String, logprob: f32| json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(t.text.clone(), t.logprob);
            e["top_logprobs"] = t
                .top_logprobs
                .iter()
                .map(|&(id, lp)| entry(token_text(model, id), lp))
                .collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// Legacy completions logprobs: parallel lists, `text_offset` counted from `offset` bytes.
fn legacy_logprobs(model: &Model, tokens: &[TokenOutput], offset: usize) -> Value {
    let mut at = offset;
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(at);
        at += t.text.len();
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let map: serde_json::Map<String, Value> = t
                .top_logprobs
                .iter()
                .map(|&(id, lp)| (token_text(model, id), json!(lp)))
                .collect();
            Value::Object(map)
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| t.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

fn logprobs(meta: &ResponseMeta, model: &Model, tokens: &[TokenOutput], offset: usize) -> Value {
    match meta.endpoint {
        Endpoint::Chat { logprobs: true } => chat_logprobs(model, tokens),
        Endpoint::Completion { logprobs: true } => legacy_logprobs(model, tokens, offset),
        _ => Value::Null,
    }
}

/// The `triage` extension of a finished choice.
fn entropy_extension(tokens: &[TokenOutput]) -> Value {
    let window: Vec<f32> = tokens
        .iter()
        .take(ENTROPY_WINDOW)
        .map(|t| t.entropy)
        .collect();
    let mean = (!window.is_empty()).then(|| window.iter().sum::<f32>() / window.len() as f32);
    json!({
        "entropies": tokens.iter().map(|t| t.entropy).collect::<Vec<_>>(),
        "mean_entropy": mean,
        "entropy_window": ENTROPY_WINDOW,
        "entropy_unit": "nats",
    })
}

/// The non-streaming body.
pub fn full_body(meta: &ResponseMeta, model: &Model, done: &Completed) -> Value {
    let lp = logprobs(meta, model, &done.tokens, 0);
    let reason = done.reason;
    let choice = match meta.endpoint {
        Endpoint::Chat { .. } => json!({
            "index": 0,
            "message": {"role": "assistant", "content": done.text},
            "logprobs": lp,
            "finish_reason": reason,
            "triage": entropy_extension(&done.tokens),
        }),
        Endpoint::Completion { .. } => json!({
            "index": 0,
            "text": done.text,
            "logprobs": lp,
            "finish_reason": reason,
            "triage": entropy_extension(&done.tokens),
        }),
    };
    json!({
        "id": meta.id,
        "object": match meta.endpoint {
            Endpoint::Chat { .. } => "chat.completion",
            Endpoint::Completion { .. } => "text_completion",
        },
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": concat!("triage-", env!("CARGO_PKG_VERSION")),
        "choices": [choice],
        "usage": usage(&done.usage),
    })
}

/// One streamed piece of a choice.
#[derive(Debug, Clone, Default)]
pub struct Piece<'a> {
    /// Chat only: the first chunk announces the role.
    pub role: bool,
    pub text: Option<&'a str>,
    pub tokens: &'a [TokenOutput],
    /// Byte offset of `text` in the whole output (legacy logprobs).
    pub offset: usize,
    /// OpenAI's `finish_reason`, on the last chunk of a generation that ended by itself.
    pub finish: Option<&'static str>,
}

/// A stream chunk; `include_usage` streams carry `"usage": null` until the usage chunk.
pub fn chunk(meta: &ResponseMeta, model: &Model, piece: &Piece, include_usage: bool) -> Value {
    let lp = if piece.tokens.is_empty() {
        Value::Null
    } else {
        logprobs(meta, model, piece.tokens, piece.offset)
    };
    let finish = piece.finish;
    let mut choice = match meta.endpoint {
        Endpoint::Chat { .. } => {
            let mut delta = serde_json::Map::new();
            if piece.role {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(t) = piece.text {
                delta.insert("content".into(), json!(t));
            }
            json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish})
        }
        Endpoint::Completion { .. } => json!({
            "index": 0,
            "text": piece.text.unwrap_or(""),
            "logprobs": lp,
            "finish_reason": finish,
        }),
    };
    if !piece.tokens.is_empty() {
        choice["triage"] = json!({
            "entropies": piece.tokens.iter().map(|t| t.entropy).collect::<Vec<_>>(),
        });
    }
    let mut body = chunk_envelope(meta);
    body["choices"] = json!([choice]);
    if include_usage {
        body["usage"] = Value::Null;
    }
    body
}

/// The final usage chunk of an `include_usage` stream: no choices.
pub fn usage_chunk(meta: &ResponseMeta, u: &Usage) -> Value {
    let mut body = chunk_envelope(meta);
    body["choices"] = json!([]);
    body["usage"] = usage(u);
    body
}

fn chunk_envelope(meta: &ResponseMeta) -> Value {
    json!({
        "id": meta.id,
        "object": match meta.endpoint {
            Endpoint::Chat { .. } => "chat.completion.chunk",
            Endpoint::Completion { .. } => "text_completion",
        },
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": concat!("triage-", env!("CARGO_PKG_VERSION")),
    })
}
