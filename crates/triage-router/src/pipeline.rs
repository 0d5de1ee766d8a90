//! The routing pipeline: one query through classify → decide-then-retrieve gate → retrieval (the
//! gain policy picks dense or hybrid) → RAG under the entropy monitor → escalation to the
//! long-context model over the corpus's cached prefix. Each path has an estimated cost; the
//! router tries the cheaper paths first and moves on when a stage's signal rules them out.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;
use triage_engine::entropy_monitor::{Decision, EntropyMonitor};
use triage_engine::generate::{EntropySettings, GenerateRequest, Prompt};
use triage_engine::sampler::SamplingParams;
use triage_models::chat_template::ChatMessage;
use triage_retrieval::{Corpus, Embedder, Hit, SearchBackend};

use crate::answer_span::{AnswerSignals, AnswerSpanFilter, FromTokens, SpanMonitor};
use crate::classifier::{
    ClassifyWith, LearnedClassifier, QueryClass, QueryClassifier, ZeroShotClassifier,
};
use crate::combined_score::{self, CombinedScore};
use crate::decision::{
    ClassifierRecord, DecisionRecord, GateRecord, MonitorRecord, MonitorVerdict, RerankerKind,
    RetrievalRecord, SearchKind, Stage, TauRecord,
};
use crate::error::{Result, RouterError};
use crate::gain_policy::GainPolicy;
use crate::generator::{Generated, Generator, ModelRole};
use crate::long_context::LongContextPrompt;
use crate::retriever::{RerankWith, RetrieveMode, RetrieveParams, Retriever};
use crate::routing_config::{
    ClassifierSetting, RagSearch, RerankSetting, Route, RoutePath, RoutingConfig, UNANSWERABLE,
};

/// Tokens an answer is expected to take, for the cost estimates.
const EXPECTED_ANSWER_TOKENS: usize = 16;

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
    pub by_model: BTreeMap<&'static str, crate::decision::ModelUsage>,
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
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("config", &self.config)
            .finish()
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn greedy(prompt: Prompt, max_tokens: usize, top_logprobs: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            logprobs: top_logprobs > 0,
            top_logprobs,
            ..SamplingParams::default()
        },
        entropy: EntropySettings::default(),
    }
}

fn usage_of(g: &Generated) -> (usize, usize, usize) {
    (
        g.usage.prompt_tokens,
        g.usage.cached_tokens,
        g.usage.completion_tokens,
    )
}

/// Whether a Self-Route answer declines.
fn declines(text: &str) -> bool {
    let t: String = text
        .trim()
        .chars()
        .filter(|c| c.is_alphanumeric() || c.is_whitespace())
        .collect::<String>()
        .to_lowercase();
    t.starts_with(UNANSWERABLE)
}

const GATE_SYSTEM: &str = "Answer the question with the answer only, in a few words.";
const RAG_SYSTEM: &str = "Answer the question using only the context. Reply with the answer \
only, in a few words.";

/// The decline instructions of the RAG and the long-context prompts.
const RAG_DECLINE: &str = "If the context does not contain the answer, reply exactly:";
const LC_DECLINE: &str = "If the documents do not contain the answer, reply exactly:";

/// The question, with the instruction to decline when `decline` is set.
fn question_text(question: &str, decline: bool, instruction: &str) -> String {
    if decline {
        format!("{}\n{instruction} {UNANSWERABLE}", question.trim())
    } else {
        question.trim().to_string()
    }
}

fn rag_user(question: &str, hits: &[Hit], decline: bool) -> String {
    let mut context = String::new();
    for (i, h) in hits.iter().enumerate() {
        context.push_str(&format!(
            "[{}] {}\n{}\n\n",
            i + 1,
            h.chunk.title,
            h.chunk.text.trim()
        ));
    }
    format!(
        "Context:\n\n{context}Question: {}",
        question_text(question, decline, RAG_DECLINE)
    )
}

/// Where the decisions before generation point.
enum Plan {
    Lc(String),
    ClosedBook { answer: String, reason: String },
    Rag { hybrid: bool },
}

/// What the RAG stage produced.
struct RagOutcome {
    generated: Generated,
    /// Why the answer should be escalated; `None` when it is accepted.
    escalation: Option<String>,
}

