//! `triage bench escalate`: the mission's core sentence in one process. A RAG answer on the base
//! model, τ exceeded within its first tokens, and the long-context model answering over a
//! corpus prefix pinned in its cache, so that only the question is prefilled; timed from the
//! escalation decision to the long-context model's first token.
//!
//! It runs the library's own stages (`Pipeline::ask` over `RoleEngines`, the corpus store, the
//! long-context prompt and its pin); only the corpus is synthetic and the embedder the hashing
//! one, since no real embedder travels to a GPU machine and random weights answer noise anyway.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use triage_engine::EngineSet;
use triage_host::load_model;
use triage_models::model::Model;
use triage_models::DeviceSpec;
use triage_retrieval::WordOffsets;
use triage_retrieval::{ChunkerConfig, Corpus, CorpusStore, Document, HashingEmbedder};
use triage_router::{long_context_prompt, LongContextPrompt};
use triage_router::{
    Answer, AskRequest, CorpusView, Generator, ModelRole, Pipeline, RoleEngines, Route, RoutePath,
    RoutingConfig,
};
use triage_router::{DecisionRecord, MonitorVerdict, Stage, StageRecord};

use crate::bench::engine_config;
use crate::error::{bail, io_doing, DriverError, Result};

/// The hashing embedder's width: enough buckets that the synthetic documents' words rarely
/// collide.
const EMBEDDER: HashingEmbedder = HashingEmbedder { dim: 256 };

/// The scratch corpus's name.
const CORPUS: &str = "bench-escalate";

/// What to run.
#[derive(Debug, Clone)]
pub struct EscalateBenchConfig {
    pub model: String,
    pub lc_model: String,
    pub device: DeviceSpec,
    /// Tokens of the corpus prefix to pin (its documents are added while they fit).
    pub prefix_tokens: usize,
    pub tau: f32,
    /// Tokens each answer (RAG and long context) may take.
    pub answer_tokens: usize,
}

/// One escalation, measured.
#[derive(Debug, Serialize)]
pub struct EscalateBench {
    pub device: String,
    pub model: String,
    pub lc_model: String,
    /// Whether one engine played both roles (the same model).
    pub shared_engine: bool,
    pub documents: usize,
    /// Tokens of the long-context prompt's shared part (template, instructions, corpus).
    pub prefix_tokens: usize,
    /// Of those, the tokens pinned (whole blocks).
    pub pinned_tokens: usize,
    pub block_size: usize,
    /// Prefilling and pinning the prefix, cold.
    pub pin_ms: f64,
    pub tau: f32,
    pub window: usize,
    /// Mean entropy (nats) of the RAG answer's first `window` generated tokens.
    pub mean_entropy: f32,
    /// The monitor's statistic: the mean over the answer span (after any preamble); absent when
    /// no token reached the span (a random model's tokens may decode to nothing).
    pub span_mean_entropy: Option<f32>,
    /// RAG tokens generated when the monitor decided.
    pub decided_at: Option<usize>,
    /// The RAG answer escalated to the long-context model.
    pub escalated: bool,
    pub reason: String,
    /// From the escalation decision to the long-context model's first token.
    pub handoff_ms: Option<f64>,
    /// Blocks of the pinned prefix the long-context prompt found in the cache.
    pub prefix_blocks_reused: usize,
    /// Prompt tokens the long-context model found in the cache: the pinned blocks, and the block
    /// after them where the warm-up question shares its first tokens ("Question: ").
    pub lc_cached_tokens: usize,
    /// Prompt tokens the long-context model computed on escalation.
    pub tokens_prefilled_on_escalation: usize,
    pub lc_prompt_tokens: usize,
    pub rag_prompt_tokens: usize,
    pub rag_ms: f64,
    pub lc_ms: f64,
    /// The measured question, classification to the long-context answer's last token.
    pub total_ms: f64,
}

/// Words the synthetic documents are made of, so that questions share words with some of them.
const PLACES: &[&str] = &[
    "Lisbon",
    "Antwerp",
    "Genoa",
    "Bergen",
    "Valletta",
    "Gdansk",
    "Marseille",
    "Bristol",
    "Cadiz",
    "Riga",
    "Naples",
    "Hull",
];
const GOODS: &[&str] = &[
    "salt", "timber", "wool", "copper", "grain", "wine", "amber", "tin", "spices", "linen",
    "herring", "glass",
];

