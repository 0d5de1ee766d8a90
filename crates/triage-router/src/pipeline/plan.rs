//! The decisions made before any answer is generated: each path's estimated cost, the query
//! class, the closed-book gate and the gain policy, giving the first path to try.

use std::collections::BTreeMap;

use super::run::{rag_path, Run};
use crate::error::Result;
use crate::generator::ModelRole;
use crate::RoutePath;
use triage_types::QueryClass;

/// Tokens an answer is expected to take, for the cost estimates.
const EXPECTED_ANSWER_TOKENS: usize = 16;

/// Where the decisions before generation point.
pub(super) enum Plan {
    Lc(String),
    ClosedBook { answer: String, reason: String },
    Rag { hybrid: bool },
}

impl Run<'_, '_> {
    /// Relative cost of each allowed path for this question, before anything runs.
    pub(super) fn estimate_costs(&self) -> Result<BTreeMap<&'static str, f64>> {
        let prices = &self.config().prices;
        let base = self.generator.model(ModelRole::Base)?;
        let q = base
            .tokenizer
            .encode(&self.request.question, false, false)?
            .len();
        let mut out = BTreeMap::new();
        let chat_overhead = 40;
        if self.config().allows(RoutePath::None) {
            let cost = prices
                .base
                .cost(q + chat_overhead, 0, EXPECTED_ANSWER_TOKENS);
            out.insert(RoutePath::None.as_str(), cost);
        }
        if let Ok(lc) = &self.corpus.long_context {
            let corpus_tokens = lc.prefix.len();
            let per_chunk = corpus_tokens / self.corpus.corpus.chunks().len().max(1);
            let k = self.config().retrieval.k;
            let rag =
                prices
                    .base
                    .cost(q + chat_overhead + k * per_chunk, 0, EXPECTED_ANSWER_TOKENS);
            for path in [RoutePath::Rag, RoutePath::Hybrid] {
                if self.config().allows(path) {
                    out.insert(path.as_str(), rag);
                }
            }
            if self.config().allows(RoutePath::Lc) {
                let prompt = corpus_tokens + q + chat_overhead;
                out.insert(
                    RoutePath::Lc.as_str(),
                    prices
                        .long_context
                        .cost(prompt, corpus_tokens, EXPECTED_ANSWER_TOKENS),
                );
            }
        }
        Ok(out)
    }

    /// The decisions made before any answer is generated: classifier, cost estimates, the gate
    /// (which generates its closed-book answer) and the gain policy.
    pub(super) fn plan_steps(&mut self) -> Result<Plan> {
        if self.pipeline.classifier.is_some() {
            let label = self.classify()?;
            if label == QueryClass::Global && self.lc_available() {
                return Ok(Plan::Lc("classified as a global question".into()));
            }
        }
        let costs = &self.record.estimated_costs;
        let (lc, rag) = (costs.get("lc"), costs.get("rag").or(costs.get("hybrid")));
        if let (Some(lc), Some(rag)) = (lc, rag) {
            if lc <= rag && self.lc_available() {
                return Ok(Plan::Lc(format!(
                    "long context is estimated no dearer than RAG ({lc:.2e} vs {rag:.2e})"
                )));
            }
        }
        if let Some(threshold) = self.config().gate_nll {
            if self.config().allows(RoutePath::None) {
                let (answer, nll) = self.gate(threshold)?;
                if let Some(nll) = nll.filter(|n| *n < threshold) {
                    let reason = format!(
                        "closed-book answer is confident (mean NLL {nll:.3} < {threshold})"
                    );
                    return Ok(Plan::ClosedBook { answer, reason });
                }
            }
        }
        let rag_allowed =
            self.config().allows(RoutePath::Rag) || self.config().allows(RoutePath::Hybrid);
        if !rag_allowed {
            return Ok(Plan::Lc("no RAG path is allowed".into()));
        }
        Ok(Plan::Rag {
            hybrid: self.choose_hybrid()?,
        })
    }

    /// Decide the first answering path without answering.
    pub(super) fn plan_only(&mut self) -> Result<()> {
        match self.plan_steps()? {
            Plan::Lc(reason) => {
                self.record.path = RoutePath::Lc;
                self.record.reason = reason;
            }
            Plan::ClosedBook { reason, .. } => {
                self.record.path = RoutePath::None;
                self.record.reason = reason;
            }
            Plan::Rag { hybrid } => {
                self.record.path = rag_path(hybrid);
                self.record.reason = if self.lc_available() {
                    "retrieval first; the entropy monitor may still escalate to lc".into()
                } else {
                    "retrieval; no escalation path for this corpus".into()
                };
            }
        }
        Ok(())
    }
}
