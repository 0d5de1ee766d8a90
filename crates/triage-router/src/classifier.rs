//! The query classifier: point-extraction (retrieval can answer it) versus global synthesis
//! (summaries, themes, comparisons across documents: only the whole corpus can). Two
//! implementations behind one trait: a logistic regression over the sentence embedding, and the
//! router model zero-shot (the logprob of each label).

use std::path::Path;

use serde::{Deserialize, Serialize};
use triage_engine::SamplingParams;
use triage_engine::{EntropySettings, GenerateRequest, Prompt};
use triage_models::chat_template::ChatMessage;
use triage_retrieval::Embedder;

pub use triage_types::QueryClass;

use crate::error::{Result, RouterError};
use crate::generator::{Generator, ModelRole};
use crate::linear::{freeze, thaw, LogisticModel};

/// One classified query.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Classification {
    pub label: QueryClass,
    /// P(global).
    pub p_global: f32,
}

impl Classification {
    fn from_p_global(p_global: f64, threshold: f64) -> Self {
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

/// What a classifier may use.
pub struct ClassifyWith<'a> {
    pub embedder: &'a dyn Embedder,
    pub generator: &'a mut dyn Generator,
}

/// Labels queries, a batch at a time.
pub trait QueryClassifier {
    /// A short name for decision records (`learned`, `zero_shot`).
    fn name(&self) -> &'static str;
    fn classify(
        &self,
        queries: &[&str],
        with: &mut ClassifyWith<'_>,
    ) -> Result<Vec<Classification>>;
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

/// Logistic regression over the query's sentence embedding.
#[derive(Debug, Clone)]
pub struct LearnedClassifier {
    pub model: LearnedClassifierModel,
}

/// L2 penalty of the fit: strong enough that 384 features on a few hundred rows do not overfit.
const L2: f64 = 1e-2;

impl LearnedClassifier {
    /// Fit on labelled queries.
    pub fn fit(embedder: &dyn Embedder, queries: &[&str], labels: &[QueryClass]) -> Result<Self> {
        let rows = embedder.embed(queries)?;
        let targets: Vec<bool> = labels.iter().map(|&l| l == QueryClass::Global).collect();
        Ok(Self {
            model: LearnedClassifierModel {
                embedder_id: embedder.id(),
                logistic: LogisticModel::fit(&rows, &targets, L2)?,
                threshold: 0.5,
            },
        })
    }

    pub fn save(&self, path: &Path) -> Result<String> {
        freeze(&self.model, path)
    }

    pub fn load(path: &Path) -> Result<Self> {
        Ok(Self { model: thaw(path)? })
    }
}

impl QueryClassifier for LearnedClassifier {
    fn name(&self) -> &'static str {
        "learned"
    }

    fn classify(
        &self,
        queries: &[&str],
        with: &mut ClassifyWith<'_>,
    ) -> Result<Vec<Classification>> {
        if with.embedder.id() != self.model.embedder_id {
            return Err(RouterError::Invalid(format!(
                "the classifier was trained on {} embeddings, not {}",
                self.model.embedder_id,
                with.embedder.id()
            )));
        }
        with.embedder
            .embed(queries)?
            .iter()
            .map(|row| {
                let p = self.model.logistic.predict(row)?;
                Ok(Classification::from_p_global(p, self.model.threshold))
            })
            .collect()
    }
}

const ZERO_SHOT_SYSTEM: &str = "You sort questions asked about a collection of documents.";

fn zero_shot_prompt(query: &str) -> String {
    format!(
        "Question: {query}\n\nDoes this question ask for a fact or for a summary? Answer with \
         one word: fact or summary."
    )
}

/// The router model reads the query and is asked whether one passage's fact answers it;
/// P(global) is its probability of "no" against "yes".
#[derive(Debug, Clone)]
pub struct ZeroShotClassifier {
    /// P(global) at or above which a query is global: 0.5 as the model says, or a threshold
    /// calibrated on labelled queries (`triage train classifier --zero-shot-model`).
    pub threshold: f64,
}

impl Default for ZeroShotClassifier {
    fn default() -> Self {
        Self { threshold: 0.5 }
    }
}

fn single_token(generator: &dyn Generator, words: &[&str]) -> Result<Vec<u32>> {
    let model = generator.model(ModelRole::Router)?;
    let mut ids = Vec::new();
    for w in words {
        let t = model.tokenizer.encode(w, false, false)?;
        if t.len() == 1 && !ids.contains(&t[0]) {
            ids.push(t[0]);
        }
    }
    if ids.is_empty() {
        return Err(RouterError::Invalid(format!(
            "the router model has no single token for {words:?}"
        )));
    }
    Ok(ids)
}

fn pooled(logprobs: &[(u32, f32)], ids: &[u32]) -> f64 {
    let values: Vec<f64> = logprobs
        .iter()
        .filter(|(id, _)| ids.contains(id))
        .map(|(_, lp)| f64::from(*lp))
        .collect();
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return max;
    }
    max + values.iter().map(|v| (v - max).exp()).sum::<f64>().ln()
}

