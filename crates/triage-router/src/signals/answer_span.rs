//! Watching a RAG answer: which tokens carry answer content (a fixed preamble such as "According
//! to the context," does not), the entropy monitor over those tokens only, and the signals a
//! finished or stopped answer leaves (mean and max entropy, NLL, top-2 margin, "insufficient").

use triage_engine::entropy_monitor::{Decision, EntropyEstimator, EntropyMonitor, EntropyUnit};
use triage_engine::TokenOutput;

use crate::error::{Result, RouterError};

/// Openings that carry no answer content; matched case-insensitively at the start of an answer.
pub const DEFAULT_PREAMBLES: &[&str] = &[
    "According to the context,",
    "According to the passage,",
    "According to the text,",
    "Based on the context,",
    "Based on the provided context,",
    "Based on the passage,",
    "The answer is",
    "Answer:",
];

fn normalise(text: &str) -> String {
    text.trim_start().to_lowercase()
}

/// Decides token by token whether generated text has left the preamble and entered the answer.
/// Once a token is part of the answer, every later token is too. Tokens that could still begin a
/// preamble are withheld; when the text turns out to begin with none ("The capital is ...",
/// a key "a666…" whose first token is "a"), they join the answer with the token that shows it.
#[derive(Debug, Clone)]
pub struct AnswerSpanFilter {
    preambles: Vec<String>,
    text: String,
    in_answer: bool,
    /// Tokens withheld since the first one with content.
    withheld: usize,
}

/// What one generated token tells about the answer span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanToken {
    /// Not in the span (yet): no content so far, or text that may still be a preamble.
    Outside,
    /// In the span, and so are the `withheld` tokens just before it: they looked like the start
    /// of a preamble but were the answer's own.
    Answer { withheld: usize },
}

impl AnswerSpanFilter {
    pub fn new(preambles: &[String]) -> Self {
        Self {
            preambles: preambles.iter().map(|p| normalise(p)).collect(),
            text: String::new(),
            in_answer: false,
            withheld: 0,
        }
    }

    /// Observe the token that added `piece`. A token that finishes a preamble and starts the
    /// answer counts as answer; the preamble's tokens never do.
    pub fn observe(&mut self, piece: &str) -> SpanToken {
        if self.in_answer {
            return SpanToken::Answer { withheld: 0 };
        }
        self.text.push_str(piece);
        let text = normalise(&self.text);
        let content = |rest: &str| rest.chars().any(char::is_alphanumeric);
        if !content(&text) {
            return SpanToken::Outside;
        }
        let may_begin_one = self.preambles.iter().any(|p| p.starts_with(&text));
        let inside_or_at_end = self.preambles.iter().any(|p| {
            text.strip_prefix(p.as_str())
                .is_some_and(|rest| !content(rest))
        });
        if may_begin_one || inside_or_at_end {
            self.withheld += 1;
            return SpanToken::Outside;
        }
        self.in_answer = true;
        let after_preamble = self.preambles.iter().any(|p| text.starts_with(p.as_str()));
        SpanToken::Answer {
            withheld: if after_preamble { 0 } else { self.withheld },
        }
    }
}

/// Whether each of `pieces` (a generation's tokens, in order) is in the answer span.
pub fn answer_span_mask<'a>(
    pieces: impl IntoIterator<Item = &'a str>,
    preambles: &[String],
) -> Vec<bool> {
    let mut filter = AnswerSpanFilter::new(preambles);
    let mut mask = Vec::new();
    for piece in pieces {
        match filter.observe(piece) {
            SpanToken::Outside => mask.push(false),
            SpanToken::Answer { withheld } => {
                let from = mask.len() - withheld;
                mask[from..].fill(true);
                mask.push(true);
            }
        }
    }
    mask
}

/// One step's value under `estimator` and `unit`, from a streamed token (full-softmax entropy or
/// the sampled token's surprise; the top-k estimators need the logits and are not offered here).
pub fn token_value(
    token: &TokenOutput,
    estimator: EntropyEstimator,
    unit: EntropyUnit,
) -> Result<f32> {
    let nats = match estimator {
        EntropyEstimator::FullSoftmax => f64::from(token.entropy),
        EntropyEstimator::SampledNll => f64::from(-token.logprob),
        other => {
            return Err(RouterError::Invalid(format!(
                "the pipeline monitors full_softmax or sampled_nll, not {other:?}"
            )))
        }
    };
    Ok(unit.convert_nats(nats.max(0.0)) as f32)
}

/// The entropy monitor over the answer span of one generation.
#[derive(Debug, Clone)]
pub struct SpanMonitor {
    filter: AnswerSpanFilter,
    monitor: EntropyMonitor,
    /// Each generated token's value and whether it was in the answer span.
    pub trace: Vec<(f32, bool)>,
    /// Generated tokens when the monitor decided.
    pub decided_at: Option<usize>,
}

impl SpanMonitor {
    pub fn new(filter: AnswerSpanFilter, monitor: EntropyMonitor) -> Self {
        Self {
            filter,
            monitor,
            trace: Vec::new(),
            decided_at: None,
        }
    }

