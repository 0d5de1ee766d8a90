//! The query classifier: point-extraction (retrieval can answer it) versus global synthesis
//! (summaries, themes, comparisons across documents: only the whole corpus can). Two
//! implementations behind one trait: a logistic regression over the sentence embedding, and the
//! router model zero-shot (the logprob of each label). The model-free halves (the logistic's
//! fit and score, the training file, the best threshold, accuracy and AUROC) are in
//! `triage-policy`; this file embeds and asks the model.

use std::path::Path;

use triage_engine::SamplingParams;
use triage_engine::{EntropySettings, GenerateRequest, Prompt};
use triage_models::chat_template::ChatMessage;
use triage_retrieval::Embedder;

use triage_policy::{
    best_threshold_of, freeze, thaw, Classification, ClassifierQuality, LabelledQuery,
    LearnedClassifierModel,
};
use triage_types::QueryClass;

use crate::error::{Result, RouterError};
use crate::generator::{Generator, ModelRole};

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

/// Logistic regression over the query's sentence embedding.
#[derive(Debug, Clone)]
pub struct LearnedClassifier {
    pub model: LearnedClassifierModel,
}

impl LearnedClassifier {
    /// Fit on labelled queries.
    pub fn fit(embedder: &dyn Embedder, queries: &[&str], labels: &[QueryClass]) -> Result<Self> {
        let rows = embedder.embed(queries)?;
        Ok(Self {
            model: LearnedClassifierModel::fit(embedder.id(), &rows, labels)?,
        })
    }

    pub fn save(&self, path: &Path) -> Result<String> {
        Ok(freeze(&self.model, path)?)
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
            .map(|row| Ok(self.model.classify(row)?))
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
    Ok(best_threshold_of(scored))
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
    Ok(ClassifierQuality::of(&classified, rows)?)
}
