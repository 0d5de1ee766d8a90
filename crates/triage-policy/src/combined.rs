//! The calibrated combined escalation score: a logistic regression over the RAG answer's
//! uncertainty signals and the six retrieval features, giving P(the RAG answer is wrong). Fitted
//! on a dev split (`triage bench route --save-combined FILE`) and offered as an alternative to
//! raw entropy: with it, the RAG answer escalates when P(wrong) reaches the threshold.

use std::path::Path;

use serde::{Deserialize, Serialize};

use triage_types::{AnswerSignals, GroundingFeatures, RetrievalFeatures};

use crate::error::{PolicyError, Result};
use crate::frozen::{freeze, thaw};
use crate::linear::LogisticModel;

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

/// The frozen model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CombinedScoreModel {
    /// The base model whose answers it was fitted on.
    pub model_id: String,
    pub inputs: Vec<String>,
    pub logistic: LogisticModel,
    /// Where answers and declines were fitted apart (a signal may mean the opposite for a
    /// decline, and one linear score shares every slope): the declines' model, `logistic` then
    /// being the answers'. Absent: one model for both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declines: Option<LogisticModel>,
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
                inputs: COMBINED_INPUTS.iter().map(|s| s.to_string()).collect(),
                logistic: LogisticModel::fit(rows, wrong, COMBINED_L2)?,
                declines: None,
                threshold,
            },
        })
    }

    /// P(wrong) of one answer, from the declines' model where it has one and the row is a
    /// decline.
    pub fn p_wrong(&self, row: &[f32]) -> Result<f64> {
        let model = model_for(row, &self.model.logistic, self.model.declines.as_ref());
        model.predict(row)
    }

    pub fn save(&self, path: &Path) -> Result<String> {
        freeze(&self.model, path)
    }

    /// Reads a frozen model. One fitted on a prefix of the inputs this build computes (a file
    /// from before the later inputs existed) scores exactly as it was fitted: the inputs it never
    /// saw get weight zero. One fitted on other inputs is refused: its weights would be read
    /// against the wrong signals.
    pub fn load(path: &Path) -> Result<Self> {
        let mut model: CombinedScoreModel = thaw(path)?;
        let known = model.inputs.len();
        let consistent = |fitted: &LogisticModel| {
            fitted.weights.len() == known
                && [
                    &fitted.standardizer.medians,
                    &fitted.standardizer.means,
                    &fitted.standardizer.stds,
                ]
                .iter()
                .all(|v| v.len() == known)
        };
        let consistent =
            consistent(&model.logistic) && model.declines.as_ref().is_none_or(consistent);
        if known > COMBINED_INPUTS.len()
            || model.inputs[..] != COMBINED_INPUTS[..known]
            || !consistent
        {
            return Err(PolicyError::Invalid(format!(
                "{} was fitted on the inputs [{}]; this build computes [{}]: refit it with \
                 `triage calibrate --combined-fit` or `triage bench route --save-combined`",
                path.display(),
                model.inputs.join(", "),
                COMBINED_INPUTS.join(", ")
            )));
        }
        for name in &COMBINED_INPUTS[known..] {
            model.inputs.push(name.to_string());
        }
        unseen_inputs_weigh_nothing(&mut model.logistic);
        if let Some(declines) = &mut model.declines {
            unseen_inputs_weigh_nothing(declines);
        }
        Ok(Self { model })
    }
}

/// Extends `fitted` to every input this build computes, those it never saw with weight zero.
fn unseen_inputs_weigh_nothing(fitted: &mut LogisticModel) {
    for _ in fitted.weights.len()..COMBINED_INPUTS.len() {
        fitted.weights.push(0.0);
        fitted.standardizer.medians.push(0.0);
        fitted.standardizer.means.push(0.0);
        fitted.standardizer.stds.push(1.0);
    }
}

