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
