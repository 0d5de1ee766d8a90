//! One retrieval call as the pipeline and `triage retrieve` make it: dense, BM25, hybrid or
//! dual-path search, optional reranking of the candidates, and the six features of the dense arm
//! whenever a reranker is present.

use triage_retrieval::{
    rerank, retrieval_features, CachedReranker, Corpus, Embedder, Hit, Reranker, RetrievalFeatures,
    SearchBackend, SearchMode, SearchOptions,
};

use crate::error::{Result, RouterError};
use crate::generator::Generator;
use crate::retrieve::llm_reranker::LlmReranker;
use crate::retrieve::pseudo_passage::{write_pseudo_passage, PSEUDO_PASSAGE_TOKENS};

/// Number of dense hits the features look at (the study's top 10).
const FEATURE_DEPTH: usize = 10;

/// How to search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetrieveMode {
    Dense,
    Bm25,
    Hybrid,
    /// Question and pseudo-passage arms, joint similarity (needs the generator engine).
    Dual,
}

/// Who reorders the candidates.
pub enum RerankWith<'r> {
    None,
    /// The LLM yes/no reranker on the retriever's engine.
    Llm,
    Custom(&'r mut dyn Reranker),
}

/// Settings of one retrieval.
#[derive(Debug, Clone, Copy)]
pub struct RetrieveParams {
    pub mode: RetrieveMode,
    /// Results returned.
    pub k: usize,
    /// Candidates per arm (and, with a reranker, the pool it reorders).
    pub candidates: usize,
    pub rrf_k: f32,
}

impl Default for RetrieveParams {
    fn default() -> Self {
        let search = SearchOptions::default();
        Self {
            mode: RetrieveMode::Hybrid,
            k: search.k,
            candidates: search.candidates,
            rrf_k: search.rrf_k,
        }
    }
}

/// What a retrieval found.
#[derive(Debug, Clone)]
pub struct Retrieval {
    pub hits: Vec<Hit>,
    /// The six features, when a reranker ran.
    pub features: Option<RetrievalFeatures>,
    /// The passage the model wrote, in dual mode.
    pub pseudo_passage: Option<String>,
    /// The question's embedding, when the search needed one (for callers that search again).
    pub query_vector: Option<Vec<f32>>,
}

/// Searches one corpus with its embedder; `generator`'s base model writes pseudo-passages and
/// runs the LLM reranker.
pub struct Retriever<'a> {
    pub corpus: &'a Corpus,
    pub embedder: &'a dyn Embedder,
    pub generator: Option<&'a mut dyn Generator>,
    /// Ranks dense, BM25 and hybrid searches (e.g. Milvus); `None` = the corpus's own indexes.
    /// Dual-path search always scores with the corpus's vectors.
    pub backend: Option<&'a dyn SearchBackend>,
}

