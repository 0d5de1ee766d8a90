//! Reranking: a `Reranker` scores (query, passage) pairs and `rerank` reorders hits by that
//! score (ties by chunk id). The BERT cross-encoder from `triage-models` is one; the LLM
//! yes/no reranker lives in `triage-router`, which owns the engines. Scoring takes `&mut self`
//! because an LLM reranker steps its engine.

use std::collections::HashMap;

use triage_models::bert::CrossEncoder;

use crate::corpus::Hit;
use crate::error::{Result, RetrievalError};

/// Scores passages for a query; higher is more relevant.
pub trait Reranker {
    fn score(&mut self, query: &str, passages: &[&str]) -> Result<Vec<f32>>;
}

impl Reranker for CrossEncoder {
    fn score(&mut self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        Ok(CrossEncoder::score(self, query, passages)?)
    }
}

/// `hits` reordered by `reranker`, each hit's `score` replaced by the reranker's.
pub fn rerank(query: &str, hits: Vec<Hit>, reranker: &mut dyn Reranker) -> Result<Vec<Hit>> {
    let texts: Vec<&str> = hits.iter().map(|h| h.chunk.text.as_str()).collect();
    let scores = reranker.score(query, &texts)?;
    let mut scored: Vec<Hit> = hits
        .into_iter()
        .zip(scores)
        .map(|(mut h, s)| {
            h.score = s;
            h
        })
        .collect();
    scored.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.chunk.id.cmp(&b.chunk.id))
    });
    Ok(scored)
}

/// Remembers the scores of one query's passages, so reranking overlapping lists (the dense arm
/// for the features, the hybrid pool for the answer) scores each passage once.
pub struct CachedReranker<'r> {
    inner: &'r mut dyn Reranker,
    scores: HashMap<String, f32>,
}

impl<'r> CachedReranker<'r> {
    /// A cache for one query: scores are keyed by passage text alone.
    pub fn new(inner: &'r mut dyn Reranker) -> Self {
        Self {
            inner,
            scores: HashMap::new(),
        }
    }
}

impl Reranker for CachedReranker<'_> {
    fn score(&mut self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        let mut missing: Vec<&str> = Vec::new();
        for p in passages {
            if !self.scores.contains_key(*p) && !missing.contains(p) {
                missing.push(p);
            }
        }
        if !missing.is_empty() {
            let fresh = self.inner.score(query, &missing)?;
            if fresh.len() != missing.len() {
                return Err(RetrievalError::Invalid(format!(
                    "the reranker scored {} of {} passages",
                    fresh.len(),
                    missing.len()
                )));
            }
            for (p, s) in missing.iter().zip(fresh) {
                self.scores.insert((*p).to_string(), s);
            }
        }
        Ok(passages
            .iter()
            .map(|p| self.scores.get(*p).copied().unwrap_or(f32::NAN))
            .collect())
    }
}
