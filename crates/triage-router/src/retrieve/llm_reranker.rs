//! The LLM relevance reranker: `triage-retrieval`'s `Reranker` over the base model's yes/no
//! judgements (`triage_engine::relevance`), all passages of a query in one batch.

use triage_engine::RelevanceJudge;
use triage_retrieval::{Reranker, RetrievalError};

use crate::error::RouterError;
use crate::generator::{Generator, ModelRole};

/// Reranks with the base model behind `generator`; scores are log p(yes) − log p(no).
pub struct LlmReranker<'a> {
    generator: &'a mut dyn Generator,
}

impl<'a> LlmReranker<'a> {
    pub fn new(generator: &'a mut dyn Generator) -> Self {
        Self { generator }
    }

    fn scores(&mut self, query: &str, passages: &[&str]) -> crate::Result<Vec<f32>> {
        let model = self.generator.model(ModelRole::Base)?;
        let judge = RelevanceJudge::new(&model.tokenizer)?;
        let requests: Vec<_> = passages.iter().map(|p| judge.request(query, p)).collect();
        let outputs = self
            .generator
            .generate(ModelRole::Base, &requests, &mut |_, _, _| true)?;
        outputs
            .iter()
            .map(|out| {
                out.tokens.first().map(|t| judge.score(t)).ok_or_else(|| {
                    RouterError::Invalid("a relevance judgement produced no token".into())
                })
            })
            .collect()
    }
}

impl Reranker for LlmReranker<'_> {
    fn score(&mut self, query: &str, passages: &[&str]) -> triage_retrieval::Result<Vec<f32>> {
        self.scores(query, passages)
            .map_err(|e| RetrievalError::Reranker(Box::new(e)))
    }
}
