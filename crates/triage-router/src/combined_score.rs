//! The calibrated combined escalation score: a logistic regression over the RAG answer's
//! uncertainty signals and the six retrieval features, giving P(the RAG answer is wrong). Fitted
//! on a dev split (`triage bench route --save-combined FILE`) and offered as an alternative to
//! raw entropy: with it, the RAG answer escalates when P(wrong) reaches the threshold.

use std::path::Path;

use serde::{Deserialize, Serialize};
use triage_retrieval::RetrievalFeatures;

use crate::answer_span::AnswerSignals;
use crate::error::Result;
use crate::linear::{freeze, thaw, LogisticModel};

/// The inputs, in order.
pub const INPUTS: [&str; 13] = [
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
];

/// One answer's inputs (NaN where a value is missing; the model imputes the training median).
pub fn inputs(
    signals: &AnswerSignals,
    monitor_mean: Option<f32>,
    features: Option<&RetrievalFeatures>,
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
    row
}

/// The frozen model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CombinedScoreModel {
    /// The base model whose answers it was fitted on.
    pub model_id: String,
    pub inputs: Vec<String>,
    pub logistic: LogisticModel,
    /// Escalate when P(wrong) is at least this.
    pub threshold: f64,
}

/// A loaded combined score.
#[derive(Debug, Clone)]
pub struct CombinedScore {
    pub model: CombinedScoreModel,
}

impl CombinedScore {
    /// Fit on answers' inputs and whether each was wrong.
    pub fn fit(model_id: &str, rows: &[Vec<f32>], wrong: &[bool], threshold: f64) -> Result<Self> {
        Ok(Self {
            model: CombinedScoreModel {
                model_id: model_id.to_string(),
                inputs: INPUTS.iter().map(|s| s.to_string()).collect(),
                logistic: LogisticModel::fit(rows, wrong, 1e-2)?,
                threshold,
            },
        })
    }

    /// P(wrong) of one answer.
    pub fn p_wrong(&self, row: &[f32]) -> Result<f64> {
        self.model.logistic.predict(row)
    }

    pub fn save(&self, path: &Path) -> Result<String> {
        freeze(&self.model, path)
    }

    pub fn load(path: &Path) -> Result<Self> {
        Ok(Self { model: thaw(path)? })
    }
}