/// The `i`th synthetic document: a harbour record of about forty words.
fn document(i: usize) -> Document {
    let place = PLACES[i % PLACES.len()];
    let good = GOODS[(i / PLACES.len() + i) % GOODS.len()];
    let year = 1600 + (i * 7) % 300;
    let ships = 10 + (i * 13) % 90;
    Document {
        id: format!("record-{i}"),
        title: format!("Harbour record {i}"),
        text: format!(
            "In {year} the harbour of {place} logged {ships} ships carrying {good}. The \
             harbour master noted that the {good} came in before the autumn storms, and that \
             the quay at {place} was rebuilt the following spring with stone from the hills."
        ),
    }
}

/// Documents whose long-context prefix comes to at most about `tokens` tokens of `model` (at
/// least one document).
fn documents(model: &Model, tokens: usize) -> Result<Vec<Document>> {
    let mut docs = Vec::new();
    // The template, the instructions and the documents' heading.
    let mut total = LongContextPrompt::new(model, "")?.prefix.len();
    loop {
        let doc = document(docs.len());
        // As `corpus_text` lays a one-chunk document out.
        let text = format!("[{}] {}\n{}\n\n", doc.id, doc.title, doc.text);
        let n = model.tokenizer.encode(&text, false, false)?.len();
        if total + n > tokens && !docs.is_empty() {
            return Ok(docs);
        }
        total += n;
        docs.push(doc);
    }
}

/// The base and long-context engines (one engine for both when they name the same model), each
/// with room for the pinned prefix and a question's prompts.
fn role_engines(config: &EscalateBenchConfig) -> Result<RoleEngines> {
    let tokens = config.prefix_tokens + 8192;
    let mut set = EngineSet::new();
    let base = Arc::new(load_model(&config.model, config.device)?);
    set.add("base", base.clone(), engine_config(tokens, 4, false))?;
    let lc_name = if config.lc_model == config.model {
        "base"
    } else {
        let lc = Arc::new(load_model(&config.lc_model, config.device)?);
        set.add("long-context", lc, engine_config(tokens, 4, false))?;
        "long-context"
    };
    let mut roles = RoleEngines::new(set);
    roles.assign(ModelRole::Base, "base")?;
    roles.assign(ModelRole::LongContext, lc_name)?;
    Ok(roles)
}

/// Settings under which an answer takes RAG first and escalates: long context priced above RAG
/// (else a cached corpus may be read directly, and nothing escalates), no closed-book gate, τ as
/// given.
fn routing(config: &EscalateBenchConfig) -> RoutingConfig {
    let mut routing = RoutingConfig {
        actions: vec![RoutePath::Rag, RoutePath::Lc],
        rag_max_tokens: config.answer_tokens,
        lc_max_tokens: config.answer_tokens,
        ..RoutingConfig::default()
    };
    routing.prices.long_context.cached_prompt = 100.0;
    routing.monitor.tau = config.tau;
    routing
}

fn stage(record: &DecisionRecord, stage: Stage) -> Option<&StageRecord> {
    record.stages.iter().find(|s| s.stage == stage)
}

/// The engines with the corpus's prefix pinned on the long-context model.
struct Pinned {
    roles: RoleEngines,
    /// Holds the scratch corpus store.
    _store_dir: tempfile::TempDir,
    corpus: Corpus,
    documents: usize,
    lc: LongContextPrompt,
    pinned_tokens: usize,
    pin_ms: f64,
    block_size: usize,
}

