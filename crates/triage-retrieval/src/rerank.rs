//! Reranking: a `Reranker` scores (query, passage) pairs and `rerank` reorders hits by that
//! score (ties by chunk id). The BERT cross-encoder from `triage-models` is one; the LLM
//! yes/no reranker on the engine comes with the routing pipeline.

use triage_models::bert::CrossEncoder;

use crate::corpus::Hit;
use crate::error::Result;

/// Scores passages for a query; higher is more relevant.
pub trait Reranker {
    fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>>;
}

impl Reranker for CrossEncoder {
    fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        Ok(CrossEncoder::score(self, query, passages)?)
    }
}

/// `hits` reordered by `reranker`, each hit's `score` replaced by the reranker's.
pub fn rerank(query: &str, hits: Vec<Hit>, reranker: &dyn Reranker) -> Result<Vec<Hit>> {
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
