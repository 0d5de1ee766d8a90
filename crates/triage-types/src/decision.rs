//! The decision record every answer carries: what each stage saw and decided, why the final path
//! was taken, and tokens, time and cost per stage and per model. The server returns it and
//! `results.jsonl` stores it, so it reads back from the JSON it writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::entropy::{EntropyEstimator, EntropyUnit};
use crate::float::{map_or_nan, or_nan, vec_or_nan};
use crate::routing::{ModelRole, Prices, QueryClass, RoutePath};
use crate::signals::{
    AnswerSignals, GainDecision, GroundingFeatures, ProbeStates, RetrievalFeatures,
};

/// The classifier's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifierRecord {
    /// The classifier's short name (`learned`, `zero_shot`).
    pub classifier: String,
    pub label: QueryClass,
    #[serde(deserialize_with = "or_nan")]
    pub p_global: f32,
}

/// The decide-then-retrieve gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRecord {
    /// Mean negative log-likelihood (nats) of the closed-book answer, EOS excluded.
    pub mean_nll: Option<f32>,
    /// ∞ (written `null`, read back as NaN) when the route was forced without a gate.
    #[serde(deserialize_with = "or_nan")]
    pub threshold: f32,
    pub answered: bool,
    pub answer: String,
}

/// The search whose chunks went into the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchKind {
    Dense,
    Dual,
    Hybrid,
}

/// Who reordered the retrieved candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RerankerKind {
    None,
    Llm,
}

/// What retrieval found and what the gain policy said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievalRecord {
    pub search: SearchKind,
    pub reranker: RerankerKind,
    pub chunk_ids: Vec<String>,
    pub features: Option<RetrievalFeatures>,
    pub gain_policy: Option<GainDecision>,
}

/// The threshold the monitor applied, with what it means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TauRecord {
    #[serde(deserialize_with = "or_nan")]
    pub tau: f32,
    /// The model whose entropies are compared with τ.
    pub model: String,
    pub estimator: EntropyEstimator,
    pub unit: EntropyUnit,
    pub window: usize,
}

/// What the monitor decided about the RAG answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MonitorVerdict {
    Accept,
    Escalate,
}

impl MonitorVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Escalate => "escalate",
        }
    }
}

/// The entropy monitor over the RAG answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MonitorRecord {
    pub tau: TauRecord,
    /// Per generated token: its value under the estimator, and whether it was in the answer span.
    #[serde(deserialize_with = "vec_or_nan")]
    pub trace: Vec<f32>,
    pub in_answer_span: Vec<bool>,
    /// Mean over the answer span's first `window` tokens (the compared statistic).
    pub mean: Option<f32>,
    /// Generated tokens when the decision was made.
    pub decided_at: Option<usize>,
    pub decision: MonitorVerdict,
    pub signals: AnswerSignals,
    /// How the answer stands on its retrieved chunks (absent in records written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grounding: Option<GroundingFeatures>,
    /// The residual stream for a probe, when `monitor.probe_layers` asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeStates>,
    /// The hidden-state probe's score at the last prompt token and its threshold, when one is
    /// configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_threshold: Option<f64>,
    /// P(wrong) from the combined score, when it decided (instead of τ).
    pub combined_p_wrong: Option<f64>,
    pub combined_threshold: Option<f64>,
    /// The RAG answer that was replaced, when it escalated.
    pub rag_answer: String,
}

/// A step of the pipeline that records tokens and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Classify,
    Gate,
    /// The gain policy's dense look before choosing the search.
    Policy,
    Retrieve,
    Rag,
    /// Short samples of the RAG answer, for their agreement with it.
    Samples,
    /// The base model asked whether the context bears its RAG answer out.
    SelfCheck,
    Lc,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classify => "classify",
            Self::Gate => "gate",
            Self::Policy => "policy",
            Self::Retrieve => "retrieve",
            Self::Rag => "rag",
            Self::Samples => "samples",
            Self::SelfCheck => "self_check",
            Self::Lc => "lc",
        }
    }
}