impl QueryClassifier for ZeroShotClassifier {
    fn name(&self) -> &'static str {
        "zero_shot"
    }

    fn classify(
        &self,
        queries: &[&str],
        with: &mut ClassifyWith<'_>,
    ) -> Result<Vec<Classification>> {
        let a = single_token(with.generator, &["fact", "Fact", " fact", " Fact"])?;
        let b = single_token(
            with.generator,
            &["summary", "Summary", " summary", " Summary"],
        )?;
        let scored: Vec<u32> = a.iter().chain(&b).copied().collect();
        let requests: Vec<GenerateRequest> = queries
            .iter()
            .map(|q| GenerateRequest {
                prompt: Prompt::Chat(vec![
                    ChatMessage::new("system", ZERO_SHOT_SYSTEM),
                    ChatMessage::new("user", zero_shot_prompt(q)),
                ]),
                params: SamplingParams {
                    temperature: 0.0,
                    max_tokens: Some(1),
                    ignore_eos: true,
                    score_token_ids: scored.clone(),
                    ..SamplingParams::default()
                },
                entropy: EntropySettings::default(),
            })
            .collect();
        let outputs = with
            .generator
            .generate(ModelRole::Router, &requests, &mut |_, _, _| true)?;
        outputs
            .iter()
            .map(|out| {
                let token = out.tokens.first().ok_or_else(|| {
                    RouterError::Invalid("the zero-shot classifier produced no token".into())
                })?;
                let (la, lb) = (
                    pooled(&token.scored_logprobs, &a),
                    pooled(&token.scored_logprobs, &b),
                );
                let p_global = 1.0 / (1.0 + (la - lb).exp());
                Ok(Classification::from_p_global(p_global, self.threshold))
            })
            .collect()
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
        .map_err(|e| RouterError::Invalid(format!("reading {}: {e}", path.display())))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: LabelledQuery = serde_json::from_str(line)
            .map_err(|e| RouterError::Invalid(format!("{}:{}: {e}", path.display(), i + 1)))?;
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(RouterError::Invalid(format!(
            "{} has no rows",
            path.display()
        )));
    }
    Ok(rows)
}

/// Whether a group is held out: a stable hash of its name, one group in `1/every`.
pub fn is_held_out(group: &str, every: u64) -> bool {
    // FNV-1a: stable across runs and platforms, unlike the std hasher.
    triage_core::fnv1a(group).is_multiple_of(every.max(1))
}

/// How well a classifier labels `rows`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClassifierQuality {
    /// Fraction labelled correctly at the classifier's own threshold.
    pub accuracy: f64,
    /// Threshold-free: P(global) of a random global query above a random point query.
    pub auroc: Option<f64>,
}

/// The threshold on P(global) that labels `rows` best (ties: the middle of the best run), from
/// the classifier's scores; for calibrating the zero-shot classifier on training rows.
pub fn best_threshold(
    classifier: &dyn QueryClassifier,
    rows: &[&LabelledQuery],
    with: &mut ClassifyWith<'_>,
) -> Result<f64> {
    let queries: Vec<&str> = rows.iter().map(|r| r.query.as_str()).collect();
    let mut scored: Vec<(f64, bool)> = Vec::with_capacity(rows.len());
    for (chunk, labels) in queries.chunks(32).zip(rows.chunks(32)) {
        for (c, r) in classifier.classify(chunk, with)?.iter().zip(labels) {
            scored.push((f64::from(c.p_global), r.label == QueryClass::Global));
        }
    }
    Ok(threshold_for(scored))
}

/// The threshold on scores that labels `(score, is_global)` pairs best.
fn threshold_for(mut scored: Vec<(f64, bool)>) -> f64 {
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

/// Accuracy and AUROC of a classifier on `rows`.
pub fn evaluate(
    classifier: &dyn QueryClassifier,
    rows: &[&LabelledQuery],
    with: &mut ClassifyWith<'_>,
) -> Result<ClassifierQuality> {
    if rows.is_empty() {
        return Err(RouterError::Invalid("no rows to evaluate".into()));
    }
    let queries: Vec<&str> = rows.iter().map(|r| r.query.as_str()).collect();
    let mut classified = Vec::with_capacity(rows.len());
    for chunk in queries.chunks(32) {
        classified.extend(classifier.classify(chunk, with)?);
    }
    let correct = classified
        .iter()
        .zip(rows)
        .filter(|(c, r)| c.label == r.label)
        .count();
    let scores: Vec<f64> = classified.iter().map(|c| f64::from(c.p_global)).collect();
    let labels: Vec<bool> = rows.iter().map(|r| r.label == QueryClass::Global).collect();
    Ok(ClassifierQuality {
        accuracy: correct as f64 / rows.len() as f64,
        auroc: crate::linear::auroc(&scores, &labels),
    })
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
        assert!((threshold_for(scored) - 0.175).abs() < 1e-12);
        // One overlap: the best split still misclassifies one query.
        let scored = vec![
            (0.1, false),
            (0.4, false),
            (0.3, true),
            (0.6, true),
            (0.7, true),
        ];
        let t = threshold_for(scored);
        assert!(t > 0.1 && t <= 0.3, "{t}");
    }

    #[test]
    fn held_out_groups_are_a_stable_fifth() {
        let held: Vec<bool> = (0..1000)
            .map(|i| is_held_out(&format!("g{i}"), 5))
            .collect();
        let n = held.iter().filter(|&&h| h).count();
        assert!((150..250).contains(&n), "{n} of 1000 held out");
        assert_eq!(
            held,
            (0..1000)
                .map(|i| is_held_out(&format!("g{i}"), 5))
                .collect::<Vec<_>>()
        );
    }
}