    /// Observe one generated token; returns the decision so far.
    pub fn observe(&mut self, token: &TokenOutput) -> Result<Decision> {
        let value = token_value(token, self.monitor.estimator(), self.monitor.unit())?;
        let span = self.filter.observe(&token.text);
        self.trace.push((value, span != SpanToken::Outside));
        let before = self.monitor.decision();
        let mut decision = before;
        if let SpanToken::Answer { withheld } = span {
            // The withheld tokens enter the window first, in the order they were generated.
            let from = self.trace.len() - 1 - withheld;
            for step in &mut self.trace[from..] {
                step.1 = true;
                decision = self.monitor.observe(step.0)?;
            }
        }
        if !before.is_final() && decision.is_final() {
            self.decided_at = Some(self.trace.len());
        }
        Ok(decision)
    }

    /// The generation ended: decide on what was seen.
    pub fn finish(&mut self) -> Decision {
        let before = self.monitor.decision();
        let decision = self.monitor.finish();
        if !before.is_final() {
            self.decided_at = Some(self.trace.len());
        }
        decision
    }

    /// Mean value over the answer span's first `window` tokens (the monitor's statistic).
    pub fn span_mean(&self) -> Option<f32> {
        self.monitor.mean()
    }
}

pub use triage_types::AnswerSignals;

/// Signals from generated tokens. A trait because `AnswerSignals` is plain data in
/// `triage-types`, which knows no tokens.
pub trait FromTokens {
    /// Signals of the first `window` tokens; NaN where no token was generated.
    fn from_tokens(
        tokens: &[TokenOutput],
        preambles: &[String],
        window: usize,
        declined: bool,
    ) -> Self;
}

impl FromTokens for AnswerSignals {
    fn from_tokens(
        tokens: &[TokenOutput],
        preambles: &[String],
        window: usize,
        declined: bool,
    ) -> Self {
        let head = &tokens[..tokens.len().min(window)];
        let mean = |values: &[f32]| {
            if values.is_empty() {
                f32::NAN
            } else {
                values.iter().sum::<f32>() / values.len() as f32
            }
        };
        let entropies: Vec<f32> = head.iter().map(|t| t.entropy).collect();
        let mask = answer_span_mask(tokens.iter().map(|t| t.text.as_str()), preambles);
        let span_tokens: Vec<&TokenOutput> = tokens
            .iter()
            .zip(&mask)
            .filter(|(_, in_span)| **in_span)
            .map(|(t, _)| t)
            .take(window)
            .collect();
        let span: Vec<f32> = span_tokens.iter().map(|t| t.entropy).collect();
        let nll: Vec<f32> = head.iter().map(|t| -t.logprob).collect();
        let margins: Vec<f32> = head
            .iter()
            .filter(|t| t.top_logprobs.len() >= 2)
            .map(|t| t.top_logprobs[0].1 - t.top_logprobs[1].1)
            .collect();
        Self {
            mean_entropy: mean(&entropies),
            span_mean_entropy: mean(&span),
            max_entropy: entropies.iter().copied().fold(f32::NAN, f32::max),
            mean_nll: mean(&nll),
            mean_top2_margin: mean(&margins),
            declined,
            min_token_prob: span_tokens
                .iter()
                .map(|t| t.logprob.exp())
                .fold(f32::NAN, f32::min),
            span_max_entropy: span.iter().copied().fold(f32::NAN, f32::max),
            // Drawn by the caller, which knows the prompt.
            sample_agreement: f32::NAN,
            self_check: f32::NAN,
        }
    }
}

