//! `RoutingConfig`: every stage's policy, the actions the router may take and what each costs.
//! Read from the `[routing]` table of the engine's TOML; every field has a default.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use triage_engine::entropy_monitor::{EntropyEstimator, EntropyUnit, DEFAULT_WINDOW};
use triage_types::{Calibration, Prices, RoutePath};

use crate::error::{Result, RouterError};
use crate::generator::ModelRole;
use crate::signals::answer_span::DEFAULT_PREAMBLES;

/// What the caller asks for: let the router decide, or force one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    #[default]
    Auto,
    None,
    Rag,
    Hybrid,
    Lc,
}

impl std::str::FromStr for Route {
    type Err = RouterError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "none" => Ok(Self::None),
            "rag" => Ok(Self::Rag),
            "hybrid" => Ok(Self::Hybrid),
            "lc" => Ok(Self::Lc),
            other => Err(RouterError::Invalid(format!(
                "unknown route {other:?} (auto, none, rag, hybrid or lc)"
            ))),
        }
    }
}

/// Which query classifier runs first.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassifierSetting {
    #[default]
    Off,
    /// The router model, zero-shot (global when P(global) ≥ 0.5).
    ZeroShot,
    /// The router model, zero-shot, with the threshold `triage train classifier
    /// --zero-shot-model` calibrated on labelled queries.
    ZeroShotThreshold(f64),
    /// A file written by `triage train classifier`.
    Learned(PathBuf),
}

/// How the first retrieval searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RagSearch {
    #[default]
    Dense,
    /// Dense plus a pseudo-passage written by the base model.
    Dual,
    /// Dense and BM25 fused by RRF for every RAG answer, without asking the gain policy:
    /// corpora of identifiers (keys, codes, part numbers) that embeddings do not tell apart.
    Hybrid,
}

/// Who reorders the retrieved candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RerankSetting {
    /// Dense order; the retrieval features are still computed (reranked order = dense order).
    #[default]
    None,
    /// The base model's yes/no relevance judgements.
    Llm,
}

/// Retrieval for the RAG paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrievalSettings {
    pub search: RagSearch,
    pub rerank: RerankSetting,
    /// Chunks put in the prompt.
    pub k: usize,
    /// Candidates the reranker sees.
    pub candidates: usize,
    /// A file written by `triage train gain-policy`; without it the hybrid path is not taken
    /// automatically.
    pub gain_policy: Option<PathBuf>,
}

impl Default for RetrievalSettings {
    fn default() -> Self {
        Self {
            search: RagSearch::Dense,
            rerank: RerankSetting::None,
            k: 4,
            candidates: 10,
            gain_policy: None,
        }
    }
}

/// The entropy monitor of the RAG answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorSettings {
    /// τ: escalate when the mean over the answer span's first `window` tokens exceeds it.
    pub tau: f32,
    pub window: usize,
    pub estimator: EntropyEstimator,
    pub unit: EntropyUnit,
    /// Openings skipped before the answer span starts.
    pub preambles: Vec<String>,
    /// Let the base model answer "unanswerable" when the context lacks the answer, and escalate
    /// when it does. A forced RAG route asks the same prompt; there the decline is the answer.
    pub self_route: bool,
    /// Stop the RAG generation as soon as the monitor escalates.
    pub stop_on_escalate: bool,
    /// A combined score (`triage bench route --save-combined FILE`): when set, P(wrong) from the
    /// answer's signals and the retrieval features decides escalation instead of τ, once the
    /// answer is complete.
    pub combined_score: Option<PathBuf>,
    /// Where τ came from, when `triage calibrate` chose it: τ only holds for the model,
    /// estimator, unit and window it was calibrated with.
    pub calibration: Option<Calibration>,
    /// Short samples drawn from the RAG prompt (cached) after the greedy answer, whose
    /// agreement with it is a signal; 0 draws none. Their tokens are charged to the route.
    pub samples: usize,
    /// Tokens per sample.
    pub sample_tokens: usize,
    pub sample_temperature: f32,
    /// After the greedy answer, ask the base model (its RAG prompt cached) whether the context
    /// bears that answer out, and record log p(yes) − log p(no) as a signal (a decline is not
    /// checked). Its tokens (the answer, the question, one step) are charged to the route.
    pub self_check: bool,
    /// The model the self-check asks: the base model (its RAG prompt cached, a few dozen tokens)
    /// or the long-context model (a larger judge, which reads the whole RAG prompt).
    pub self_check_model: ModelRole,
    /// Layers (0-based) of the base model whose residual stream the RAG answer records for a
    /// hidden-state probe (`ProbeStates`); empty records none.
    pub probe_layers: Vec<usize>,
    /// Generated tokens whose states are kept: the first is the last prompt token's, the rest
    /// are averaged as the answer's.
    pub probe_steps: usize,
    /// A hidden-state probe (`triage signals --save-probe FILE`): when its score at the last
    /// prompt token exceeds its threshold, the RAG answer escalates at its first token.
    pub probe: Option<PathBuf>,
}