/// Tokens and time of one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageRecord {
    pub stage: Stage,
    pub model: Option<ModelRole>,
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    #[serde(deserialize_with = "or_nan")]
    pub ms: f64,
    #[serde(deserialize_with = "or_nan")]
    pub cost: f64,
}

/// Token totals of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelUsage {
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    #[serde(deserialize_with = "or_nan")]
    pub cost: f64,
}

/// The whole record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub path: RoutePath,
    /// Why this path answered.
    pub reason: String,
    /// The caller forced the route.
    pub forced: bool,
    /// The router's cost estimate of each allowed path before running (relative units), by the
    /// path's name.
    #[serde(deserialize_with = "map_or_nan")]
    pub estimated_costs: BTreeMap<String, f64>,
    pub classifier: Option<ClassifierRecord>,
    pub gate: Option<GateRecord>,
    pub retrieval: Option<RetrievalRecord>,
    pub monitor: Option<MonitorRecord>,
    pub stages: Vec<StageRecord>,
    #[serde(deserialize_with = "or_nan")]
    pub cost: f64,
    /// Why the long-context path was not available for this corpus (not allowed, too long for
    /// the model, or its prefix does not fit in the KV cache), when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_context_unavailable: Option<String>,
    /// Corpora whose pinned prefix was released to make room for this corpus's (they are
    /// pinned again when next asked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unpinned_corpora: Vec<String>,
    /// The stored generation of the corpus that answered (`name@generation` names its chunks
    /// exactly), where the corpus came from a store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus_generation: Option<u64>,
    /// Milliseconds from the decision to escalate the RAG answer (the monitor's or the probe's,
    /// mid-answer, or the verdict on the finished answer) to the long-context model's first
    /// token: what an escalation costs the client in waiting, where one happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_ms: Option<f64>,
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
            long_context_unavailable: None,
            unpinned_corpora: Vec::new(),
            corpus_generation: None,
            handoff_ms: None,
        }
    }

    /// Record a stage's usage and add its cost.
    pub fn add_stage(
        &mut self,
        stage: Stage,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A record with every part filled, non-finite values included.
    fn full_record() -> DecisionRecord {
        let mut d = DecisionRecord::new(false);
        d.path = RoutePath::Lc;
        d.reason = "entropy above tau".into();
        for (path, cost) in [("rag", 1.5e-4), ("lc", 2.5e-3), ("none", 5e-5)] {
            d.estimated_costs.insert(path.into(), cost);
        }
        d.classifier = Some(ClassifierRecord {
            classifier: "zero_shot".into(),
            label: QueryClass::Point,
            p_global: 0.125,
        });
        d.gate = Some(GateRecord {
            mean_nll: Some(0.75),
            threshold: f32::INFINITY,
            answered: false,
            answer: "Paris".into(),
        });
        d.retrieval = Some(RetrievalRecord {
            search: SearchKind::Dense,
            reranker: RerankerKind::Llm,
            chunk_ids: vec!["doc-1#0".into(), "doc-2#3".into()],
            features: Some(RetrievalFeatures {
                top1_dense: 0.8125,
                top2_margin: f32::NAN,
                mean_top5_dense: 0.5,
                dense_rerank_overlap: 0.7,
                rerank_top1_dense_rank: 11.0,
                structural_fraction: 0.1,
            }),
            gain_policy: Some(GainDecision {
                predicted_delta: -0.03,
                tau_h: 0.02,
                run_hybrid: false,
            }),
        });
        let prices = Prices::default();
        d.add_stage(
            Stage::Classify,
            Some(ModelRole::Router),
            (0, 0, 0),
            1.25,
            &prices,
        );
        d.add_stage(
            Stage::Gate,
            Some(ModelRole::Base),
            (50, 10, 4),
            20.5,
            &prices,
        );
        d.add_stage(Stage::Retrieve, None, (0, 0, 0), 3.0, &prices);
        d.add_stage(
            Stage::Rag,
            Some(ModelRole::Base),
            (300, 0, 12),
            80.0,
            &prices,
        );
        let lc = Some(ModelRole::LongContext);
        d.add_stage(Stage::Lc, lc, (2000, 1900, 8), 150.0, &prices);
        d.monitor = Some(MonitorRecord {
            tau: TauRecord {
                tau: 0.6,
                model: "qwen2.5-0.5b".into(),
                estimator: EntropyEstimator::FullSoftmax,
                unit: EntropyUnit::Nats,
                window: 30,
            },
            trace: vec![0.25, 1.5, 0.125],
            in_answer_span: vec![false, true, true],
            mean: Some(0.8125),
            decided_at: Some(3),
            decision: MonitorVerdict::Escalate,
            signals: AnswerSignals {
                mean_entropy: 0.625,
                span_mean_entropy: 0.8125,
                max_entropy: 1.5,
                mean_nll: 0.5,
                mean_top2_margin: f32::NAN,
                declined: false,
                min_token_prob: f32::NAN,
                span_max_entropy: f32::NAN,
                sample_agreement: f32::NAN,
                self_check: f32::NAN,
            },
            grounding: None,
            probe: None,
            probe_score: None,
            probe_threshold: None,
            combined_p_wrong: None,
            combined_threshold: None,
            rag_answer: "Lyon".into(),
        });
        d
    }

    /// `full_record` as the router wrote it before these types moved here (with `&'static str`
    /// names): the server's responses and `results.jsonl` carry this JSON.
    const WRITTEN_BEFORE: &str = r#"{"path":"lc","reason":"entropy above tau","forced":false,"estimated_costs":{"lc":0.0025,"none":0.00005,"rag":0.00015},"classifier":{"classifier":"zero_shot","label":"point","p_global":0.125},"gate":{"mean_nll":0.75,"threshold":null,"answered":false,"answer":"Paris"},"retrieval":{"search":"dense","reranker":"llm","chunk_ids":["doc-1#0","doc-2#3"],"features":{"top1_dense":0.8125,"top2_margin":null,"mean_top5_dense":0.5,"dense_rerank_overlap":0.7,"rerank_top1_dense_rank":11.0,"structural_fraction":0.1},"gain_policy":{"predicted_delta":-0.03,"tau_h":0.02,"run_hybrid":false}},"monitor":{"tau":{"tau":0.6,"model":"qwen2.5-0.5b","estimator":"full_softmax","unit":"nats","window":30},"trace":[0.25,1.5,0.125],"in_answer_span":[false,true,true],"mean":0.8125,"decided_at":3,"decision":"escalate","signals":{"mean_entropy":0.625,"span_mean_entropy":0.8125,"max_entropy":1.5,"mean_nll":0.5,"mean_top2_margin":null,"declined":false},"combined_p_wrong":null,"combined_threshold":null,"rag_answer":"Lyon"},"stages":[{"stage":"classify","model":"router","prompt_tokens":0,"cached_prompt_tokens":0,"completion_tokens":0,"ms":1.25,"cost":0.0},{"stage":"gate","model":"base","prompt_tokens":50,"cached_prompt_tokens":10,"completion_tokens":4,"ms":20.5,"cost":0.0000545},{"stage":"retrieve","model":null,"prompt_tokens":0,"cached_prompt_tokens":0,"completion_tokens":0,"ms":3.0,"cost":0.0},{"stage":"rag","model":"base","prompt_tokens":300,"cached_prompt_tokens":0,"completion_tokens":12,"ms":80.0,"cost":0.000336},{"stage":"lc","model":"long_context","prompt_tokens":2000,"cached_prompt_tokens":1900,"completion_tokens":8,"ms":150.0,"cost":0.001797}],"cost":0.0021875}"#;

    #[test]
    fn the_record_writes_the_json_it_always_wrote() {
        assert_eq!(
            serde_json::to_string(&full_record()).unwrap(),
            WRITTEN_BEFORE
        );
    }

    #[test]
    fn the_record_reads_back_what_it_writes_nulls_as_nan() {
        let back: DecisionRecord = serde_json::from_str(WRITTEN_BEFORE).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), WRITTEN_BEFORE);
        let gate = back.gate.as_ref().unwrap();
        assert!(gate.threshold.is_nan());
        let monitor = back.monitor.as_ref().unwrap();
        assert!(monitor.signals.mean_top2_margin.is_nan());
        assert_eq!(monitor.decision, MonitorVerdict::Escalate);
        assert_eq!(back.stages[4].stage, Stage::Lc);
        assert_eq!(back.stages[4].model, Some(ModelRole::LongContext));
        assert_eq!(back.estimated_costs["lc"], 2.5e-3);
    }

    #[test]
    fn grounding_and_the_span_signals_are_written_when_measured_and_read_back() {
        let mut record = full_record();
        let monitor = record.monitor.as_mut().unwrap();
        monitor.signals.min_token_prob = 0.25;
        monitor.signals.span_max_entropy = 1.5;
        monitor.grounding = Some(GroundingFeatures {
            verbatim: 1.0,
            chunk_rank: 2.0,
            chunk_score: 0.75,
            chunk_margin: f32::NAN,
            unsupported_words: 0.0,
            question_support: f32::NAN,
        });
        let json = serde_json::to_string(&record).unwrap();
        assert!(json.contains(r#""min_token_prob":0.25,"span_max_entropy":1.5},"grounding":{"verbatim":1.0,"chunk_rank":2.0,"chunk_score":0.75,"chunk_margin":null,"unsupported_words":0.0}"#), "{json}");
        let back: DecisionRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        let g = back.monitor.unwrap().grounding.unwrap();
        assert!(g.chunk_margin.is_nan() && g.chunk_rank == 2.0);
    }

    /// A record of an escalation carries its handoff time; one written before it existed, or of
    /// an answer that did not escalate, has none and writes none.
    #[test]
    fn the_handoff_time_is_written_only_where_an_answer_escalated() {
        let mut record = full_record();
        record.handoff_ms = Some(12.5);
        let json = serde_json::to_string(&record).unwrap();
        assert!(
            json.ends_with(r#""cost":0.0021875,"handoff_ms":12.5}"#),
            "{json}"
        );
        let back: DecisionRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.handoff_ms, Some(12.5));
        let old: DecisionRecord = serde_json::from_str(WRITTEN_BEFORE).unwrap();
        assert_eq!(old.handoff_ms, None);
    }

    #[test]
    fn names_are_what_serde_writes() {
        use Stage::*;
        for stage in [Classify, Gate, Policy, Retrieve, Rag, Samples, Lc] {
            let json = serde_json::to_string(&stage).unwrap();
            assert_eq!(json, format!("\"{}\"", stage.as_str()));
        }
        for verdict in [MonitorVerdict::Accept, MonitorVerdict::Escalate] {
            let json = serde_json::to_string(&verdict).unwrap();
            assert_eq!(json, format!("\"{}\"", verdict.as_str()));
        }
    }

    #[test]
    fn usage_adds_up_per_model() {
        let usage = full_record().usage_by_model();
        assert_eq!(
            usage.keys().copied().collect::<Vec<_>>(),
            ["base", "long_context", "router"]
        );
        assert_eq!(usage["base"].prompt_tokens, 350);
        assert_eq!(usage["base"].cached_prompt_tokens, 10);
        assert_eq!(usage["base"].completion_tokens, 16);
        let total: f64 = usage.values().map(|u| u.cost).sum();
        assert!((total - full_record().cost).abs() < 1e-15);
    }
}