/// The text of the answer span: the generated text after its preamble.
pub fn answer_span_text(tokens: &[TokenOutput], preambles: &[String]) -> String {
    let mask = answer_span_mask(tokens.iter().map(|t| t.text.as_str()), preambles);
    tokens
        .iter()
        .zip(mask)
        .filter(|(_, in_span)| *in_span)
        .map(|(t, _)| t.text.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter() -> AnswerSpanFilter {
        let preambles: Vec<String> = DEFAULT_PREAMBLES.iter().map(|s| s.to_string()).collect();
        AnswerSpanFilter::new(&preambles)
    }

    fn spans(pieces: &[&str]) -> Vec<bool> {
        let preambles: Vec<String> = DEFAULT_PREAMBLES.iter().map(|s| s.to_string()).collect();
        answer_span_mask(pieces.iter().copied(), &preambles)
    }

    #[test]
    fn a_preamble_is_skipped_and_the_answer_counted() {
        assert_eq!(
            spans(&[
                "According",
                " to",
                " the",
                " context",
                ",",
                " Paris",
                " is",
                "."
            ]),
            [false, false, false, false, false, true, true, true]
        );
        assert_eq!(
            spans(&["The", " answer", " is", ":", " 42"]),
            [false, false, false, false, true]
        );
    }

    #[test]
    fn an_answer_that_only_starts_like_a_preamble_counts_from_its_first_token() {
        assert_eq!(
            spans(&["The", " capital", " is", " Paris"]),
            [true, true, true, true]
        );
        // A key whose first token is "a" (as "According …" and "Answer:" begin) keeps it: the
        // span's text is the whole key, which grounding looks up word by word.
        assert_eq!(spans(&["a", "6", "6", "6", "8"]), [true; 5]);
        assert_eq!(spans(&["\"", "b", "0", "2"]), [false, true, true, true]);
        assert_eq!(
            spans(&["The", " answer", " is", " Paris"]),
            [false, false, false, true]
        );
        assert_eq!(spans(&["Paris", "."]), [true, true]);
        assert_eq!(spans(&[" ", "\n", "Paris"]), [false, false, true]);
    }

    #[test]
    fn the_monitor_counts_withheld_answer_tokens_once_they_prove_to_be_answer() {
        let monitor =
            EntropyMonitor::new(1.0, 3, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        let mut m = SpanMonitor::new(filter(), monitor);
        // "a" may begin "According …": withheld, then counted first when "666" shows it is not.
        assert_eq!(m.observe(&token("a", 3.0)).unwrap(), Decision::Continue);
        assert_eq!(m.observe(&token("666", 0.0)).unwrap(), Decision::Continue);
        assert_eq!(
            m.observe(&token("8", 0.0)).unwrap(),
            Decision::Accept,
            "the window holds a, 666 and 8: mean 1.0 is within τ"
        );
        assert_eq!(m.trace, [(3.0, true), (0.0, true), (0.0, true)]);
        assert_eq!(m.decided_at, Some(3));
        let preambles: Vec<String> = DEFAULT_PREAMBLES.iter().map(|s| s.to_string()).collect();
        let tokens = [token("a", 3.0), token("666", 0.0), token("8", 0.0)];
        assert_eq!(answer_span_text(&tokens, &preambles), "a6668");
        let signals = AnswerSignals::from_tokens(&tokens, &preambles, 30, false);
        assert!((signals.span_mean_entropy - 1.0).abs() < 1e-6);
    }

    fn token(text: &str, entropy: f32) -> TokenOutput {
        TokenOutput {
            id: 0,
            text: text.into(),
            logprob: -entropy / 2.0,
            entropy,
            top_logprobs: vec![(0, -0.1), (1, -2.1)],
            scored_logprobs: Vec::new(),
            hidden: Vec::new(),
        }
    }

    #[test]
    fn the_monitor_sees_only_the_answer_span() {
        let monitor =
            EntropyMonitor::new(1.0, 2, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        let mut m = SpanMonitor::new(filter(), monitor);
        // A very unsure preamble does not escalate; a sure answer is accepted.
        assert_eq!(
            m.observe(&token("According", 5.0)).unwrap(),
            Decision::Continue
        );
        assert_eq!(
            m.observe(&token(" to the context,", 5.0)).unwrap(),
            Decision::Continue
        );
        assert_eq!(
            m.observe(&token(" Paris", 0.5)).unwrap(),
            Decision::Continue
        );
        assert_eq!(m.observe(&token(".", 0.7)).unwrap(), Decision::Accept);
        assert_eq!(m.decided_at, Some(4));
        assert!((m.span_mean().unwrap() - 0.6).abs() < 1e-6);
        let signals = AnswerSignals::from_tokens(
            &[
                token("According", 5.0),
                token(" to the context,", 5.0),
                token(" Paris", 0.5),
            ],
            &DEFAULT_PREAMBLES
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>(),
            30,
            false,
        );
        assert!((signals.mean_entropy - 3.5).abs() < 1e-6);
        assert!((signals.span_mean_entropy - 0.5).abs() < 1e-6);
        assert_eq!(signals.max_entropy, 5.0);
        assert!((signals.mean_top2_margin - 2.0).abs() < 1e-6);
        // The span's own extremes leave the preamble out: " Paris" (logprob −0.25) and "."
        // (−0.35), so the least likely token has probability e^−0.35 and the top entropy 0.7.
        let preambles: Vec<String> = DEFAULT_PREAMBLES.iter().map(|s| s.to_string()).collect();
        let tokens = [
            token("According", 5.0),
            token(" to the context,", 5.0),
            token(" Paris", 0.5),
            token(".", 0.7),
        ];
        let signals = AnswerSignals::from_tokens(&tokens, &preambles, 30, false);
        assert!((signals.min_token_prob - (-0.35f32).exp()).abs() < 1e-6);
        assert!((signals.span_max_entropy - 0.7).abs() < 1e-6);
        assert_eq!(answer_span_text(&tokens, &preambles), " Paris.");
        // No answer token: nothing measured.
        let none = AnswerSignals::from_tokens(&tokens[..2], &preambles, 30, false);
        assert!(none.min_token_prob.is_nan() && none.span_max_entropy.is_nan());
    }

    #[test]
    fn an_unsure_answer_escalates_at_the_step_it_becomes_certain() {
        let monitor =
            EntropyMonitor::new(1.0, 3, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        let mut m = SpanMonitor::new(filter(), monitor);
        assert_eq!(m.observe(&token("Maybe", 2.0)).unwrap(), Decision::Continue);
        assert_eq!(
            m.observe(&token(" Lyon", 2.0)).unwrap(),
            Decision::Escalate { at_step: 2 }
        );
        assert_eq!(m.decided_at, Some(2));
    }
}