/// The path a RAG answer takes.
fn rag_path(hybrid: bool) -> RoutePath {
    if hybrid {
        RoutePath::Hybrid
    } else {
        RoutePath::Rag
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
        Ok(Self {
            config,
            classifier,
            gain_policy,
            combined,
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
        let text = match request.route {
            Route::Auto => run.auto()?,
            Route::None => run.forced_none()?,
            Route::Rag => run.forced_rag(false)?,
            Route::Hybrid => run.forced_rag(true)?,
            Route::Lc => run.long_context("route forced to lc")?,
        };
        Ok(finish(text, run.record, start))
    }
}

impl Pipeline {
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
        let forced = match request.route {
            Route::Auto => None,
            Route::None => Some(RoutePath::None),
            Route::Rag => Some(RoutePath::Rag),
            Route::Hybrid => Some(RoutePath::Hybrid),
            Route::Lc => Some(RoutePath::Lc),
        };
        match forced {
            Some(path) => {
                run.record.path = path;
                run.record.reason = format!("route forced to {}", path.as_str());
            }
            None => run.plan_only()?,
        }
        Ok(run.record)
    }
}

fn validate(request: &AskRequest) -> Result<()> {
    if request.question.trim().is_empty() {
        return Err(RouterError::Invalid("the question is empty".into()));
    }
    if request.tau.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
        return Err(RouterError::Invalid(
            "tau must be a finite number >= 0".into(),
        ));
    }
    if request.max_tokens == Some(0) {
        return Err(RouterError::Invalid("max_tokens must be at least 1".into()));
    }
    Ok(())
}

