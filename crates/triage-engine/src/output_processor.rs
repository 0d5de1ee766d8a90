//! One request's output side, the same for every request `LlmEngine` runs: a step's reduced logits
//! row becomes the request's next token with its `TokenOutput` (raw logprob, the step's entropy
//! under the request's estimator and unit, top-k, scored logprobs, hidden states), the text it
//! adds (detokenized, cut at stop strings), and whether the request ends there (an end-of-sequence
//! or stop token, a stop string, an escalation it was asked to stop at).

use candle_core::{DType, Tensor};
use triage_models::tokenizer::{StreamDecoder, TextTokenizer};
use triage_ops::{LogitsStats, MAX_TOP_K};

use crate::entropy_monitor::{Decision, EntropyEstimator, EntropyMonitor, StepValue};
use crate::generate::{
    hidden_layers, scored_logprobs, EntropySettings, FinishReason, GenerateRequest, TokenOutput,
};
use crate::sampler::Sampler;
use crate::stop::StopChecker;
use crate::Result;

/// What one step did to its request.
#[derive(Debug)]
pub(crate) enum Processed {
    /// An end-of-sequence or stop token: nothing is streamed and the request stops.
    Eos,
    /// A token to stream with the text it adds; `ends` when the request stops with it.
    Token {
        output: TokenOutput,
        text: String,
        ends: Option<FinishReason>,
    },
}

/// A request's sampler, stop strings, detokenizer and entropy settings, from its first token to
/// its held-back tail.
pub(crate) struct OutputProcessor {
    sampler: Sampler,
    stop: StopChecker,
    decoder: StreamDecoder,
    entropy: EntropySettings,
    /// Present only with a threshold and `stop_on_escalate`: it ends the request when it escalates.
    monitor: Option<EntropyMonitor>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl OutputProcessor {
    /// The output side of `request`, whose prompt is `prompt`. Its parameters were validated.
    pub fn new(
        request: &GenerateRequest,
        prompt: &[u32],
        tokenizer: &TextTokenizer,
    ) -> Result<Self> {
        let params = &request.params;
        let entropy = request.entropy;
        let monitor = match entropy.threshold {
            Some(tau) if entropy.stop_on_escalate => Some(EntropyMonitor::new(
                tau,
                entropy.window,
                entropy.estimator,
                entropy.unit,
            )?),
            _ => None,
        };
        Ok(Self {
            sampler: Sampler::new(params.clone(), prompt)?,
            stop: StopChecker::new(&params.stop)?,
            decoder: tokenizer.stream_decoder(true),
            entropy,
            monitor,
            prompt_tokens: prompt.len(),
            completion_tokens: 0,
        })
    }

    /// Top-k entries this request needs from the fused reduction: its `top_logprobs`, and every
    /// entry for the top-k entropy estimators.
    pub fn reduction_k(&self) -> usize {
        match self.entropy.estimator {
            EntropyEstimator::TopKRenormalized | EntropyEstimator::TopKResidual => MAX_TOP_K,
            _ => self.sampler.params().top_logprobs.min(MAX_TOP_K),
        }
    }

    /// The layers whose state this step's token returns.
    pub fn hidden_now(&self) -> &[usize] {
        hidden_layers(self.sampler.params(), self.completion_tokens)
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    pub fn completion_tokens(&self) -> usize {
        self.completion_tokens
    }

    /// Row `row` of `logits`, reduced to `stat`, as this request's next token. `hidden` gives the
    /// row's state at the layers asked (called only for a token that is streamed). An error is
    /// this request's alone (its logits could not be sampled).
    pub fn process(
        &mut self,
        tokenizer: &TextTokenizer,
        logits: &Tensor,
        row: usize,
        stat: &LogitsStats,
        hidden: impl FnOnce(&[usize]) -> Result<Vec<Vec<f32>>>,
    ) -> Result<Processed> {
        let choice = self.choose_token(logits, row, stat)?;
        let params = self.sampler.params();
        let token = choice.token;
        if (!params.ignore_eos && tokenizer.is_eos(token)) || params.stop_token_ids.contains(&token)
        {
            return Ok(Processed::Eos);
        }
        let entropy = self
            .entropy
            .estimator
            .step_value(stat, choice.logprob, self.entropy.unit)?;
        let output = TokenOutput {
            id: token,
            text: tokenizer.decode(&[token], false)?,
            logprob: choice.logprob,
            entropy,
            top_logprobs: stat
                .top_k
                .iter()
                .take(params.top_logprobs)
                .copied()
                .collect(),
            scored_logprobs: choice.scored_logprobs,
            hidden: hidden(self.hidden_now())?,
        };
        let piece = self.decoder.step(tokenizer, token)?.unwrap_or_default();
        self.completion_tokens += 1;
        let checked = self.stop.push(&piece);
        let ends = if checked.matched.is_some() {
            Some(FinishReason::Stop)
        } else if self.escalates(entropy)? {
            Some(FinishReason::Escalate)
        } else {
            None
        };
        Ok(Processed::Token {
            output,
            text: checked.text,
            ends,
        })
    }

    /// Text held back until the end (an incomplete UTF-8 sequence, the start of a stop string
    /// that never completed); empty when there is none or a stop string already ended the output.
    pub fn finish_text(&mut self, tokenizer: &TextTokenizer) -> String {
        let mut tail = String::new();
        if self.stop.is_stopped() {
            return tail;
        }
        if let Ok(Some(rest)) = self.decoder.flush(tokenizer) {
            tail.push_str(&self.stop.push(&rest).text);
        }
        if !self.stop.is_stopped() {
            tail.push_str(&self.stop.finish());
        }
        tail
    }

    /// Whether this step's value makes the request escalate and stop.
    fn escalates(&mut self, value: f32) -> Result<bool> {
        match self.monitor.as_mut() {
            Some(m) => Ok(matches!(m.observe(value)?, Decision::Escalate { .. })),
            None => Ok(false),
        }
    }

    /// A sampler that takes the argmax gets the reduction's (the row stays on the device); any
    /// other, or a request that scores tokens, copies the row to the host and samples it.
    fn choose_token(&mut self, logits: &Tensor, row: usize, stat: &LogitsStats) -> Result<Choice> {
        let score_ids = &self.sampler.params().score_token_ids;
        if self.sampler.takes_argmax() && score_ids.is_empty() {
            let token = self.sampler.record_argmax(stat)?;
            return Ok(Choice {
                token,
                logprob: stat.max - stat.log_sum_exp,
                scored_logprobs: Vec::new(),
            });
        }
        // A bf16 head's row widens here, on the way to the host.
        let values = logits.get(row)?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let scored = scored_logprobs(&values, stat.log_sum_exp, score_ids);
        let token = self.sampler.sample(&values)?;
        Ok(Choice {
            token,
            logprob: values[token as usize] - stat.log_sum_exp,
            scored_logprobs: scored,
        })
    }
}

/// One row's token with its raw logprob and scored logprobs.
struct Choice {
    token: u32,
    logprob: f32,
    scored_logprobs: Vec<(u32, f32)>,
}
