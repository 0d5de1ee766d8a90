//! The calibrated combined escalation score: a logistic regression over the RAG answer's
//! uncertainty signals and the six retrieval features, giving P(the RAG answer is wrong). Fitted
//! on a dev split (`triage bench route --save-combined FILE`) and offered as an alternative to
//! raw entropy: with it, the RAG answer escalates when P(wrong) reaches the threshold.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, RouterError};
use crate::linear::{freeze, thaw, LogisticModel};

use triage_types::signals::COMBINED_L2;
pub use triage_types::signals::{combined_inputs as inputs, COMBINED_INPUTS as INPUTS};

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
                logistic: LogisticModel::fit(rows, wrong, COMBINED_L2)?,
                threshold,
            },
        })
    }

    /// P(wrong) of one answer.
    pub fn p_wrong(&self, row: &[f32]) -> Result<f64> {
        Ok(self.model.logistic.predict(row)?)
    }

    pub fn save(&self, path: &Path) -> Result<String> {
        freeze(&self.model, path)
    }

    /// Refuses a model fitted on other inputs than this build computes (an older file, from
    /// before the grounding features): its weights would be read against the wrong signals.
    pub fn load(path: &Path) -> Result<Self> {
        let model: CombinedScoreModel = thaw(path)?;
        if model.inputs != INPUTS {
            return Err(RouterError::Invalid(format!(
                "{} was fitted on the inputs [{}]; this build computes [{}]: refit it with \
                 `triage bench route --save-combined`",
                path.display(),
                model.inputs.join(", "),
                INPUTS.join(", ")
            )));
        }
        Ok(Self { model })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_fitted_on_other_inputs_is_refused() {
        let rows: Vec<Vec<f32>> = (0..20)
            .map(|i| (0..INPUTS.len()).map(|j| (i * j % 7) as f32).collect())
            .collect();
        let wrong: Vec<bool> = (0..20).map(|i| i % 3 == 0).collect();
        let fitted = CombinedScore::fit("m", &rows, &wrong, 0.5).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("combined.json");
        fitted.save(&path).unwrap();
        assert_eq!(CombinedScore::load(&path).unwrap().model, fitted.model);
        let mut old = fitted.model.clone();
        old.inputs.truncate(13);
        let stale = CombinedScore { model: old };
        stale.save(&path).unwrap();
        let err = CombinedScore::load(&path).unwrap_err().to_string();
        assert!(err.contains("refit"), "{err}");
    }
}