fn finish(text: String, decision: DecisionRecord, start: Instant) -> Answer {
    let by_model = decision.usage_by_model();
    let sum = |f: fn(&crate::decision::StageRecord) -> usize| -> usize {
        decision.stages.iter().map(f).sum()
    };
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

/// One query in flight.
struct Run<'p, 'a> {
    pipeline: &'p Pipeline,
    generator: &'a mut dyn Generator,
    embedder: &'a dyn Embedder,
    corpus: &'a CorpusView<'a>,
    request: &'a AskRequest,
    events: &'a mut dyn FnMut(AnswerEvent),
    record: DecisionRecord,
}

impl<'p, 'a> Run<'p, 'a> {
    /// Check the request and estimate each path's cost.
    fn start(
        pipeline: &'p Pipeline,
        generator: &'a mut dyn Generator,
        embedder: &'a dyn Embedder,
        corpus: &'a CorpusView<'a>,
        request: &'a AskRequest,
        events: &'a mut dyn FnMut(AnswerEvent),
    ) -> Result<Self> {
        validate(request)?;
        let mut run = Run {
            pipeline,
            generator,
            embedder,
            corpus,
            request,
            events,
            record: DecisionRecord::new(request.route != Route::Auto),
        };
        run.record.estimated_costs = run
            .estimate_costs()?
            .into_iter()
            .map(|(path, cost)| (path.to_string(), cost))
            .collect();
        Ok(run)
    }

    fn config(&self) -> &RoutingConfig {
        &self.pipeline.config
    }

    fn max_tokens(&self, configured: usize) -> usize {
        self.request.max_tokens.unwrap_or(configured)
    }

    /// Relative cost of each allowed path for this question, before anything runs.
    fn estimate_costs(&self) -> Result<BTreeMap<&'static str, f64>> {
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

    fn announce(&mut self, path: RoutePath) {
        self.record.path = path;
        (self.events)(AnswerEvent::Route(path));
    }

    /// Send what the engine held back until the end (a stop-string prefix, partial UTF-8).
    fn stream_tail(&mut self, text: &str, streamed: usize) {
        let tail = text.get(streamed..).unwrap_or("");
        if !tail.is_empty() {
            (self.events)(AnswerEvent::Delta(tail.to_string()));
        }
    }

    fn lc_available(&self) -> bool {
        self.config().allows(RoutePath::Lc) && self.corpus.long_context.is_ok()
    }

    /// The decisions made before any answer is generated: classifier, cost estimates, the gate
    /// (which generates its closed-book answer) and the gain policy.
    fn plan_steps(&mut self) -> Result<Plan> {
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
    fn plan_only(&mut self) -> Result<()> {
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

    fn auto(&mut self) -> Result<String> {
        let hybrid = match self.plan_steps()? {
            Plan::Lc(reason) => return self.long_context(&reason),
            Plan::ClosedBook { answer, reason } => {
                self.record.reason = reason;
                self.announce(RoutePath::None);
                (self.events)(AnswerEvent::Delta(answer.clone()));
                return Ok(answer);
            }
            Plan::Rag { hybrid } => hybrid,
        };
        let can_escalate = self.lc_available();
        let outcome = self.rag(hybrid, can_escalate)?;
        let Some(why) = outcome.escalation else {
            let mean = self.record.monitor.as_ref().and_then(|m| m.mean);
            self.record.reason = format!(
                "the RAG answer's entropy stayed within τ (mean {})",
                mean.map_or("n/a".into(), |m| format!("{m:.3}"))
            );
            return Ok(outcome.generated.text);
        };
        if can_escalate {
            return self.long_context(&format!("escalated: {why}"));
        }
        let unavailable = match &self.corpus.long_context {
            Err(e) => e.clone(),
            Ok(_) => "the lc path is not allowed".into(),
        };
        // Without an escalation path `rag` streamed the answer as it came and recorded its path.
        self.record.reason = format!("{why}, but escalation is unavailable ({unavailable})");
        Ok(outcome.generated.text)
    }

    fn tau(&self) -> f32 {
        self.request.tau.unwrap_or(self.config().monitor.tau)
    }

    fn classify(&mut self) -> Result<QueryClass> {
        let Some(classifier) = self.pipeline.classifier.as_deref() else {
            return Ok(QueryClass::Point);
        };
        let started = Instant::now();
        let mut with = ClassifyWith {
            embedder: self.embedder,
            generator: &mut *self.generator,
        };
        let c = classifier
            .classify(&[self.request.question.as_str()], &mut with)?
            .pop()
            .ok_or_else(|| RouterError::Invalid("the classifier returned nothing".into()))?;
        let model = (classifier.name() == "zero_shot").then_some(ModelRole::Router);
        let prices = self.config().prices;
        self.record
            .add_stage(Stage::Classify, model, (0, 0, 0), ms(started), &prices);
        self.record.classifier = Some(ClassifierRecord {
            classifier: classifier.name().to_string(),
            label: c.label,
            p_global: c.p_global,
        });
        Ok(c.label)
    }

    /// The closed-book answer and its mean NLL (EOS excluded: the engine never emits it).
    fn gate(&mut self, threshold: f32) -> Result<(String, Option<f32>)> {
        let started = Instant::now();
        let request = greedy(
            Prompt::Chat(vec![
                ChatMessage::new("system", GATE_SYSTEM),
                ChatMessage::new("user", self.request.question.trim()),
            ]),
            self.max_tokens(self.config().gate_max_tokens),
            0,
        );
        let g = self
            .generator
            .generate(ModelRole::Base, &[request], &mut |_, _, _| true)?
            .remove(0);
        let nll = (!g.tokens.is_empty())
            .then(|| g.tokens.iter().map(|t| -t.logprob).sum::<f32>() / g.tokens.len() as f32);
        let prices = self.config().prices;
        self.record.add_stage(
            Stage::Gate,
            Some(ModelRole::Base),
            usage_of(&g),
            ms(started),
            &prices,
        );
        let answered = nll.is_some_and(|n| n < threshold);
        self.record.gate = Some(GateRecord {
            mean_nll: nll,
            threshold,
            answered,
            answer: g.text.trim().to_string(),
        });
        Ok((g.text.trim().to_string(), nll))
    }

    fn forced_none(&mut self) -> Result<String> {
        let threshold = self.config().gate_nll.unwrap_or(f32::INFINITY);
        let (answer, _) = self.gate(threshold)?;
        self.record.reason = "route forced to none".into();
        self.announce(RoutePath::None);
        (self.events)(AnswerEvent::Delta(answer.clone()));
        Ok(answer)
    }

    fn forced_rag(&mut self, hybrid: bool) -> Result<String> {
        let outcome = self.rag(hybrid, false)?;
        self.record.reason = format!("route forced to {}", rag_path(hybrid).as_str());
        Ok(outcome.generated.text)
    }

    /// Whether the gain policy sends this query to the hybrid search.
    fn choose_hybrid(&mut self) -> Result<bool> {
        let Some(policy) = &self.pipeline.gain_policy else {
            return Ok(false);
        };
        if !self.config().allows(RoutePath::Hybrid) {
            return Ok(false);
        }
        // Without a reranker the features come from the dense order; with one, `rag` records
        // them from the reranked pool, but the policy must decide before that search runs.
        let started = Instant::now();
        let mut retriever = Retriever {
            corpus: self.corpus.corpus,
            embedder: self.embedder,
            generator: None,
            backend: self.corpus.backend,
        };
        let features = retriever.dense_features(&self.request.question, None)?;
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

    fn retrieve(&mut self, hybrid: bool) -> Result<Vec<Hit>> {
        let started = Instant::now();
        let settings = self.config().retrieval.clone();
        let mode = match (hybrid, settings.search) {
            (true, _) => RetrieveMode::Hybrid,
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
            let mut dense = Retriever {
                corpus: self.corpus.corpus,
                embedder: self.embedder,
                generator: None,
                backend: self.corpus.backend,
            };
            let vector = found.query_vector.as_deref();
            found.features = Some(dense.dense_features(&self.request.question, vector)?);
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

    /// Retrieve, then answer with the base model under the monitor. With `can_escalate`, the
    /// answer's text is held until the monitor accepts it and generation stops at an
    /// escalation; otherwise it streams as it comes and the monitor only records.
    fn rag(&mut self, hybrid: bool, can_escalate: bool) -> Result<RagOutcome> {
        let hits = self.retrieve(hybrid)?;
        let started = Instant::now();
        let settings = self.config().monitor.clone();
        let base = self.generator.model(ModelRole::Base)?;
        let tau = self.tau();
        let combined = self.pipeline.combined.as_ref();
        if let Some(c) = &settings.calibration {
            if c.model != base.name {
                return Err(RouterError::Invalid(format!(
                    "τ was calibrated on {:?}, the base model is {:?}: run triage calibrate \
                     for this model",
                    c.model, base.name
                )));
            }
        }
        if let Some(c) = combined {
            if c.model.model_id != base.name {
                return Err(RouterError::Invalid(format!(
                    "the combined score was fitted on {:?}, the base model is {:?}",
                    c.model.model_id, base.name
                )));
            }
        }
        // With the combined score the monitor only records: the decision needs the whole answer.
        let monitor_tau = if combined.is_some() { f32::MAX } else { tau };
        let monitor = EntropyMonitor::new(
            monitor_tau,
            settings.window,
            settings.estimator,
            settings.unit,
        )?;
        let mut span = SpanMonitor::new(AnswerSpanFilter::new(&settings.preambles), monitor);
        // A decline escalates when long context can take over (Self-Route, or abstention
        // allowed: only long context sees everything); otherwise, with abstention allowed, it is
        // the answer.
        let abstain = self.config().abstain;
        let self_route = (settings.self_route || abstain) && can_escalate;
        let request = greedy(
            Prompt::Chat(vec![
                ChatMessage::new("system", RAG_SYSTEM),
                ChatMessage::new(
                    "user",
                    rag_user(&self.request.question, &hits, self_route || abstain),
                ),
            ]),
            self.max_tokens(self.config().rag_max_tokens),
            2,
        );
        let path = rag_path(hybrid);
        let mut held = String::new();
        let mut released = !can_escalate;
        let mut streamed = 0;
        let mut failure = None;
        if released {
            self.announce(path);
        }
        let events = &mut *self.events;
        let generated = self
            .generator
            .generate(ModelRole::Base, &[request], &mut |_, token, text| {
                let decision = match span.observe(token) {
                    Ok(d) => d,
                    Err(e) => {
                        failure = Some(e);
                        return false;
                    }
                };
                if released {
                    streamed += text.len();
                    events(AnswerEvent::Delta(text.to_string()));
                    return true;
                }
                held.push_str(text);
                match decision {
                    Decision::Escalate { .. } => !settings.stop_on_escalate,
                    Decision::Accept if combined.is_none() && !(self_route && declines(&held)) => {
                        released = true;
                        streamed += held.len();
                        events(AnswerEvent::Route(path));
                        events(AnswerEvent::Delta(std::mem::take(&mut held)));
                        true
                    }
                    _ => true,
                }
            })?
            .remove(0);
        if let Some(e) = failure {
            return Err(e);
        }
        let mut decision = span.finish();
        let declined = self_route && declines(&generated.text);
        let signals = AnswerSignals::from_tokens(
            &generated.tokens,
            &settings.preambles,
            settings.window,
            declined,
        );
        let features = self.record.retrieval.as_ref().and_then(|r| r.features);
        let p_wrong = match combined {
            Some(c) => {
                let row = combined_score::inputs(&signals, span.span_mean(), features.as_ref());
                let p = c.p_wrong(&row)?;
                if p >= c.model.threshold {
                    decision = Decision::Escalate {
                        at_step: generated.tokens.len(),
                    };
                }
                Some(p)
            }
            None => None,
        };
        // An answer without a single content token (empty, or only punctuation) answered
        // nothing, however calm its tokens were.
        let no_content = !span.trace.iter().any(|&(_, in_span)| in_span);
        if no_content && decision == Decision::Accept {
            decision = Decision::Escalate {
                at_step: generated.tokens.len(),
            };
        }
        let accepted = decision == Decision::Accept && !declined;
        let escalation = (!accepted).then(|| {
            if declined {
                "the base model said the context is insufficient".to_string()
            } else if no_content {
                "the RAG answer has no answer content".to_string()
            } else if let (Some(p), Some(c)) = (p_wrong, combined) {
                format!(
                    "the combined score puts P(wrong) at {p:.3} ≥ {}",
                    c.model.threshold
                )
            } else {
                format!(
                    "the RAG answer's mean entropy exceeded τ = {tau} by step {}",
                    span.decided_at.unwrap_or(0)
                )
            }
        });
        if accepted || !can_escalate {
            if !released {
                self.announce(path);
                (self.events)(AnswerEvent::Delta(generated.text.clone()));
            } else {
                // Text the engine held back to the end (a stop-string prefix, partial UTF-8).
                self.stream_tail(&generated.text, streamed);
            }
            self.record.path = path;
        }
        let prices = self.config().prices;
        self.record.add_stage(
            Stage::Rag,
            Some(ModelRole::Base),
            usage_of(&generated),
            ms(started),
            &prices,
        );
        let (trace, in_span): (Vec<f32>, Vec<bool>) = span.trace.iter().copied().unzip();
        self.record.monitor = Some(MonitorRecord {
            tau: TauRecord {
                tau,
                model: base.name.clone(),
                estimator: settings.estimator,
                unit: settings.unit,
                window: settings.window,
            },
            trace,
            in_answer_span: in_span,
            mean: span.span_mean(),
            decided_at: span.decided_at,
            decision: if accepted {
                MonitorVerdict::Accept
            } else {
                MonitorVerdict::Escalate
            },
            signals,
            combined_p_wrong: p_wrong,
            combined_threshold: combined.map(|c| c.model.threshold),
            rag_answer: generated.text.trim().to_string(),
        });
        Ok(RagOutcome {
            generated,
            escalation,
        })
    }

    /// Answer with the long-context model over the whole corpus; the corpus prefix is pinned in
    /// its cache, so only the question is prefilled.
    fn long_context(&mut self, reason: &str) -> Result<String> {
        let lc = match &self.corpus.long_context {
            Ok(lc) => *lc,
            Err(why) => {
                return Err(RouterError::Invalid(format!(
                    "the long-context path is unavailable for corpus {:?}: {why}",
                    self.corpus.name
                )))
            }
        };
        let started = Instant::now();
        let model = self.generator.model(ModelRole::LongContext)?;
        let request = greedy(
            Prompt::Tokens(lc.tokens(
                &model,
                &question_text(&self.request.question, self.config().abstain, LC_DECLINE),
            )?),
            self.max_tokens(self.config().lc_max_tokens),
            0,
        );
        self.record.reason = reason.to_string();
        self.announce(RoutePath::Lc);
        let events = &mut *self.events;
        let mut streamed = 0;
        let g = self
            .generator
            .generate(ModelRole::LongContext, &[request], &mut |_, _, text| {
                streamed += text.len();
                events(AnswerEvent::Delta(text.to_string()));
                true
            })?
            .remove(0);
        self.stream_tail(&g.text, streamed);
        let prices = self.config().prices;
        self.record.add_stage(
            Stage::Lc,
            Some(ModelRole::LongContext),
            usage_of(&g),
            ms(started),
            &prices,
        );
        Ok(g.text)
    }
}
