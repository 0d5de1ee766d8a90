//! Single-request generation: prefill the prompt, then decode step by step, each step's logits
//! reduced once (max, log-sum-exp, entropy, argmax, top-k) for logprobs and the entropy monitor.

use std::time::Instant;

use candle_core::Tensor;
use serde::Serialize;
use triage_models::attention::ContiguousKvCache;
use triage_models::chat_template::ChatMessage;
use triage_models::model::Model;
use triage_ops::{logits_reduce, LogitsStats, MAX_TOP_K};

use crate::entropy_monitor::{
    Decision, EntropyEstimator, EntropyMonitor, EntropyUnit, StepValue, DEFAULT_WINDOW,
};
use crate::sampler::{Sampler, SamplingParams};
use crate::stop::StopChecker;
use crate::{EngineError, Result};

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Raw text, tokenized as is (a BOS token is added when the model asks for one).
    Text(String),
    /// Chat messages rendered through the model's chat template with a generation prompt.
    Chat(Vec<ChatMessage>),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
}

/// How the entropy of the first tokens is measured and, with a threshold, acted on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntropySettings {
    /// Check window m: the mean is taken over the first `window` generated tokens.
    pub window: usize,
    pub estimator: EntropyEstimator,
    pub unit: EntropyUnit,
    /// τ: with a threshold, the monitor decides accept/escalate.
    pub threshold: Option<f32>,
    /// Stop generating as soon as the monitor decides to escalate.
    pub stop_on_escalate: bool,
}

impl Default for EntropySettings {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            estimator: EntropyEstimator::FullSoftmax,
            unit: EntropyUnit::Nats,
            threshold: None,
            stop_on_escalate: false,
        }
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub params: SamplingParams,
    pub entropy: EntropySettings,
}

/// One generated token. `logprob`, `entropy` and `top_logprobs` are of the raw model
/// distribution, before penalties and temperature.
#[derive(Debug, Clone, Serialize)]
pub struct TokenOutput {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    /// The step's value under the configured estimator and unit (full-softmax nats by default).
    pub entropy: f32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_logprobs: Vec<(u32, f32)>,
    /// Raw logprobs of the request's `score_token_ids`, in that order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scored_logprobs: Vec<(u32, f32)>,
    /// The residual-stream state of each of the request's `hidden_layers`, for its first
    /// `hidden_steps` tokens (the first token's is the last prompt token's state).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<Vec<f32>>,
}

/// Raw logprobs of `ids` in one row of logits whose log-sum-exp is `lse`; ids outside the
/// vocabulary are skipped (`LlmEngine` refuses them when the request is added).
pub(crate) fn scored_logprobs(row: &[f32], lse: f32, ids: &[u32]) -> Vec<(u32, f32)> {
    ids.iter()
        .filter_map(|&id| row.get(id as usize).map(|&x| (id, x - lse)))
        .collect()
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// The entropy monitor escalated and `stop_on_escalate` was set.
    Escalate,
    /// The caller asked to stop (a callback, `LlmEngine::cancel`, a listener that went away,
    /// a forced shutdown). Not a normal end: a server must not report it as `stop`.
    Cancelled,
    /// This request failed inside the engine (its logits could not be sampled, or the step it
    /// was part of failed); the message says why.
    Error(String),
}

impl FinishReason {
    /// Whether generation ended by itself (stop, length, escalation) rather than being cut off.
    pub fn is_normal(&self) -> bool {
        matches!(self, Self::Stop | Self::Length | Self::Escalate)
    }
}

/// Mean entropy over the check window.
#[derive(Debug, Clone, Serialize)]
pub struct MeanEntropy {
    /// Mean over the first `min(window, tokens)` generated tokens (EOS excluded); `None` if none.
    pub value: Option<f32>,
    pub unit: EntropyUnit,
    pub window: usize,
}

/// Wall-clock times of the two phases.
#[derive(Debug, Clone, Serialize)]
pub struct Timings {
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

/// The result of one generation.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationOutput {
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub tokens: Vec<TokenOutput>,
    pub finish_reason: FinishReason,
    pub mean_entropy: MeanEntropy,
    /// The monitor's decision, when a threshold was given.
    #[serde(skip)]
    pub decision: Option<Decision>,
    pub timings: Timings,
}

/// Turn a prompt into token ids with the model's tokenizer and chat template.
pub fn tokenize_prompt(model: &Model, prompt: &Prompt) -> Result<Vec<u32>> {
    let ids = match prompt {
        Prompt::Tokens(ids) => ids.clone(),
        Prompt::Text(text) => model
            .tokenizer
            .encode(text, model.tokenizer.add_bos(), false)?,
        // The template writes its own special tokens (BOS included when the model wants it);
        // the messages' text is encoded as text, so it cannot open or close a turn.
        Prompt::Chat(messages) => match model.chat_template.render_parts(messages, true)? {
            Some(parts) => model.tokenizer.encode_parts(&parts)?,
            None => {
                if let Some(token) = messages
                    .iter()
                    .find_map(|m| model.tokenizer.special_token_in(&m.content))
                {
                    return Err(EngineError::Invalid(format!(
                        "a message contains the control token {token:?}; this model's chat \
                         template rewrites message text, so it cannot be kept as plain text"
                    )));
                }
                let text = model.chat_template.render(messages, true)?;
                model.tokenizer.encode(&text, false, true)?
            }
        },
    };
    if ids.is_empty() {
        return Err(EngineError::Invalid("the prompt is empty".into()));
    }
    let vocab = model.transformer.config().vocab_size;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::Invalid(format!(
            "token id {bad} is outside the vocabulary (0..{vocab})"
        )));
    }
    Ok(ids)
}

