//! Retrieval: the gain policy's call between dense and hybrid search, then the search itself,
//! recording the chunks found and the retrieval features the combined score reads.

use std::time::Instant;

use triage_retrieval::Hit;

use super::run::{ms, Run};
use crate::error::Result;
use crate::retrieve::retriever::{RerankWith, RetrieveMode, RetrieveParams, Retriever};
use crate::{RagSearch, RerankSetting, RoutePath};
use triage_types::{RerankerKind, RetrievalRecord, SearchKind, Stage};

impl Run<'_, '_> {
    /// A retriever over this corpus without a generator (no reranking, no pseudo-passages).
    fn plain_retriever(&self) -> Retriever<'_> {
        Retriever {
            corpus: self.corpus.corpus,
            embedder: self.embedder,
            generator: None,
            backend: self.corpus.backend,
        }
    }

    /// Whether the gain policy sends this query to the hybrid search.
    pub(super) fn choose_hybrid(&mut self) -> Result<bool> {
        if self.always_hybrid() {
            return Ok(true);
        }
        let Some(policy) = &self.pipeline.gain_policy else {
            return Ok(false);
        };
        if !self.config().allows(RoutePath::Hybrid) {
            return Ok(false);
        }
        // Without a reranker the features come from the dense order; with one, `rag` records
        // them from the reranked pool, but the policy must decide before that search runs.
        let started = Instant::now();
        let features = self
            .plain_retriever()
            .dense_features(&self.request.question, None)?;
        let decision = policy.decide(&features)?;
        let prices = self.config().prices;
        self.record
            .add_stage(Stage::Policy, None, (0, 0, 0), ms(started), &prices);
        self.record.retrieval = Some(RetrievalRecord {
            search: SearchKind::Dense,
            reranker: RerankerKind::None,
            chunk_ids: Vec::new(),
            features: Some(features),
            gain_policy: Some(decision),
        });
        Ok(decision.run_hybrid || !self.config().allows(RoutePath::Rag))
    }

    pub(super) fn retrieve(&mut self, hybrid: bool) -> Result<Vec<Hit>> {
        let started = Instant::now();
        let settings = self.config().retrieval.clone();
        let mode = match (hybrid, settings.search) {
            (true, _) | (false, RagSearch::Hybrid) => RetrieveMode::Hybrid,
            (false, RagSearch::Dense) => RetrieveMode::Dense,
            (false, RagSearch::Dual) => RetrieveMode::Dual,
        };
        let params = RetrieveParams {
            mode,
            k: settings.k,
            candidates: settings.candidates.max(settings.k),
            ..RetrieveParams::default()
        };
        let rerank = match settings.rerank {
            RerankSetting::None => RerankWith::None,
            RerankSetting::Llm => RerankWith::Llm,
        };
        let mut retriever = Retriever {
            corpus: self.corpus.corpus,
            embedder: self.embedder,
            generator: Some(&mut *self.generator),
            backend: self.corpus.backend,
        };
        let mut found = retriever.retrieve(&self.request.question, &params, rerank)?;
        let previous = self.record.retrieval.take();
        if found.features.is_none() && previous.as_ref().is_none_or(|p| p.features.is_none()) {
            // No reranker ran: the features of the dense order, for the record and the
            // combined escalation score.
            let vector = found.query_vector.as_deref();
            found.features = Some(
                self.plain_retriever()
                    .dense_features(&self.request.question, vector)?,
            );
        }
        let prices = self.config().prices;
        // Base-model tokens of reranking and pseudo-passages are not itemised by the retriever;
        // the stage records its time.
        self.record
            .add_stage(Stage::Retrieve, None, (0, 0, 0), ms(started), &prices);
        self.record.retrieval = Some(RetrievalRecord {
            search: match mode {
                RetrieveMode::Hybrid => SearchKind::Hybrid,
                RetrieveMode::Dual => SearchKind::Dual,
                _ => SearchKind::Dense,
            },
            reranker: match settings.rerank {
                RerankSetting::None => RerankerKind::None,
                RerankSetting::Llm => RerankerKind::Llm,
            },
            chunk_ids: found.hits.iter().map(|h| h.chunk.id.clone()).collect(),
            features: found
                .features
                .or(previous.as_ref().and_then(|p| p.features)),
            gain_policy: previous.and_then(|p| p.gain_policy),
        });
        Ok(found.hits)
    }
}
