//! The routing pipeline: one query through classify → decide-then-retrieve gate → retrieval (the
//! gain policy picks dense or hybrid) → RAG under the entropy monitor → escalation to the
//! long-context model over the corpus's cached prefix. Each path has an estimated cost; the
//! router tries the cheaper paths first and moves on when a stage's signal rules them out.
//!
//! This file holds the pipeline and the types callers see; `run` holds one query's state and
//! the order of the stages, and each stage has its own file.

pub(crate) mod classifier;
mod escalation;
mod gate;
mod hold_back;
mod long_context;
pub(crate) mod long_context_prompt;
mod plan;
mod prompts;
mod rag;
mod retrieve;
mod run;

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;
use triage_retrieval::{Corpus, Embedder, SearchBackend};

use crate::error::Result;
use crate::generator::Generator;
use crate::pipeline::classifier::{LearnedClassifier, QueryClassifier, ZeroShotClassifier};
use crate::pipeline::long_context_prompt::LongContextPrompt;
use crate::{ClassifierSetting, Route, RoutePath, RoutingConfig};
use triage_policy::CombinedScore;
use triage_policy::GainPolicy;
use triage_policy::ProbeModel;
use triage_types::{DecisionRecord, StageRecord};

use run::{ms, Run};

/// A corpus as the pipeline sees it.
pub struct CorpusView<'a> {
    pub name: &'a str,
    pub corpus: &'a Corpus,
    /// Ranks dense/BM25/hybrid searches (e.g. Milvus); `None` = the corpus's own indexes.
    pub backend: Option<&'a dyn SearchBackend>,
    /// The corpus prepared for the long-context model, or why it cannot be (too long, no model).
    pub long_context: std::result::Result<&'a LongContextPrompt, String>,
}

/// One question.
#[derive(Debug, Clone, Default)]
pub struct AskRequest {
    pub corpus: String,
    pub question: String,
    pub route: Route,
    /// Overrides the configured τ.
    pub tau: Option<f32>,
    /// Overrides the configured answer lengths.
    pub max_tokens: Option<usize>,
}

/// Token totals of an answer.
#[derive(Debug, Clone, Serialize)]
pub struct AnswerUsage {
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub by_model: BTreeMap<&'static str, triage_types::ModelUsage>,
}

/// Wall-clock time of an answer.
#[derive(Debug, Clone, Serialize)]
pub struct AnswerTimings {
    pub total_ms: f64,
    pub by_stage: BTreeMap<&'static str, f64>,
}

/// What `ask` returns.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    pub text: String,
    pub decision: DecisionRecord,
    pub usage: AnswerUsage,
    pub timings: AnswerTimings,
}

/// What a streaming caller receives. The answering path is announced before its first text; a
/// RAG answer's text is held until the monitor accepts it, so nothing streamed is retracted.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerEvent {
    /// The stored generation of the corpus about to answer, announced first by a host that
    /// loads corpora from a store (the pipeline itself never sends it).
    Corpus {
        generation: u64,
    },
    Route(RoutePath),
    Delta(String),
}

/// The configured pipeline (classifier and gain policy loaded).
pub struct Pipeline {
    pub config: RoutingConfig,
    classifier: Option<Box<dyn QueryClassifier + Send + Sync>>,
    gain_policy: Option<GainPolicy>,
    /// With a combined score, it (not the entropy mean) decides escalation.
    combined: Option<CombinedScore>,
    /// A hidden-state probe that may escalate a RAG answer at its first token.
    probe: Option<ProbeModel>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("config", &self.config)
            .finish()
    }
}

impl Pipeline {
    /// Load the classifier and gain policy the config names.
    pub fn new(config: RoutingConfig) -> Result<Self> {
        config.validate()?;
        let classifier: Option<Box<dyn QueryClassifier + Send + Sync>> = match &config.classifier {
            ClassifierSetting::Off => None,
            ClassifierSetting::ZeroShot => Some(Box::new(ZeroShotClassifier::default())),
            ClassifierSetting::ZeroShotThreshold(threshold) => Some(Box::new(ZeroShotClassifier {
                threshold: *threshold,
            })),
            ClassifierSetting::Learned(path) => Some(Box::new(LearnedClassifier::load(path)?)),
        };
        let gain_policy = match &config.retrieval.gain_policy {
            Some(path) => Some(GainPolicy::load(path)?),
            None => None,
        };
        let combined = match &config.monitor.combined_score {
            Some(path) => Some(CombinedScore::load(path)?),
            None => None,
        };
        let probe = match &config.monitor.probe {
            Some(path) => Some(ProbeModel::load(path)?),
            None => None,
        };
        Ok(Self {
            config,
            classifier,
            gain_policy,
            combined,
            probe,
        })
    }

    /// Answer one question.
    pub fn ask(
        &self,
        generator: &mut dyn Generator,
        embedder: &dyn Embedder,
        corpus: &CorpusView<'_>,
        request: &AskRequest,
        events: &mut dyn FnMut(AnswerEvent),
    ) -> Result<Answer> {
        let start = Instant::now();
        let mut run = Run::start(self, generator, embedder, corpus, request, events)?;
        let text = run.answer()?;
        Ok(finish(text, run.record, start))
    }

    /// Decide the first path for a question without answering it (`POST /v1/route`): the
    /// classifier, the cost estimates, the gate (its closed-book answer is generated but not
    /// returned) and the gain policy run; the RAG answer's monitor cannot, so a `rag` or `hybrid`
    /// plan may still escalate when the question is asked.
    pub fn plan(
        &self,
        generator: &mut dyn Generator,
        embedder: &dyn Embedder,
        corpus: &CorpusView<'_>,
        request: &AskRequest,
    ) -> Result<DecisionRecord> {
        let mut ignore = |_: AnswerEvent| {};
        let mut run = Run::start(self, generator, embedder, corpus, request, &mut ignore)?;
        run.plan()?;
        Ok(run.record)
    }
}

/// The answer, with its token and time totals summed from the record's stages.
fn finish(text: String, decision: DecisionRecord, start: Instant) -> Answer {
    let by_model = decision.usage_by_model();
    let sum = |f: fn(&StageRecord) -> usize| -> usize { decision.stages.iter().map(f).sum() };
    let prompt_tokens = sum(|s| s.prompt_tokens);
    let completion_tokens = sum(|s| s.completion_tokens);
    let mut by_stage = BTreeMap::new();
    for s in &decision.stages {
        *by_stage.entry(s.stage.as_str()).or_insert(0.0) += s.ms;
    }
    Answer {
        text,
        usage: AnswerUsage {
            prompt_tokens,
            cached_prompt_tokens: sum(|s| s.cached_prompt_tokens),
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            by_model,
        },
        timings: AnswerTimings {
            total_ms: ms(start),
            by_stage,
        },
        decision,
    }
}