/// Generate for one request. `on_token` sees each token and the text it adds to the output
/// (already cut at stop strings) as soon as it is produced, and returns `false` to cancel; a
/// last call with no token carries text held back until the end (an incomplete UTF-8 sequence or
/// the start of a stop string that never completed). The streamed pieces add up to `text`.
pub fn generate(
    model: &Model,
    request: &GenerateRequest,
    mut on_token: impl FnMut(Option<&TokenOutput>, &str) -> bool,
) -> Result<GenerationOutput> {
    let params = &request.params;
    params.validate()?;
    check_hidden_layers(model, params)?;
    let settings = request.entropy;
    let prompt_ids = tokenize_prompt(model, &request.prompt)?;
    let context_length = model.context_length();
    let max_tokens = resolve_max_tokens(prompt_ids.len(), params.max_tokens, context_length)?;
    let mut sampler = Sampler::new(params.clone(), &prompt_ids)?;
    let mut stop = StopChecker::new(&params.stop)?;
    let mut monitor = match settings.threshold {
        Some(tau) => Some(EntropyMonitor::new(
            tau,
            settings.window,
            settings.estimator,
            settings.unit,
        )?),
        None => None,
    };
    let top_k = reduction_k(params, settings.estimator);
    let transformer = &model.transformer;
    let mut cache = ContiguousKvCache::new(transformer.config().num_layers);
    cache.reserve(prompt_ids.len() + max_tokens);
    let mut decoder = model.tokenizer.stream_decoder(true);

    let start = Instant::now();
    let (mut logits, mut hidden) = prefill(
        transformer,
        &prompt_ids,
        hidden_layers(params, 0),
        &mut cache,
    )?;
    let prefill_ms = start.elapsed().as_secs_f64() * 1e3;
    let decode_start = Instant::now();

    let mut tokens: Vec<TokenOutput> = Vec::new();
    let mut text = String::new();
    let mut finish_reason = FinishReason::Length;
    let mut decision = None;
    while tokens.len() < max_tokens {
        let stats = reduce_row(&logits, top_k)?;
        // The row leaves the device only for a sampler that draws or penalises, or for scoring.
        let row = if sampler.takes_argmax() && params.score_token_ids.is_empty() {
            None
        } else {
            Some(logits.flatten_all()?.to_vec1::<f32>()?)
        };
        let (id, logprob) = match &row {
            None => (
                sampler.record_argmax(&stats)?,
                stats.max - stats.log_sum_exp,
            ),
            Some(row) => {
                let id = sampler.sample(row)?;
                (id, row[id as usize] - stats.log_sum_exp)
            }
        };
        let is_eos = (!params.ignore_eos && model.tokenizer.is_eos(id))
            || params.stop_token_ids.contains(&id);
        if is_eos {
            finish_reason = FinishReason::Stop;
            break;
        }
        let value = settings
            .estimator
            .step_value(&stats, logprob, settings.unit)?;
        let token = TokenOutput {
            id,
            text: model.tokenizer.decode(&[id], false)?,
            logprob,
            entropy: value,
            top_logprobs: stats
                .top_k
                .iter()
                .take(params.top_logprobs)
                .copied()
                .collect(),
            scored_logprobs: row.as_deref().map_or_else(Vec::new, |row| {
                scored_logprobs(row, stats.log_sum_exp, &params.score_token_ids)
            }),
            hidden: hidden_rows(&hidden, 0)?,
        };
        let piece = decoder.step(&model.tokenizer, id)?.unwrap_or_default();
        let out = stop.push(&piece);
        text.push_str(&out.text);
        tokens.push(token);
        let keep_going = on_token(tokens.last(), &out.text);
        if out.matched.is_some() {
            finish_reason = FinishReason::Stop;
            break;
        }
        if let Some(m) = monitor.as_mut() {
            let d = m.observe(value)?;
            if let Decision::Escalate { .. } = d {
                decision = Some(d);
                if settings.stop_on_escalate {
                    finish_reason = FinishReason::Escalate;
                    break;
                }
            }
        }
        if !keep_going {
            finish_reason = FinishReason::Cancelled;
            break;
        }
        if tokens.len() >= max_tokens {
            break;
        }
        let pos = (prompt_ids.len() + tokens.len() - 1) as u32;
        let layers = hidden_layers(params, tokens.len());
        (logits, hidden) =
            transformer.forward_with_hidden(&[id], &[pos], &[0], layers, &mut cache)?;
    }
    if !stop.is_stopped() {
        let mut tail = String::new();
        if let Some(rest) = decoder.flush(&model.tokenizer)? {
            tail.push_str(&stop.push(&rest).text);
        }
        if !stop.is_stopped() {
            tail.push_str(&stop.finish());
        }
        if !tail.is_empty() {
            text.push_str(&tail);
            on_token(None, &tail);
        }
    }
    if let Some(m) = monitor.as_mut() {
        decision = Some(decision.unwrap_or_else(|| m.finish()));
    }
    let window_len = tokens.len().min(settings.window);
    let mean = (window_len > 0)
        .then(|| {
            tokens[..window_len]
                .iter()
                .map(|t| t.entropy as f64)
                .sum::<f64>()
                / window_len as f64
        })
        .map(|m| m as f32);
    Ok(GenerationOutput {
        text,
        prompt_tokens: prompt_ids.len(),
        completion_tokens: tokens.len(),
        tokens,
        finish_reason,
        mean_entropy: MeanEntropy {
            value: mean,
            unit: settings.unit,
            window: settings.window,
        },
        decision,
        timings: Timings {
            prefill_ms,
            decode_ms: decode_start.elapsed().as_secs_f64() * 1e3,
        },
    })
}