/// The combined score fitted out of fold: each row's P(wrong) by the logistic fitted on the
/// other folds' rows (`data` holds each row's fold, below `num_folds`, its inputs and whether it
/// was wrong), so no row is both fitted and scored. A fold with no rows to score, or whose
/// training rows hold one label only, is skipped. Returns scores and labels, in row order.
pub fn out_of_fold_p_wrong(
    data: &[(u64, Vec<f32>, bool)],
    num_folds: u64,
) -> Result<(Vec<f64>, Vec<bool>)> {
    let mut predicted = vec![f64::NAN; data.len()];
    for fold in 0..num_folds {
        let (train, test): (Vec<usize>, Vec<usize>) =
            (0..data.len()).partition(|&i| data[i].0 != fold);
        let x: Vec<Vec<f32>> = train.iter().map(|&i| data[i].1.clone()).collect();
        let y: Vec<bool> = train.iter().map(|&i| data[i].2).collect();
        if test.is_empty() || !y.contains(&true) || !y.contains(&false) {
            continue;
        }
        let model = LogisticModel::fit(&x, &y, COMBINED_L2)?;
        for i in test {
            predicted[i] = model.predict(&data[i].1)?;
        }
    }
    Ok(predicted
        .iter()
        .zip(data)
        .filter(|(p, _)| p.is_finite())
        .map(|(p, d)| (*p, d.2))
        .unzip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_file_scores_as_fitted_and_one_on_other_inputs_is_refused() {
        let rows: Vec<Vec<f32>> = (0..40)
            .map(|i| {
                (0..COMBINED_INPUTS.len())
                    .map(|j| ((i * (j + 3)) % 11) as f32 - 5.0)
                    .collect()
            })
            .collect();
        let wrong: Vec<bool> = (0..40).map(|i| (i * 7) % 5 < 2).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("combined.json");
        let fitted = CombinedScore::fit("m", &rows, &wrong, 0.5).unwrap();
        fitted.save(&path).unwrap();
        assert_eq!(CombinedScore::load(&path).unwrap().model, fitted.model);

        // A file fitted before the last inputs existed: the same P(wrong) on a full row as its
        // own model gives on the inputs it knew, and a NaN in the new inputs changes nothing.
        let known = COMBINED_INPUTS.len() - 2;
        let old_rows: Vec<Vec<f32>> = rows.iter().map(|r| r[..known].to_vec()).collect();
        let old = CombinedScoreModel {
            model_id: "m".into(),
            inputs: COMBINED_INPUTS[..known]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            logistic: LogisticModel::fit(&old_rows, &wrong, COMBINED_L2).unwrap(),
            declines: None,
            threshold: 0.5,
        };
        CombinedScore { model: old.clone() }.save(&path).unwrap();
        let loaded = CombinedScore::load(&path).unwrap();
        assert_eq!(loaded.model.inputs, COMBINED_INPUTS);
        for row in &rows[..5] {
            let expected = old.logistic.predict(&row[..known]).unwrap();
            assert_eq!(loaded.p_wrong(row).unwrap(), expected);
            let mut unknown = row.clone();
            unknown[known..].fill(f32::NAN);
            assert_eq!(loaded.p_wrong(&unknown).unwrap(), expected);
        }

        // Inputs renamed or reordered: refused.
        let mut other = old;
        other.inputs.swap(0, 1);
        CombinedScore { model: other }.save(&path).unwrap();
        let err = CombinedScore::load(&path).unwrap_err().to_string();
        assert!(err.contains("refit"), "{err}");
    }

    #[test]
    fn a_decline_is_scored_by_the_declines_model_where_there_is_one() {
        let n = COMBINED_INPUTS.len();
        let constant = |bias: f64| LogisticModel {
            standardizer: crate::linear::Standardizer {
                medians: vec![0.0; n],
                means: vec![0.0; n],
                stds: vec![1.0; n],
            },
            weights: vec![0.0; n],
            bias,
        };
        let declined = COMBINED_INPUTS
            .iter()
            .position(|i| *i == "declined")
            .unwrap();
        let (mut answer, mut decline) = (vec![0.5f32; n], vec![0.5f32; n]);
        answer[declined] = 0.0;
        decline[declined] = 1.0;
        let mut score = CombinedScore {
            model: CombinedScoreModel {
                model_id: "m".into(),
                inputs: COMBINED_INPUTS.iter().map(|s| s.to_string()).collect(),
                logistic: constant(-3.0),
                declines: Some(constant(3.0)),
                threshold: 0.5,
            },
        };
        assert!(score.p_wrong(&answer).unwrap() < 0.1);
        assert!(score.p_wrong(&decline).unwrap() > 0.9);
        // A file written before the inputs' last two: both models get them at weight zero.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("apart.json");
        let mut old = score.model.clone();
        old.inputs.truncate(n - 2);
        for m in [Some(&mut old.logistic), old.declines.as_mut()]
            .into_iter()
            .flatten()
        {
            m.weights.truncate(n - 2);
            m.standardizer.medians.truncate(n - 2);
            m.standardizer.means.truncate(n - 2);
            m.standardizer.stds.truncate(n - 2);
        }
        CombinedScore { model: old }.save(&path).unwrap();
        assert_eq!(CombinedScore::load(&path).unwrap().model, score.model);
        // One model alone scores declines like answers.
        score.model.declines = None;
        assert!(score.p_wrong(&decline).unwrap() < 0.1);
    }
}
