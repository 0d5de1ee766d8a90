//! The hidden-state probe that decides before decoding, and its out-of-fold scores for the
//! evaluation. The probe that decides before decoding: a mass-mean probe over the base model's
//! residual stream at one layer, read at the last prompt token of the RAG prompt — which the
//! first generated token carries, from the prefill's own forward pass — so a query whose
//! retrieved context the model cannot answer from goes to long context without spending the
//! monitor's window of tokens. Fitted with `triage signals --save-probe` on dev answers.

use std::path::Path;

use crate::error::{PolicyError, Result};
use crate::frozen::{freeze, thaw};
use crate::linear::MassMeanProbe;
use serde::{Deserialize, Serialize};

/// The frozen probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeModel {
    /// The base model whose states it was fitted on.
    pub model_id: String,
    pub layer: usize,
    pub probe: MassMeanProbe,
    /// Escalate when the score exceeds this.
    pub threshold: f64,
}

impl ProbeModel {
    /// Fit on `rows` (the last prompt token's state at `layer`, and whether the answer was
    /// wrong), with the threshold that escalates at most `max_false_escalation` of the right
    /// answers it was fitted on.
    pub fn fit(
        model_id: &str,
        layer: usize,
        rows: &[(&[f32], bool)],
        max_false_escalation: f64,
    ) -> Result<Self> {
        if !(0.0..1.0).contains(&max_false_escalation) {
            return Err(PolicyError::Invalid(format!(
                "the probe's false-escalation rate is a share in [0, 1), not {max_false_escalation}"
            )));
        }
        let probe = MassMeanProbe::fit(rows).ok_or_else(|| {
            PolicyError::Invalid("a probe needs both right and wrong answers to fit on".into())
        })?;
        // `MassMeanProbe::fit` has seen both labels, so there are right answers.
        let threshold = probe
            .threshold(rows, max_false_escalation)?
            .ok_or_else(|| PolicyError::Invalid("the probe has no right answers".into()))?;
        Ok(Self {
            model_id: model_id.to_string(),
            layer,
            probe,
            threshold,
        })
    }

    /// The score of a state, and whether it escalates.
    pub fn judge(&self, state: &[f32]) -> Result<(f64, bool)> {
        let score = self.probe.score(state)?;
        Ok((score, score > self.threshold))
    }

    pub fn save(&self, path: &Path) -> Result<String> {
        freeze(self, path)
    }

    pub fn load(path: &Path) -> Result<Self> {
        thaw(path)
    }
}

/// Scores of each fold's answers by the mass-mean probe fitted on the other folds, for an
/// offline AUROC: `data` holds each answer's fold (below `num_folds`, see
/// [`crate::fold_of`]), its state, and whether it was wrong. Folds whose training answers are
/// all right or all wrong are skipped, and so are states of another width than the probe's (a
/// run mixing models has others).
pub fn out_of_fold_scores(data: &[(u64, &[f32], bool)], num_folds: u64) -> (Vec<f64>, Vec<bool>) {
    let (mut scores, mut labels) = (Vec::new(), Vec::new());
    for fold in 0..num_folds {
        let train: Vec<(&[f32], bool)> = data
            .iter()
            .filter(|d| d.0 != fold)
            .map(|d| (d.1, d.2))
            .collect();
        let Some(probe) = MassMeanProbe::fit(&train) else {
            continue;
        };
        for d in data.iter().filter(|d| d.0 == fold) {
            if let Ok(score) = probe.score(d.1) {
                scores.push(score);
                labels.push(d.2);
            }
        }
    }
    (scores, labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_escalates_at_most_the_share_of_right_answers_asked() {
        // Right answers sit at x ∈ {0, 0.1, ..., 0.9}, wrong ones at 2 and 3.
        let states: Vec<([f32; 1], bool)> = (0..10)
            .map(|i| ([i as f32 / 10.0], false))
            .chain([([2.0], true), ([3.0], true)])
            .collect();
        let rows: Vec<(&[f32], bool)> = states.iter().map(|(s, w)| (&s[..], *w)).collect();
        let strict = ProbeModel::fit("m", 3, &rows, 0.0).unwrap();
        let judged = |m: &ProbeModel, x: f32| m.judge(&[x]).unwrap().1;
        assert!(!judged(&strict, 0.9) && judged(&strict, 2.0));
        // A fifth of the right answers may escalate: 0.8 and 0.9 do, 0.7 does not.
        let loose = ProbeModel::fit("m", 3, &rows, 0.2).unwrap();
        assert!(judged(&loose, 0.8) && !judged(&loose, 0.7));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.json");
        strict.save(&path).unwrap();
        assert_eq!(ProbeModel::load(&path).unwrap(), strict);
        assert!(strict.judge(&[1.0, 2.0]).is_err());
        assert!(ProbeModel::fit("m", 3, &rows[..10], 0.0).is_err());
        assert!(ProbeModel::fit("m", 3, &rows, 1.0).is_err());
    }
}