impl Retriever<'_> {
    fn generator(&mut self) -> Result<&mut dyn Generator> {
        // A reborrow of the stored `&mut dyn Generator` (an `Option::as_deref_mut` would tie the
        // trait object's lifetime to the field's).
        match &mut self.generator {
            Some(g) => Ok(&mut **g),
            None => Err(RouterError::Invalid(
                "dual-path search and LLM reranking need a base model".into(),
            )),
        }
    }

    fn embed(&self, text: &str) -> Result<Vec<f32>> {
        let mut v = self.embedder.embed(&[text])?;
        v.pop()
            .ok_or_else(|| RouterError::Invalid("the embedder returned no vector".into()))
    }

    /// The six features with no reranker: the reranked order is the dense order itself (the
    /// two agreement features are then constant, and a policy fitted this way ignores them).
    /// `vector` is the question's embedding when the caller has it already.
    pub fn dense_features(
        &mut self,
        query: &str,
        vector: Option<&[f32]>,
    ) -> Result<RetrievalFeatures> {
        let vector = match vector {
            Some(v) => v.to_vec(),
            None => self.embed(query)?,
        };
        let options = SearchOptions {
            mode: SearchMode::Dense,
            k: FEATURE_DEPTH,
            ..SearchOptions::default()
        };
        let backend = self.backend.unwrap_or(self.corpus);
        let dense = self
            .corpus
            .search_with(backend, query, Some(&vector), &options)?;
        let scores: Vec<(String, f32)> = dense
            .iter()
            .map(|h| (h.chunk.id.clone(), h.dense_score.unwrap_or(f32::NAN)))
            .collect();
        let order: Vec<_> = dense
            .iter()
            .map(|h| (h.chunk.id.clone(), h.chunk.kind))
            .collect();
        Ok(retrieval_features(&scores, &order))
    }

    pub fn retrieve(
        &mut self,
        query: &str,
        params: &RetrieveParams,
        rerank_with: RerankWith<'_>,
    ) -> Result<Retrieval> {
        if params.k == 0 {
            return Err(RouterError::Invalid("k must be at least 1".into()));
        }
        let reranking = !matches!(rerank_with, RerankWith::None);
        let pool = if reranking {
            params.candidates.max(params.k)
        } else {
            params.k
        };
        let options = |mode| SearchOptions {
            mode,
            k: pool,
            candidates: params.candidates,
            rrf_k: params.rrf_k,
            exact: false,
        };
        let needs_vector = params.mode != RetrieveMode::Bm25 || reranking;
        let vector = if needs_vector {
            Some(self.embed(query)?)
        } else {
            None
        };
        let mut pseudo_passage = None;
        let mut hits = match params.mode {
            RetrieveMode::Dual => {
                let passage =
                    write_pseudo_passage(self.generator()?, query, PSEUDO_PASSAGE_TOKENS)?;
                let passage_vector = self.embed(&passage)?;
                pseudo_passage = Some(passage);
                let q = vector.as_deref().unwrap_or_default();
                self.corpus
                    .search_dual(q, &passage_vector, &options(SearchMode::Dense))?
            }
            mode => {
                let mode = match mode {
                    RetrieveMode::Dense => SearchMode::Dense,
                    RetrieveMode::Bm25 => SearchMode::Bm25,
                    _ => SearchMode::Hybrid,
                };
                let backend = self.backend.unwrap_or(self.corpus);
                self.corpus
                    .search_with(backend, query, vector.as_deref(), &options(mode))?
            }
        };
        // The features' dense arm, searched before the reranker borrows the engine.
        let dense = if reranking {
            let dense_options = SearchOptions {
                k: FEATURE_DEPTH,
                ..options(SearchMode::Dense)
            };
            let backend = self.backend.unwrap_or(self.corpus);
            self.corpus
                .search_with(backend, query, vector.as_deref(), &dense_options)?
        } else {
            Vec::new()
        };
        let mut llm;
        let inner: &mut dyn Reranker = match rerank_with {
            RerankWith::None => {
                hits.truncate(params.k);
                return Ok(Retrieval {
                    hits,
                    features: None,
                    pseudo_passage,
                    query_vector: vector,
                });
            }
            RerankWith::Llm => {
                llm = LlmReranker::new(self.generator()?);
                &mut llm
            }
            RerankWith::Custom(r) => r,
        };
        let mut memo = CachedReranker::new(inner);
        let dense_scores: Vec<(String, f32)> = dense
            .iter()
            .map(|h| (h.chunk.id.clone(), h.dense_score.unwrap_or(f32::NAN)))
            .collect();
        let reranked_dense = rerank(query, dense, &mut memo)?;
        let order: Vec<_> = reranked_dense
            .iter()
            .map(|h| (h.chunk.id.clone(), h.chunk.kind))
            .collect();
        let features = retrieval_features(&dense_scores, &order);
        let mut hits = rerank(query, hits, &mut memo)?;
        hits.truncate(params.k);
        Ok(Retrieval {
            hits,
            features: Some(features),
            pseudo_passage,
            query_vector: vector,
        })
    }
}
