//! What a query's retrieval and answer measured: the retrieval features, the gain policy's
//! verdict on them, and the answer's uncertainty signals. A value that could not be computed is
//! NaN (written as `null`).

use serde::{Deserialize, Serialize};

use crate::float::{is_nan_f32, nan_f32, or_nan};

/// One query's features; a value that cannot be computed (too few hits) is NaN, for the
/// policy's median imputation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetrievalFeatures {
    /// Cosine similarity of the best dense hit.
    #[serde(deserialize_with = "or_nan")]
    pub top1_dense: f32,
    /// Best minus second-best dense similarity.
    #[serde(deserialize_with = "or_nan")]
    pub top2_margin: f32,
    /// Mean similarity of the dense top 5.
    #[serde(deserialize_with = "or_nan")]
    pub mean_top5_dense: f32,
    /// Fraction of the dense top 10 that is also in the reranked top 10.
    #[serde(deserialize_with = "or_nan")]
    pub dense_rerank_overlap: f32,
    /// Dense rank (from 1) of the reranked top-1; 11 when it is not in the dense top 10.
    #[serde(deserialize_with = "or_nan")]
    pub rerank_top1_dense_rank: f32,
    /// Fraction of the reranked top 10 that are headings or captions.
    #[serde(deserialize_with = "or_nan")]
    pub structural_fraction: f32,
}

impl RetrievalFeatures {
    /// The features in the study's order.
    pub fn to_array(&self) -> [f32; 6] {
        [
            self.top1_dense,
            self.top2_margin,
            self.mean_top5_dense,
            self.dense_rerank_overlap,
            self.rerank_top1_dense_rank,
            self.structural_fraction,
        ]
    }
}

/// What the gain policy says for one query.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GainDecision {
    #[serde(deserialize_with = "or_nan")]
    pub predicted_delta: f64,
    #[serde(deserialize_with = "or_nan")]
    pub tau_h: f64,
    pub run_hybrid: bool,
}

/// Per-answer uncertainty signals, each a candidate predictor of a wrong RAG answer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AnswerSignals {
    /// Mean full-softmax entropy (nats) of the first `window` generated tokens, preamble included.
    #[serde(deserialize_with = "or_nan")]
    pub mean_entropy: f32,
    /// The same over the answer span only.
    #[serde(deserialize_with = "or_nan")]
    pub span_mean_entropy: f32,
    #[serde(deserialize_with = "or_nan")]
    pub max_entropy: f32,
    /// Mean negative logprob of the generated tokens.
    #[serde(deserialize_with = "or_nan")]
    pub mean_nll: f32,
    /// Mean gap between the best and second-best logprob (small = torn between two tokens).
    #[serde(deserialize_with = "or_nan")]
    pub mean_top2_margin: f32,
    /// The model said the context is insufficient (Self-Route prompt).
    pub declined: bool,
    /// The smallest probability of a generated token in the answer span (first `window`).
    #[serde(
        default = "nan_f32",
        deserialize_with = "or_nan",
        skip_serializing_if = "is_nan_f32"
    )]
    pub min_token_prob: f32,
    /// The largest entropy in the answer span (first `window`).
    #[serde(
        default = "nan_f32",
        deserialize_with = "or_nan",
        skip_serializing_if = "is_nan_f32"
    )]
    pub span_max_entropy: f32,
    /// Mean word F1 of short samples of the answer against the greedy answer (NaN when no
    /// samples were drawn).
    #[serde(
        default = "nan_f32",
        deserialize_with = "or_nan",
        skip_serializing_if = "is_nan_f32"
    )]
    pub sample_agreement: f32,
    /// log p("yes") − log p("no") when the base model, shown its own answer after the RAG
    /// prompt, is asked whether the context bears it out (P(True)'s idea; NaN when not asked,
    /// and for a decline).
    #[serde(
        default = "nan_f32",
        deserialize_with = "or_nan",
        skip_serializing_if = "is_nan_f32"
    )]
    pub self_check: f32,
}

/// How the RAG answer stands on the chunks it was given: grounding features, each a candidate
/// predictor of a wrong answer (a model that copies a span of its context is rarely making it
/// up). NaN where a value cannot be computed (no answer words, no chunks).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GroundingFeatures {
    /// 1 when the answer span, normalised (lower case, punctuation and spaces folded), is a run
    /// of whole words of a retrieved chunk; else 0.
    #[serde(deserialize_with = "or_nan")]
    pub verbatim: f32,
    /// Rank (from 1, in prompt order) of the first chunk holding it verbatim; chunks + 1 when
    /// none does.
    #[serde(deserialize_with = "or_nan")]
    pub chunk_rank: f32,
    /// That chunk's retrieval score (NaN when none holds it).
    #[serde(deserialize_with = "or_nan")]
    pub chunk_score: f32,
    /// Its score minus the next chunk's (NaN when none holds it or it is the last).
    #[serde(deserialize_with = "or_nan")]
    pub chunk_margin: f32,
    /// Share of the answer's words found nowhere in the retrieved chunks.
    #[serde(deserialize_with = "or_nan")]
    pub unsupported_words: f32,
    /// Share of the question's words (those the chunks hold at all) that the line or sentence
    /// holding the answer span also holds: a value read from the record or sentence the
    /// question is about scores 1, a neighbour's 0. 0 when no line or sentence holds the span
    /// or the span only repeats words of the question; NaN without answer words.
    #[serde(
        default = "nan_f32",
        deserialize_with = "or_nan",
        skip_serializing_if = "is_nan_f32"
    )]
    pub question_support: f32,
}