/// Load the models, store the synthetic corpus and pin its long-context prefix.
fn pin(config: &EscalateBenchConfig, routing: &RoutingConfig) -> Result<Pinned> {
    let mut roles = role_engines(config)?;
    let lc_model = roles.model(ModelRole::LongContext)?;
    let docs = documents(&lc_model, config.prefix_tokens)?;
    let store_dir = tempfile::tempdir().map_err(io_doing("creating a scratch corpus store"))?;
    let store = CorpusStore::new(store_dir.path());
    let chunker = ChunkerConfig::default();
    store.ingest(CORPUS, &docs, &[], &EMBEDDER, &WordOffsets, chunker)?;
    let corpus = store.open(CORPUS)?;
    let lc = match long_context_prompt(&mut roles, &corpus, routing)? {
        Ok(lc) => lc,
        Err(why) => bail!("no long-context path: {why}"),
    };
    let started = Instant::now();
    let pinned = roles.pin_prefix(ModelRole::LongContext, &lc.prefix, None)?;
    lc_model.transformer.device().synchronize()?;
    let pin_ms = started.elapsed().as_secs_f64() * 1e3;
    let block_size = {
        let name = roles.engine_name(ModelRole::LongContext)?;
        let engine = roles
            .engines()
            .get(name)
            .ok_or_else(|| DriverError::Invalid("the engine is gone".into()))?;
        engine.scheduler().kv().block_size()
    };
    Ok(Pinned {
        roles,
        _store_dir: store_dir,
        corpus,
        documents: docs.len(),
        lc,
        pinned_tokens: pinned.num_tokens,
        pin_ms,
        block_size,
    })
}

/// Pin the corpus, ask a warm-up question, then measure one escalation.
pub fn bench_escalate(config: &EscalateBenchConfig) -> Result<EscalateBench> {
    if config.prefix_tokens == 0 || config.answer_tokens == 0 {
        bail!("--prefix-tokens and --answer-tokens must be at least 1");
    }
    let routing = routing(config);
    let window = routing.monitor.window;
    let mut p = pin(config, &routing)?;
    let pipeline = Pipeline::new(routing)?;
    let view = CorpusView {
        name: CORPUS,
        corpus: &p.corpus,
        backend: None,
        long_context: Ok(&p.lc),
    };
    let mut ask = |question: &str| {
        let request = AskRequest {
            corpus: CORPUS.into(),
            question: question.into(),
            route: Route::Auto,
            tau: Some(config.tau),
            max_tokens: Some(config.answer_tokens),
        };
        pipeline.ask(&mut p.roles, &EMBEDDER, &view, &request, &mut |_| {})
    };
    // A first question loads whatever the first use of each path loads (kernels, buffers), as
    // a serving process would have done long before; the second is measured.
    ask("Which goods reached the harbour of Lisbon before the storms?")?;
    let answer = ask("How many ships did the harbour of Genoa log?")?;
    measured(config, &p, window, &answer)
}

/// What the measured question's decision record shows.
fn measured(
    config: &EscalateBenchConfig,
    p: &Pinned,
    window: usize,
    answer: &Answer,
) -> Result<EscalateBench> {
    let record = &answer.decision;
    let monitor = record
        .monitor
        .as_ref()
        .ok_or_else(|| DriverError::Invalid("the RAG stage left no monitor record".into()))?;
    let lc_stage = stage(record, Stage::Lc);
    let rag_stage = stage(record, Stage::Rag);
    let head = &monitor.trace[..monitor.trace.len().min(window)];
    Ok(EscalateBench {
        device: config.device.to_string(),
        model: config.model.clone(),
        lc_model: config.lc_model.clone(),
        shared_engine: config.model == config.lc_model,
        documents: p.documents,
        prefix_tokens: p.lc.prefix.len(),
        pinned_tokens: p.pinned_tokens,
        block_size: p.block_size,
        pin_ms: p.pin_ms,
        tau: config.tau,
        window,
        mean_entropy: head.iter().sum::<f32>() / head.len().max(1) as f32,
        span_mean_entropy: monitor.mean,
        decided_at: monitor.decided_at,
        escalated: record.path == RoutePath::Lc && monitor.decision == MonitorVerdict::Escalate,
        reason: record.reason.clone(),
        handoff_ms: record.handoff_ms,
        prefix_blocks_reused: lc_stage.map_or(0, |s| {
            s.cached_prompt_tokens.min(p.pinned_tokens) / p.block_size
        }),
        lc_cached_tokens: lc_stage.map_or(0, |s| s.cached_prompt_tokens),
        tokens_prefilled_on_escalation: lc_stage
            .map_or(0, |s| s.prompt_tokens - s.cached_prompt_tokens),
        lc_prompt_tokens: lc_stage.map_or(0, |s| s.prompt_tokens),
        rag_prompt_tokens: rag_stage.map_or(0, |s| s.prompt_tokens),
        rag_ms: rag_stage.map_or(0.0, |s| s.ms),
        lc_ms: lc_stage.map_or(0.0, |s| s.ms),
        total_ms: answer.timings.total_ms,
    })
}
