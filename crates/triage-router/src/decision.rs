//! The decision record every answer carries: what each stage saw and decided, why the final path
//! was taken, and tokens, time and cost per stage and per model.

use std::collections::BTreeMap;

use serde::Serialize;
use triage_engine::entropy_monitor::{EntropyEstimator, EntropyUnit};
use triage_retrieval::RetrievalFeatures;

use crate::answer_span::AnswerSignals;
use crate::classifier::QueryClass;
use crate::gain_policy::GainDecision;
use crate::generator::ModelRole;
use crate::routing_config::{Prices, RoutePath};

/// The classifier's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct ClassifierRecord {
    pub classifier: &'static str,
    pub label: QueryClass,
    pub p_global: f32,
}

/// The decide-then-retrieve gate.
#[derive(Debug, Clone, Serialize)]
pub struct GateRecord {
    /// Mean negative log-likelihood (nats) of the closed-book answer, EOS excluded.
    pub mean_nll: Option<f32>,
    pub threshold: f32,
    pub answered: bool,
    pub answer: String,
}

/// What retrieval found and what the gain policy said.
#[derive(Debug, Clone, Serialize)]
pub struct RetrievalRecord {
    /// `dense`, `dual` or `hybrid`: the search whose chunks went into the prompt.
    pub search: &'static str,
    pub reranker: &'static str,
    pub chunk_ids: Vec<String>,
    pub features: Option<RetrievalFeatures>,
    pub gain_policy: Option<GainDecision>,
}

/// The threshold the monitor applied, with what it means.
#[derive(Debug, Clone, Serialize)]
pub struct TauRecord {
    pub tau: f32,
    /// The model whose entropies are compared with τ.
    pub model: String,
    pub estimator: EntropyEstimator,
    pub unit: EntropyUnit,
    pub window: usize,
}

/// The entropy monitor over the RAG answer.
#[derive(Debug, Clone, Serialize)]
pub struct MonitorRecord {
    pub tau: TauRecord,
    /// Per generated token: its value under the estimator, and whether it was in the answer span.
    pub trace: Vec<f32>,
    pub in_answer_span: Vec<bool>,
    /// Mean over the answer span's first `window` tokens (the compared statistic).
    pub mean: Option<f32>,
    /// Generated tokens when the decision was made.
    pub decided_at: Option<usize>,
    /// `accept` or `escalate`.
    pub decision: &'static str,
    pub signals: AnswerSignals,
    /// P(wrong) from the combined score, when it decided (instead of τ).
    pub combined_p_wrong: Option<f64>,
    pub combined_threshold: Option<f64>,
    /// The RAG answer that was replaced, when it escalated.
    pub rag_answer: String,
}

/// Tokens and time of one stage.
#[derive(Debug, Clone, Serialize)]
pub struct StageRecord {
    /// `classify`, `gate`, `retrieve`, `rag` or `lc`.
    pub stage: &'static str,
    pub model: Option<ModelRole>,
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    pub ms: f64,
    pub cost: f64,
}

/// Token totals of one model.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ModelUsage {
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cost: f64,
}

/// The whole record.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord {
    pub path: RoutePath,
    /// Why this path answered.
    pub reason: String,
    /// The caller forced the route.
    pub forced: bool,
    /// The router's cost estimate of each allowed path before running (relative units).
    pub estimated_costs: BTreeMap<&'static str, f64>,
    pub classifier: Option<ClassifierRecord>,
    pub gate: Option<GateRecord>,
    pub retrieval: Option<RetrievalRecord>,
    pub monitor: Option<MonitorRecord>,
    pub stages: Vec<StageRecord>,
    pub cost: f64,
}

impl DecisionRecord {
    pub fn new(forced: bool) -> Self {
        Self {
            path: RoutePath::Rag,
            reason: String::new(),
            forced,
            estimated_costs: BTreeMap::new(),
            classifier: None,
            gate: None,
            retrieval: None,
            monitor: None,
            stages: Vec::new(),
            cost: 0.0,
        }
    }

    /// Record a stage's usage and add its cost.
    pub fn add_stage(
        &mut self,
        stage: &'static str,
        model: Option<ModelRole>,
        tokens: (usize, usize, usize),
        ms: f64,
        prices: &Prices,
    ) {
        let (prompt, cached, completion) = tokens;
        let cost = model.map_or(0.0, |m| prices.of(m).cost(prompt, cached, completion));
        self.cost += cost;
        self.stages.push(StageRecord {
            stage,
            model,
            prompt_tokens: prompt,
            cached_prompt_tokens: cached,
            completion_tokens: completion,
            ms,
            cost,
        });
    }

    /// Token totals per model role.
    pub fn usage_by_model(&self) -> BTreeMap<&'static str, ModelUsage> {
        let mut out: BTreeMap<&'static str, ModelUsage> = BTreeMap::new();
        for s in &self.stages {
            let Some(model) = s.model else { continue };
            let u = out.entry(model.as_str()).or_default();
            u.prompt_tokens += s.prompt_tokens;
            u.cached_prompt_tokens += s.cached_prompt_tokens;
            u.completion_tokens += s.completion_tokens;
            u.cost += s.cost;
        }
        out
    }
}