impl AnswerSignals {
    /// The combined score's inputs, in a fixed order (retrieval features appended by the caller).
    pub fn to_array(&self) -> [f32; 5] {
        [
            self.mean_entropy,
            self.span_mean_entropy,
            self.max_entropy,
            self.mean_nll,
            self.mean_top2_margin,
        ]
    }
}

/// The base model's residual stream while it answered from the retrieved chunks, for a
/// hidden-state probe: per layer asked, the state at the last prompt token (before any answer
/// token) and the mean state over the first answer tokens. Values are rounded to 1e-3 to keep
/// records small; a linear probe does not see the difference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeStates {
    pub layers: Vec<usize>,
    /// Per layer: the state at the last prompt token.
    pub prompt: Vec<Vec<f32>>,
    /// Per layer: the mean state over the answer's first tokens (empty when it has none).
    pub answer: Vec<Vec<f32>>,
}

impl ProbeStates {
    /// From the hidden states of a generation's first tokens (each token's states for
    /// `layers`, in order; the first token's are the last prompt token's).
    pub fn from_token_states(layers: &[usize], tokens: &[&[Vec<f32>]]) -> Option<Self> {
        let first = tokens.first().filter(|t| t.len() == layers.len())?;
        let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| (x * 1e3).round() / 1e3).collect() };
        let prompt = first.iter().map(|v| round(v)).collect();
        let rest: Vec<&[Vec<f32>]> = tokens[1..]
            .iter()
            .copied()
            .filter(|t| t.len() == layers.len())
            .collect();
        let answer = if rest.is_empty() {
            Vec::new()
        } else {
            (0..layers.len())
                .map(|l| {
                    let width = rest[0][l].len();
                    let mut mean = vec![0f32; width];
                    for t in &rest {
                        mean.iter_mut().zip(&t[l]).for_each(|(m, x)| *m += x);
                    }
                    let n = rest.len() as f32;
                    round(&mean.iter().map(|m| m / n).collect::<Vec<_>>())
                })
                .collect()
        };
        Some(Self {
            layers: layers.to_vec(),
            prompt,
            answer,
        })
    }
}

/// The L2 penalty of the combined score's logistic fit, wherever it is fitted (the router's
/// frozen score, `triage calibrate --combined-fit`, `triage signals`).
pub const COMBINED_L2: f64 = 1e-2;

/// The combined escalation score's inputs, in order; each oriented so that larger means more
/// likely wrong where the sign is known.
pub const COMBINED_INPUTS: [&str; 23] = [
    "mean_entropy",
    "span_mean_entropy",
    "max_entropy",
    "mean_nll",
    "neg_top2_margin",
    "declined",
    "monitor_mean",
    "top1_dense",
    "top2_margin",
    "mean_top5_dense",
    "dense_rerank_overlap",
    "rerank_top1_dense_rank",
    "structural_fraction",
    "neg_min_token_prob",
    "span_max_entropy",
    "not_verbatim",
    "grounding_chunk_rank",
    "neg_grounding_chunk_score",
    "neg_grounding_margin",
    "unsupported_words",
    "sample_disagreement",
    "question_unsupported",
    "neg_self_check",
];

/// Whether a row of `COMBINED_INPUTS` is a decline (its `declined` input set): where answers
/// and declines are fitted apart, the row's kind picks its model.
pub fn is_decline(row: &[f32]) -> bool {
    let at = COMBINED_INPUTS
        .iter()
        .position(|n| *n == "declined")
        .expect("the decline is a combined input");
    row.get(at).is_some_and(|&v| v > 0.5)
}

/// The model that scores `row` where answers and declines may be fitted apart: the declines'
/// where there is one and the row is a decline, else the answers' (or the only one).
pub fn model_for<'m, M>(row: &[f32], answers: &'m M, declines: Option<&'m M>) -> &'m M {
    match declines {
        Some(declines) if is_decline(row) => declines,
        _ => answers,
    }
}

/// One RAG answer's combined-score inputs (NaN where a value is missing; the model imputes the
/// training median).
pub fn combined_inputs(
    signals: &AnswerSignals,
    monitor_mean: Option<f32>,
    features: Option<&RetrievalFeatures>,
    grounding: Option<&GroundingFeatures>,
) -> Vec<f32> {
    let mut row = vec![
        signals.mean_entropy,
        signals.span_mean_entropy,
        signals.max_entropy,
        signals.mean_nll,
        -signals.mean_top2_margin,
        f32::from(u8::from(signals.declined)),
        monitor_mean.unwrap_or(f32::NAN),
    ];
    row.extend(features.map_or([f32::NAN; 6], RetrievalFeatures::to_array));
    row.extend([-signals.min_token_prob, signals.span_max_entropy]);
    let g = grounding.copied().unwrap_or(GroundingFeatures {
        verbatim: f32::NAN,
        chunk_rank: f32::NAN,
        chunk_score: f32::NAN,
        chunk_margin: f32::NAN,
        unsupported_words: f32::NAN,
        question_support: f32::NAN,
    });
    row.extend([
        1.0 - g.verbatim,
        g.chunk_rank,
        -g.chunk_score,
        -g.chunk_margin,
        g.unsupported_words,
        1.0 - signals.sample_agreement,
        1.0 - g.question_support,
        -signals.self_check,
    ]);
    row
}
