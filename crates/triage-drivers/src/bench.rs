//! `triage bench prefix` and `triage bench decode`: time-to-first-token after a shared prefix
//! (cold vs cached) and aggregate decode throughput under concurrency, through `LlmEngine`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use triage_engine::SamplingParams;
use triage_engine::{EngineConfig, KvBudget, LlmEngine, StreamEvent};
use triage_engine::{EntropySettings, GenerateRequest, Prompt};
use triage_models::model::Model;

use crate::error::{bail, io, Result};

/// Cold vs cached time-to-first-token of a question after a shared prefix.
#[derive(Debug, Serialize)]
pub struct PrefixBench {
    pub prefix_tokens: usize,
    pub question_tokens: usize,
    pub cold_ttft_ms: f64,
    pub cached_ttft_ms: f64,
    pub speedup: f64,
    /// The cold request's greedy first token: a peer given the same prompt ids
    /// (`--prompt-ids`) compares its last-position logits with it.
    pub cold_first_token: FirstToken,
}

/// A request's first token, as the engine sampled it from the raw distribution.
#[derive(Debug, Serialize)]
pub struct FirstToken {
    pub id: u32,
    pub logprob: f32,
    pub entropy: f32,
}

/// Aggregate decode rate at one concurrency.
#[derive(Debug, Serialize)]
pub struct DecodeResult {
    pub concurrency: usize,
    pub tokens_per_s: f64,
    /// Whether decode steps replayed captured graphs.
    pub cuda_graphs: bool,
    /// Per captured bucket, `[rows, nodes]`: the launches, copies and memsets one replay makes
    /// (CUDA only).
    pub graph_nodes: Vec<[usize; 2]>,
}

fn greedy(ids: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Tokens(ids),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    }
}

/// Deterministic filler token ids drawn from ordinary text tokens of the model.
fn filler(model: &Model, n: usize, seed: usize) -> Result<Vec<u32>> {
    let text = "The history of computing is a story of abstractions layered on abstractions. ";
    let base = model.tokenizer.encode(text, false, false)?;
    if base.is_empty() {
        bail!("tokenizer produced no tokens");
    }
    Ok((0..n).map(|i| base[(i + seed * 7) % base.len()]).collect())
}

/// The benchmarks' engine: room for `num_tokens`, prefix caching on, 4,096-token steps.
pub(crate) fn engine_config(
    num_tokens: usize,
    max_num_seqs: usize,
    cuda_graphs: bool,
) -> EngineConfig {
    let block_size = 16;
    EngineConfig {
        kv_budget: KvBudget::Blocks(num_tokens.div_ceil(block_size) + 8),
        block_size,
        max_num_batched_tokens: 4096,
        max_num_seqs,
        prefix_caching: true,
        cuda_graphs,
        ..EngineConfig::default()
    }
}

fn engine(
    model: &Arc<Model>,
    num_tokens: usize,
    max_num_seqs: usize,
    cuda_graphs: bool,
) -> Result<LlmEngine> {
    let config = engine_config(num_tokens, max_num_seqs, cuda_graphs);
    Ok(LlmEngine::new(model.clone(), config)?)
}

/// Time from submission to the first streamed token of one request, and that token.
fn ttft(engine: &mut LlmEngine, request: &GenerateRequest) -> Result<(f64, FirstToken)> {
    let start = Instant::now();
    let (_, rx) = engine.add_request(request)?;
    loop {
        engine.step()?;
        let first = rx.try_iter().find_map(|e| match e {
            StreamEvent::Token(t, _) => Some(t),
            _ => None,
        });
        if let Some(t) = first {
            let ms = start.elapsed().as_secs_f64() * 1e3;
            while engine.has_unfinished() {
                engine.step()?;
            }
            let token = FirstToken {
                id: t.id,
                logprob: t.logprob,
                entropy: t.entropy,
            };
            return Ok((ms, token));
        }
        if !engine.has_unfinished() {
            bail!("request finished without a token");
        }
    }
}

/// Cold and cached TTFT of two questions after one prefix; the cold prompt's ids are written to
/// `prompt_ids` (a JSON array) when given.
pub fn bench_prefix(
    model: &Arc<Model>,
    prefix_tokens: usize,
    question_tokens: usize,
    prompt_ids: Option<&Path>,
) -> Result<PrefixBench> {
    let prefix = filler(model, prefix_tokens, 0)?;
    let q1 = [prefix.clone(), filler(model, question_tokens, 1)?].concat();
    let q2 = [prefix, filler(model, question_tokens, 2)?].concat();
    if let Some(path) = prompt_ids {
        std::fs::write(path, serde_json::to_string(&q1)?).map_err(io("writing", &path))?;
    }
    let mut engine = engine(model, 2 * (prefix_tokens + question_tokens) + 64, 4, false)?;
    let (cold, first) = ttft(&mut engine, &greedy(q1, 1))?;
    let (cached, _) = ttft(&mut engine, &greedy(q2, 1))?;
    Ok(PrefixBench {
        prefix_tokens,
        question_tokens,
        cold_ttft_ms: cold,
        cached_ttft_ms: cached,
        speedup: cold / cached,
        cold_first_token: first,
    })
}

/// Decode tokens/s at each concurrency, eager or through captured graphs (`cuda_graphs`).
pub fn bench_decode(
    model: &Arc<Model>,
    concurrency: &[usize],
    prompt_tokens: usize,
    decode_tokens: usize,
    cuda_graphs: bool,
) -> Result<Vec<DecodeResult>> {
    let mut results = Vec::new();
    for &c in concurrency {
        let num_tokens = c * (prompt_tokens + decode_tokens + 16);
        let mut engine = engine(model, num_tokens, c, cuda_graphs)?;
        let requests: Vec<_> = (0..c)
            .map(|i| filler(model, prompt_tokens, 10 + i).map(|ids| greedy(ids, decode_tokens)))
            .collect::<Result<_>>()?;
        let _rxs: Vec<_> = requests
            .iter()
            .map(|r| engine.add_request(r).map(|(_, rx)| rx))
            .collect::<std::result::Result<_, _>>()?;
        // Prefill (and first sample) before the clock starts, so only decode steps are timed:
        // each later step runs one token per request.
        while engine.scheduler().num_waiting() > 0 {
            engine.step()?;
        }
        // And the first decode step, which captures the bucket's graph when graphs are on.
        engine.step()?;
        let start = Instant::now();
        let mut tokens = 0usize;
        while engine.has_unfinished() {
            tokens += engine.step()?;
        }
        let secs = start.elapsed().as_secs_f64();
        results.push(DecodeResult {
            concurrency: c,
            tokens_per_s: tokens as f64 / secs,
            cuda_graphs,
            graph_nodes: engine.graph_nodes()?,
        });
    }
    Ok(results)
}