/// How many tokens may be generated: `max_tokens` if it fits, else an error; the rest of the
/// context when unset.
pub fn resolve_max_tokens(
    prompt_tokens: usize,
    max_tokens: Option<usize>,
    context_length: usize,
) -> Result<usize> {
    let room = context_length.saturating_sub(prompt_tokens);
    match max_tokens {
        _ if room == 0 => Err(EngineError::ContextOverflow {
            prompt_tokens,
            max_tokens: max_tokens.unwrap_or(0),
            context_length,
        }),
        Some(m) if m > room => Err(EngineError::ContextOverflow {
            prompt_tokens,
            max_tokens: m,
            context_length,
        }),
        Some(m) => Ok(m),
        None => Ok(room),
    }
}

/// Top-k size of the fused reduction: what the request's logprobs need, and 20 for the top-k
/// entropy estimators.
/// Prompt tokens per forward pass of a prefill (llama.cpp's micro-batch): a long prompt's
/// activations (the MLP's are `chunk × intermediate` f32 values) stay a fixed size instead of
/// growing with the prompt. Every row gives the same bits whatever the chunking.
pub const PREFILL_CHUNK: usize = 512;

/// Runs `prompt_ids` into `cache` in chunks of [`PREFILL_CHUNK`]; returns the last token's
/// logits and its state at `hidden_layers`.
fn prefill(
    transformer: &triage_models::transformer::Transformer,
    prompt_ids: &[u32],
    hidden_layers: &[usize],
    cache: &mut ContiguousKvCache,
) -> Result<(Tensor, Vec<Tensor>)> {
    let mut out = None;
    let num_chunks = prompt_ids.len().div_ceil(PREFILL_CHUNK);
    for (i, chunk) in prompt_ids.chunks(PREFILL_CHUNK).enumerate() {
        let first = (i * PREFILL_CHUNK) as u32;
        let positions: Vec<u32> = (first..first + chunk.len() as u32).collect();
        let layers = if i + 1 == num_chunks {
            hidden_layers
        } else {
            &[]
        };
        out = Some(transformer.forward_with_hidden(
            chunk,
            &positions,
            &[chunk.len() - 1],
            layers,
            cache,
        )?);
    }
    out.ok_or_else(|| EngineError::Invalid("the prompt is empty".into()))
}

/// The layers whose state the request's token number `generated` (from 0) returns.
pub(crate) fn hidden_layers(params: &SamplingParams, generated: usize) -> &[usize] {
    if generated < params.hidden_steps {
        &params.hidden_layers
    } else {
        &[]
    }
}

/// Row `row` of each hidden-state tensor, as plain vectors.
pub(crate) fn hidden_rows(hidden: &[Tensor], row: usize) -> Result<Vec<Vec<f32>>> {
    hidden
        .iter()
        .map(|h| Ok(h.get(row)?.to_vec1::<f32>()?))
        .collect()
}

/// Refuses hidden-state layers the model does not have, before anything runs.
pub(crate) fn check_hidden_layers(model: &Model, params: &SamplingParams) -> Result<()> {
    let layers = model.transformer.config().num_layers;
    match params.hidden_layers.iter().find(|&&l| l >= layers) {
        Some(bad) => Err(EngineError::InvalidSampling {
            param: "hidden_layers",
            message: format!("layer {bad} of a model with {layers} layers"),
        }),
        None => Ok(()),
    }
}

fn reduction_k(params: &SamplingParams, estimator: EntropyEstimator) -> usize {
    match estimator {
        EntropyEstimator::TopKRenormalized | EntropyEstimator::TopKResidual => MAX_TOP_K,
        _ => params.top_logprobs.min(MAX_TOP_K),
    }
}

/// Reduce the single logits row (only its statistics come back to the host).
fn reduce_row(logits: &Tensor, k: usize) -> Result<LogitsStats> {
    logits_reduce(logits, k)?
        .pop()
        .ok_or_else(|| EngineError::Invalid("empty logits".into()))
}