impl Default for MonitorSettings {
    fn default() -> Self {
        Self {
            tau: 0.6,
            window: DEFAULT_WINDOW,
            estimator: EntropyEstimator::FullSoftmax,
            unit: EntropyUnit::Nats,
            preambles: DEFAULT_PREAMBLES.iter().map(|s| s.to_string()).collect(),
            self_route: true,
            stop_on_escalate: true,
            combined_score: None,
            calibration: None,
            samples: 0,
            sample_tokens: 16,
            sample_temperature: 0.7,
            self_check: false,
            self_check_model: ModelRole::Base,
            probe_layers: Vec::new(),
            probe_steps: 4,
            probe: None,
        }
    }
}

/// The routing pipeline's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    pub classifier: ClassifierSetting,
    /// Decide-then-retrieve: answer closed book when the answer's mean NLL (nats) is below this;
    /// absent = no gate.
    pub gate_nll: Option<f32>,
    pub retrieval: RetrievalSettings,
    pub monitor: MonitorSettings,
    /// Paths the router may take (forced routes ignore this).
    pub actions: Vec<RoutePath>,
    /// Let the answering models reply "unanswerable" when the documents lack the answer (RAG
    /// then escalates when it can; long context's abstention is final).
    pub abstain: bool,
    pub prices: Prices,
    /// Generation caps per path.
    pub gate_max_tokens: usize,
    pub rag_max_tokens: usize,
    pub lc_max_tokens: usize,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            classifier: ClassifierSetting::Off,
            gate_nll: None,
            retrieval: RetrievalSettings::default(),
            monitor: MonitorSettings::default(),
            actions: vec![
                RoutePath::None,
                RoutePath::Rag,
                RoutePath::Hybrid,
                RoutePath::Lc,
            ],
            abstain: false,
            prices: Prices::default(),
            gate_max_tokens: 32,
            rag_max_tokens: 64,
            lc_max_tokens: 64,
        }
    }
}

impl RoutingConfig {
    /// Refuse settings no query could run with.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(RouterError::Invalid(m.to_string()));
        if !(self.monitor.tau.is_finite() && self.monitor.tau >= 0.0) {
            return bad("routing.monitor.tau must be a finite number >= 0");
        }
        if self.monitor.window == 0 {
            return bad("routing.monitor.window must be at least 1");
        }
        if self.retrieval.k == 0 {
            return bad("routing.retrieval.k must be at least 1");
        }
        if self.gate_nll.is_some_and(|g| !(g.is_finite() && g >= 0.0)) {
            return bad("routing.gate_nll must be a finite number >= 0");
        }
        if self.actions.is_empty() {
            return bad("routing.actions must allow at least one path");
        }
        if self.retrieval.search == RagSearch::Hybrid
            && self.allows(RoutePath::Rag)
            && !self.allows(RoutePath::Hybrid)
        {
            return bad(
                "routing.retrieval.search = \"hybrid\" answers every RAG question on the hybrid \
                 path: add \"hybrid\" to routing.actions",
            );
        }
        if self.gate_max_tokens == 0 || self.rag_max_tokens == 0 || self.lc_max_tokens == 0 {
            return bad("the routing max_tokens settings must be at least 1");
        }
        if let Some(c) = &self.monitor.calibration {
            let m = &self.monitor;
            if (c.estimator, c.unit, c.window) != (m.estimator, m.unit, m.window) {
                return Err(RouterError::Invalid(format!(
                    "routing.monitor.tau was calibrated with estimator {:?}, unit {:?}, window {} \
                     but the monitor uses {:?}, {:?}, {}: recalibrate or restore them",
                    c.estimator, c.unit, c.window, m.estimator, m.unit, m.window
                )));
            }
        }
        if !matches!(
            self.monitor.estimator,
            EntropyEstimator::FullSoftmax | EntropyEstimator::SampledNll
        ) {
            return bad("routing.monitor.estimator must be full_softmax or sampled_nll");
        }
        Ok(())
    }

    pub fn allows(&self, path: RoutePath) -> bool {
        self.actions.contains(&path)
    }
}
