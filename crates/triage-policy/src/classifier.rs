//! The query classifier's model-free halves: the learned classifier's frozen logistic over the
//! sentence embedding (its fit and its score of one embedded query), the labelled-query file it
//! is trained on, the threshold that labels scored queries best, and accuracy and AUROC of a
//! classifier's labels. Embedding and the zero-shot model's logprobs stay in `triage-router`.

use std::path::Path;

use serde::{Deserialize, Serialize};
use triage_types::QueryClass;

use crate::error::{PolicyError, Result};
use crate::linear::LogisticModel;
use crate::stats::auroc;

/// One classified query.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Classification {
    pub label: QueryClass,
    /// P(global).
    pub p_global: f32,
}

impl Classification {
    /// The label `p_global` earns at `threshold`: global at or above it.
    pub fn from_p_global(p_global: f64, threshold: f64) -> Self {
        Self {
            label: if p_global >= threshold {
                QueryClass::Global
            } else {
                QueryClass::Point
            },
            p_global: p_global as f32,
        }
    }
}

/// The learned classifier's frozen content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedClassifierModel {
    /// The embedder the features come from (`name:dim:max_len`); another one is refused.
    pub embedder_id: String,
    pub logistic: LogisticModel,
    /// P(global) at or above which a query is global.
    pub threshold: f64,
}

/// L2 penalty of the fit: strong enough that 384 features on a few hundred rows do not overfit.
const L2: f64 = 1e-2;

impl LearnedClassifierModel {
    /// Fit on labelled queries' embeddings (`rows`, from the embedder `embedder_id`).
    pub fn fit(embedder_id: String, rows: &[Vec<f32>], labels: &[QueryClass]) -> Result<Self> {
        let targets: Vec<bool> = labels.iter().map(|&l| l == QueryClass::Global).collect();
        Ok(Self {
            embedder_id,
            logistic: LogisticModel::fit(rows, &targets, L2)?,
            threshold: 0.5,
        })
    }

    /// One embedded query's label.
    pub fn classify(&self, row: &[f32]) -> Result<Classification> {
        let p = self.logistic.predict(row)?;
        Ok(Classification::from_p_global(p, self.threshold))
    }
}

/// One labelled query of a training file (JSON lines, written by
/// `data/query-classes/make.py`).
#[derive(Debug, Clone, Deserialize)]
pub struct LabelledQuery {
    pub query: String,
    pub label: QueryClass,
    /// Rows of one group (a template, an article) land on the same side of a held-out split.
    #[serde(default)]
    pub group: String,
}

/// Read a labelled-query file; a malformed line is an error naming its line number.
pub fn read_labelled(path: &Path) -> Result<Vec<LabelledQuery>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PolicyError::Invalid(format!("reading {}: {e}", path.display())))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: LabelledQuery = serde_json::from_str(line)
            .map_err(|e| PolicyError::Invalid(format!("{}:{}: {e}", path.display(), i + 1)))?;
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(PolicyError::Invalid(format!(
            "{} has no rows",
            path.display()
        )));
    }
    Ok(rows)
}

/// How well a classifier labels `rows`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClassifierQuality {
    /// Fraction labelled correctly at the classifier's own threshold.
    pub accuracy: f64,
    /// Threshold-free: P(global) of a random global query above a random point query.
    pub auroc: Option<f64>,
}

impl ClassifierQuality {
    /// Accuracy and AUROC of `classified` against `rows`' labels (one classification per row,
    /// at least one row).
    pub fn of(classified: &[Classification], rows: &[&LabelledQuery]) -> Result<Self> {
        if rows.is_empty() {
            return Err(PolicyError::Invalid("no rows to evaluate".into()));
        }
        let correct = classified
            .iter()
            .zip(rows)
            .filter(|(c, r)| c.label == r.label)
            .count();
        let scores: Vec<f64> = classified.iter().map(|c| f64::from(c.p_global)).collect();
        let labels: Vec<bool> = rows.iter().map(|r| r.label == QueryClass::Global).collect();
        Ok(Self {
            accuracy: correct as f64 / rows.len() as f64,
            auroc: auroc(&scores, &labels),
        })
    }
}

/// The threshold on scores that labels `(score, is_global)` pairs best (ties: the middle of the
/// best run).
pub fn best_threshold_of(mut scored: Vec<(f64, bool)>) -> f64 {
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Threshold between positions i-1 and i: everything from i on is global.
    let total_global = scored.iter().filter(|s| s.1).count();
    let (mut best, mut best_correct) = (0.5, 0);
    let mut point_below = 0;
    let mut global_below = 0;
    for i in 0..=scored.len() {
        let correct = point_below + (total_global - global_below);
        if correct > best_correct {
            best_correct = correct;
            best = match (i.checked_sub(1).map(|j| scored[j].0), scored.get(i)) {
                (Some(lo), Some(hi)) => (lo + hi.0) / 2.0,
                (None, Some(hi)) => hi.0,
                (Some(lo), None) => lo + 1e-9,
                (None, None) => 0.5,
            };
        }
        if let Some(&(_, global)) = scored.get(i) {
            if global {
                global_below += 1;
            } else {
                point_below += 1;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_separates_the_classes_where_they_meet() {
        let scored = vec![
            (0.1, false),
            (0.15, false),
            (0.2, true),
            (0.3, true),
            (0.05, false),
        ];
        assert!((best_threshold_of(scored) - 0.175).abs() < 1e-12);
        // One overlap: the best split still misclassifies one query.
        let scored = vec![
            (0.1, false),
            (0.4, false),
            (0.3, true),
            (0.6, true),
            (0.7, true),
        ];
        let t = best_threshold_of(scored);
        assert!(t > 0.1 && t <= 0.3, "{t}");
    }
}
