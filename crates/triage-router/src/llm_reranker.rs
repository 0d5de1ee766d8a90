//! The LLM relevance reranker: `triage-retrieval`'s `Reranker` over an engine's yes/no
//! judgements (`triage_engine::relevance`), all passages of a query in one batch.

use triage_engine::llm_engine::LlmEngine;
use triage_engine::relevance::relevance_scores;
use triage_retrieval::{Reranker, RetrievalError};

/// Reranks with the model behind `engine`; scores are log p(yes) − log p(no).
pub struct LlmReranker<'a> {
    engine: &'a mut LlmEngine,
}

impl<'a> LlmReranker<'a> {
    pub fn new(engine: &'a mut LlmEngine) -> Self {
        Self { engine }
    }
}

impl Reranker for LlmReranker<'_> {
    fn score(&mut self, query: &str, passages: &[&str]) -> triage_retrieval::Result<Vec<f32>> {
        relevance_scores(self.engine, query, passages)
            .map_err(|e| RetrievalError::Reranker(Box::new(e)))
    }
}
