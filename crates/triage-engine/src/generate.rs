//! What a generation request is and gives back, and `generate`: one request run to its end on an
//! `LlmEngine` (the only decode loop), its streamed events collected into a `GenerationOutput`.

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use triage_models::chat_template::ChatMessage;
use triage_models::model::Model;

use crate::entropy_monitor::{
    Decision, EntropyEstimator, EntropyMonitor, EntropyUnit, DEFAULT_WINDOW,
};
use crate::llm_engine::{EngineConfig, KvBudget, LlmEngine, RequestId, StreamEvent};
use crate::sampler::SamplingParams;
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

/// Generate for one request on an engine of its own, sized for it (its prompt and `max_tokens` in
/// KV blocks, prefill in chunks of [`PREFILL_CHUNK`]). `on_token` sees each token and the text it
/// adds to the output (already cut at stop strings) as soon as it is produced, and returns `false`
/// to cancel; a last call with no token carries text held back until the end (an incomplete UTF-8
/// sequence or the start of a stop string that never completed). The streamed pieces add up to
/// `text`.
pub fn generate(
    model: &Arc<Model>,
    request: &GenerateRequest,
    on_token: impl FnMut(Option<&TokenOutput>, &str) -> bool,
) -> Result<GenerationOutput> {
    request.params.validate()?;
    let prompt = tokenize_prompt(model, &request.prompt)?;
    let max_tokens = resolve_max_tokens(
        prompt.len(),
        request.params.max_tokens,
        model.context_length(),
    )?;
    let block_size = EngineConfig::default().block_size;
    let config = EngineConfig {
        // The pool keeps one block back (the null block).
        kv_budget: KvBudget::Blocks((prompt.len() + max_tokens).div_ceil(block_size) + 1),
        block_size,
        max_num_batched_tokens: PREFILL_CHUNK,
        max_num_seqs: 1,
        prefix_caching: false,
        kv_dtype: None,
        // A graph per bucket pays off over many steps of a served engine, not one request.
        cuda_graphs: false,
    };
    let mut engine = LlmEngine::new(model.clone(), config)?;
    let request = GenerateRequest {
        prompt: Prompt::Tokens(prompt),
        ..request.clone()
    };
    engine.generate(&request, on_token)
}

impl LlmEngine {
    /// Run `request` to its end on this engine (other requests it holds step along with it) and
    /// collect what it streamed; `on_token` is as for [`generate`]. A failed step ends every
    /// request the engine holds, as a server's worker ends them.
    pub fn generate(
        &mut self,
        request: &GenerateRequest,
        mut on_token: impl FnMut(Option<&TokenOutput>, &str) -> bool,
    ) -> Result<GenerationOutput> {
        let start = Instant::now();
        let (id, rx) = self.add_request(request)?;
        let mut run = OneRun::new(id, rx);
        while run.finished.is_none() {
            if let Err(e) = self.step() {
                self.fail_all(&e.to_string());
                return Err(e);
            }
            run.drain(self, &mut on_token);
        }
        run.into_output(request.entropy, start)
    }
}

/// One request's events as they arrive, for [`LlmEngine::generate`].
struct OneRun {
    id: RequestId,
    rx: Receiver<StreamEvent>,
    tokens: Vec<TokenOutput>,
    text: String,
    first_event: Option<Instant>,
    /// `on_token` asked to stop.
    cancelled: bool,
    finished: Option<(FinishReason, usize)>,
}

impl OneRun {
    fn new(id: RequestId, rx: Receiver<StreamEvent>) -> Self {
        Self {
            id,
            rx,
            tokens: Vec::new(),
            text: String::new(),
            first_event: None,
            cancelled: false,
            finished: None,
        }
    }

    /// Take the events a step sent, calling `on_token` for each piece of text.
    fn drain(
        &mut self,
        engine: &mut LlmEngine,
        on_token: &mut impl FnMut(Option<&TokenOutput>, &str) -> bool,
    ) {
        while let Ok(event) = self.rx.try_recv() {
            self.first_event.get_or_insert_with(Instant::now);
            match event {
                StreamEvent::Token(token, piece) => {
                    self.text.push_str(&piece);
                    let keep_going = on_token(Some(&token), &piece);
                    self.tokens.push(token);
                    if !keep_going && !self.cancelled {
                        self.cancelled = true;
                        engine.cancel(self.id);
                    }
                }
                StreamEvent::Text(piece) => {
                    self.text.push_str(&piece);
                    on_token(None, &piece);
                }
                StreamEvent::Finished { reason, usage } => {
                    self.finished = Some((reason, usage.prompt_tokens));
                }
            }
        }
    }

    /// The output, with the decision of a monitor over the tokens' values when the request had a
    /// threshold (the same values the engine's monitor saw, so the same decision).
    fn into_output(self, settings: EntropySettings, start: Instant) -> Result<GenerationOutput> {
        let end = Instant::now();
        let (reason, prompt_tokens) = self
            .finished
            .ok_or_else(|| EngineError::Invalid("the request never finished".into()))?;
        // A stop string or an escalation in the step that was cancelled still ends it as such.
        let finish_reason = match reason {
            FinishReason::Stop | FinishReason::Escalate => reason,
            _ if self.cancelled => FinishReason::Cancelled,
            _ => reason,
        };
        let decision = match settings.threshold {
            Some(tau) => {
                let mut monitor =
                    EntropyMonitor::new(tau, settings.window, settings.estimator, settings.unit)?;
                for t in &self.tokens {
                    monitor.observe(t.entropy)?;
                }
                Some(monitor.finish())
            }
            None => None,
        };
        let window_len = self.tokens.len().min(settings.window);
        let mean = (window_len > 0).then(|| {
            let sum: f64 = self.tokens[..window_len]
                .iter()
                .map(|t| f64::from(t.entropy))
                .sum();
            (sum / window_len as f64) as f32
        });
        let first = self.first_event.unwrap_or(end);
        Ok(GenerationOutput {
            text: self.text,
            prompt_tokens,
            completion_tokens: self.tokens.len(),
            tokens: self.tokens,
            finish_reason,
            mean_entropy: MeanEntropy {
                value: mean,
                unit: settings.unit,
                window: settings.window,
            },
            decision,
            timings: Timings {
                prefill_ms: (first - start).as_secs_f64() * 1e3,
                decode_ms: (end - first).as_secs_f64() * 1e3,
            },
        })
    }
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

/// Prompt tokens per forward pass of a prefill (llama.cpp's micro-batch): a long prompt's
/// activations (the MLP's are `chunk × intermediate` f32 values) stay a fixed size instead of
/// growing with the prompt. Every row gives the same bits whatever the chunking.
pub const PREFILL_CHUNK: usize = 512;

/// The layers whose state the request's token number `generated` (from 0) returns.
pub(crate) fn hidden_layers(params: &SamplingParams, generated: usize) -> &[usize] {
    if generated < params.hidden_steps {
        &params.hidden_layers
    } else {
        &[]
    }
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
