//! `triage eval`: run a suite's questions through each system (forced paths, the routed
//! baselines, the oracle), append every scored answer to `results.jsonl` (resumable), then write
//! `report.md`, `report.json` and the figures.

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use triage_eval::report;
use triage_eval::suites::{self, Example, Group, Split, SuiteName, SuiteParams};
use triage_eval::{AnswerParts, ResultRow, ResultsFile, RowContext};
use triage_host::load_embedder;
use triage_host::{Engine, TriageConfig};
use triage_retrieval::TokenOffsets;
use triage_retrieval::{BertEmbedder, ChunkerConfig, CorpusStore};
use triage_router::{AskRequest, ModelRole, Route, RoutePath, RoutingConfig};
use triage_router::{ClassifierSetting, RagSearch, UNANSWERABLE};

use crate::error::{bail, io, io_doing, other, Context, Result};

pub use triage_eval::System;

/// How each system asks the router: the route it forces and the routing settings it runs.
trait SystemRouting {
    fn route(self) -> Route;
    fn routing(self, base: &RoutingConfig, edar_classifier: &ClassifierSetting) -> RoutingConfig;
}

impl SystemRouting for System {
    fn route(self) -> Route {
        match self {
            Self::None => Route::None,
            Self::Rag => Route::Rag,
            Self::Hybrid => Route::Hybrid,
            Self::Lc => Route::Lc,
            _ => Route::Auto,
        }
    }

    /// The routing settings this system answers with, from the run's base settings.
    fn routing(self, base: &RoutingConfig, edar_classifier: &ClassifierSetting) -> RoutingConfig {
        let mut r = base.clone();
        match self {
            Self::Edar => {
                r.classifier = edar_classifier.clone();
                r.gate_nll = None;
                r.retrieval.search = RagSearch::Dense;
                r.retrieval.gain_policy = None;
                r.monitor.self_route = false;
                r.actions = vec![RoutePath::Rag, RoutePath::Lc];
            }
            Self::Dtr => {
                r.classifier = ClassifierSetting::Off;
                r.gate_nll = Some(base.gate_nll.unwrap_or(DTR_GATE_NLL));
                r.retrieval.search = RagSearch::Dual;
                r.retrieval.gain_policy = None;
                r.monitor.self_route = false;
                r.actions = vec![RoutePath::None, RoutePath::Rag];
            }
            Self::SelfRoute => {
                r.classifier = ClassifierSetting::Off;
                r.gate_nll = None;
                r.retrieval.search = RagSearch::Dense;
                r.retrieval.gain_policy = None;
                r.monitor.self_route = true;
                // Only the decline escalates.
                r.monitor.tau = f32::MAX;
                r.monitor.combined_score = None;
                r.monitor.calibration = None;
                r.actions = vec![RoutePath::Rag, RoutePath::Lc];
            }
            // auto is the configuration as given. Forced paths ignore the router's stages, and
            // their RAG prompt is the routing's own (with Self-Route's decline where it is on),
            // so the forced answers are the routed first stage that calibration and the
            // report's sweeps replay; a forced decline is the final answer.
            Self::Auto | Self::None | Self::Rag | Self::Hybrid | Self::Lc | Self::Oracle => {}
        }
        r
    }
}

/// The gate's threshold for `dtr` when the settings name none: a closed-book answer whose
/// mean NLL is below 0.3 nats (probability ≈ 0.74 per token) is kept.
pub const DTR_GATE_NLL: f32 = 0.3;

/// What to run.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    pub suite: SuiteName,
    pub systems: Vec<System>,
    pub out: PathBuf,
    pub limit: usize,
    pub seed: u64,
    pub split: Split,
    pub context_tokens: usize,
    /// Models and routing settings (defaults when absent).
    pub config: TriageConfig,
    /// The classifier `edar` runs first (see `default_edar_classifier`).
    pub edar_classifier: ClassifierSetting,
    pub quiet: bool,
}

/// The defaults of the CPU runs: ≤ 2k-token corpora keep prefill within minutes.
pub const DEFAULT_CONTEXT_TOKENS: usize = 2_000;

/// The routing settings' classifier; when they have none, the learned one `triage train
/// classifier` saved, or else the zero-shot router model.
pub fn default_edar_classifier(config: &RoutingConfig) -> ClassifierSetting {
    if config.classifier != ClassifierSetting::Off {
        return config.classifier.clone();
    }
    let trained = crate::train::default_classifier_path();
    if trained.exists() {
        ClassifierSetting::Learned(trained)
    } else {
        ClassifierSetting::ZeroShot
    }
}

/// A finished run: the rows of the suite's current questions and their report.
#[derive(Debug)]
pub struct EvalRun {
    pub rows: Vec<ResultRow>,
    pub report: report::Report,
}

/// Run (or resume) an evaluation; the report covers the questions the suite has at this
/// `limit` (rows of others, from an earlier run with another limit, stay in the file). Progress
/// is a bar on stderr unless `config.quiet`.
pub fn evaluate(config: &EvalConfig) -> Result<EvalRun> {
    let scratch = tempfile::tempdir().map_err(io_doing("creating a scratch corpus store"))?;
    let mut engine = eval_engine(config, scratch.path())?;
    let groups = build_groups(config, &engine)?;
    let base_routing = base_routing(config, &groups);
    let manifest = manifest(config, &base_routing)?;
    check_manifest(&config.out, &manifest)?;
    let mut results = ResultsFile::open(&config.out)?;
    let bar = progress_bar(config, &groups, &results)?;
    let embedder = load_embedder(&config.config.pipeline.embedder)?;
    let tokenizer = embedder.model.tokenizer().clone();
    let corpus = ScratchCorpus {
        store: CorpusStore::new(scratch.path()),
        embedder: &embedder,
        tokenizer: &tokenizer,
    };
    let mut answering = Answering {
        config,
        engine: &mut engine,
        results: &mut results,
        bar: &bar,
        base_routing: &base_routing,
    };
    answering.answer_groups(&groups, &corpus)?;
    bar.finish_and_clear();
    let rows = current_rows(&groups, &results);
    let report = write_report(&rows, &config.out, config.seed, &manifest)?;
    Ok(EvalRun { rows, report })
}

/// The engine a run answers with, over a scratch corpus store: the router model loaded only
/// when `edar` asks it zero-shot.
fn eval_engine(config: &EvalConfig, scratch: &Path) -> Result<Engine> {
    let mut triage_config = config.config.clone();
    let edar = &config.edar_classifier;
    let uses_router = config.systems.contains(&System::Edar)
        && matches!(
            edar,
            ClassifierSetting::ZeroShot | ClassifierSetting::ZeroShotThreshold(_)
        );
    if uses_router {
        // Load the router model with the engine: it is only loaded for a zero-shot setting.
        triage_config.routing.classifier = edar.clone();
    }
    triage_config.pipeline.prefix_dir = Some(scratch.join("prefixes"));
    triage_config.pipeline.corpora.clear();
    Ok(Engine::new(triage_config)?.with_store(scratch))
}

/// The run's routing settings: the config's, abstaining where the suite has unanswerable
/// questions (they are right only when abstained from: every system may abstain).
fn base_routing(config: &EvalConfig, groups: &[Group]) -> RoutingConfig {
    let mut base_routing = config.config.routing.clone();
    if groups
        .iter()
        .flat_map(|g| &g.examples)
        .any(|e| e.golds.is_empty())
    {
        base_routing.abstain = true;
    }
    base_routing
}

/// The progress bar over every answer the run gives, at the answers a resumed run already has
/// (hidden when `quiet`).
fn progress_bar(
    config: &EvalConfig,
    groups: &[Group],
    results: &ResultsFile,
) -> Result<ProgressBar> {
    let total: usize =
        groups.iter().map(|g| g.examples.len()).sum::<usize>() * config.systems.len();
    let done = groups
        .iter()
        .flat_map(|g| &g.examples)
        .flat_map(|e| config.systems.iter().map(move |s| (s, e)))
        .filter(|(s, e)| results.is_done(s.as_str(), &e.id))
        .count();
    let bar = if config.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total as u64)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} answers, eta {eta} {msg}",
        )
        .map_err(other("progress bar template"))?,
    );
    bar.set_prefix(format!(
        "{} {}",
        config.suite.as_str(),
        config.split.as_str()
    ));
    bar.set_position(done as u64);
    Ok(bar)
}

/// The scratch store a run's corpora go through, and the embedder that fills it.
struct ScratchCorpus<'a> {
    store: CorpusStore,
    embedder: &'a BertEmbedder,
    tokenizer: &'a dyn TokenOffsets,
}

/// A run in progress: the engine answering, the results file it appends to, the bar.
struct Answering<'a> {
    config: &'a EvalConfig,
    engine: &'a mut Engine,
    results: &'a mut ResultsFile,
    bar: &'a ProgressBar,
    base_routing: &'a RoutingConfig,
}

impl Answering<'_> {
    /// Answer every group's pending questions, loading a group's corpus only when some
    /// question of it is pending.
    fn answer_groups(&mut self, groups: &[Group], corpus: &ScratchCorpus<'_>) -> Result<()> {
        let mut previous: Vec<String> = Vec::new();
        for (gi, group) in groups.iter().enumerate() {
            if !self.pending(group) {
                continue;
            }
            self.bar
                .set_message(format!("corpus {}/{}: loading", gi + 1, groups.len()));
            load_group(self.engine, corpus, group, &previous)?;
            previous = group.documents.iter().map(|d| d.id.clone()).collect();
            self.bar
                .set_message(format!("corpus {}/{}", gi + 1, groups.len()));
            let at = RowContext {
                suite: self.config.suite.as_str(),
                split: self.config.split,
                group: &group.id,
            };
            for example in &group.examples {
                self.answer_example(&at, example)?;
            }
        }
        Ok(())
    }

    /// Whether some system has not yet answered some question of `group`.
    fn pending(&self, group: &Group) -> bool {
        group.examples.iter().any(|e| {
            self.config
                .systems
                .iter()
                .any(|s| !self.results.is_done(s.as_str(), &e.id))
        })
    }

    /// Each answering system's answer to `example` not yet in the results, then the oracle's.
    fn answer_example(&mut self, at: &RowContext<'_>, example: &Example) -> Result<()> {
        let systems = &self.config.systems;
        for &system in systems.iter().filter(|s| **s != System::Oracle) {
            if !self.results.is_done(system.as_str(), &example.id) {
                self.answer(at, system, example)?;
            }
        }
        if systems.contains(&System::Oracle) && !self.results.is_done("oracle", &example.id) {
            let rows: Vec<&ResultRow> = self
                .results
                .rows()
                .iter()
                .filter(|r| r.example == example.id)
                .collect();
            if let Some(row) = report::oracle_row(&rows) {
                self.results.append(row)?;
                self.bar.inc(1);
            }
        }
        Ok(())
    }

    /// One system's answer to `example`, scored and appended.
    fn answer(&mut self, at: &RowContext<'_>, system: System, example: &Example) -> Result<()> {
        let routing = system.routing(self.base_routing, &self.config.edar_classifier);
        self.engine.set_routing(routing)?;
        let answer = self
            .engine
            .ask(&AskRequest {
                corpus: EVAL_CORPUS.into(),
                question: example.question.clone(),
                route: system.route(),
                tau: None,
                max_tokens: None,
            })
            .with_context(|| format!("{} on {}", system.as_str(), example.id))?;
        let score = example
            .scorer
            .score(&answer.text, &example.golds, UNANSWERABLE);
        let parts = AnswerParts {
            text: &answer.text,
            prompt_tokens: answer.usage.prompt_tokens,
            cached_prompt_tokens: answer.usage.cached_prompt_tokens,
            completion_tokens: answer.usage.completion_tokens,
            total_ms: answer.timings.total_ms,
            decision: &answer.decision,
        };
        self.results
            .append(ResultRow::from_answer(at, system, example, parts, score))?;
        self.bar.inc(1);
        Ok(())
    }
}

/// The rows of the suite's current questions (not those of another limit's).
fn current_rows(groups: &[Group], results: &ResultsFile) -> Vec<ResultRow> {
    let current: std::collections::HashSet<&str> = groups
        .iter()
        .flat_map(|g| &g.examples)
        .map(|e| e.id.as_str())
        .collect();
    results
        .rows()
        .iter()
        .filter(|r| current.contains(r.example.as_str()))
        .cloned()
        .collect()
}

/// The suite's groups, corpora measured in the long-context model's tokens.
fn build_groups(config: &EvalConfig, engine: &Engine) -> Result<Vec<Group>> {
    // The tokenizer takes any text; were it to refuse one, 4 characters a token stands in.
    let count = |text: &str| engine.count_tokens(text).unwrap_or(text.len() / 4);
    let params = SuiteParams {
        split: config.split,
        seed: config.seed,
        limit: config.limit,
        context_tokens: config.context_tokens,
        count_tokens: &count,
        data_dir: triage_models::paths::data_dir(),
    };
    Ok(suites::build(config.suite, &params)?)
}

/// Write the suite's groups to `file`, one JSON line each (`id`, `documents`, and `examples`
/// cut to the limit as a run asks them), answering nothing: the same corpora and questions for
/// another engine. Returns the number of questions written.
pub fn export_suite(config: &EvalConfig, file: &Path) -> Result<usize> {
    let scratch = tempfile::tempdir().map_err(io_doing("creating a scratch corpus store"))?;
    let mut triage_config = config.config.clone();
    triage_config.pipeline.corpora.clear();
    let engine = Engine::new(triage_config)?.with_store(scratch.path());
    let groups = build_groups(config, &engine)?;
    let mut out = String::new();
    for group in &groups {
        out.push_str(&serde_json::to_string(group)?);
        out.push('\n');
    }
    std::fs::write(file, out).map_err(io("writing", &file))?;
    Ok(groups.iter().map(|g| g.examples.len()).sum())
}

/// What makes a run directory's answers comparable: the suite's identity (name, split, seed,
/// corpus length), the models and the routing settings. A rerun must match it to resume.
fn manifest(config: &EvalConfig, routing: &RoutingConfig) -> Result<serde_json::Value> {
    // The models by role, as run.json has always recorded them; the KV budget changes no
    // answer and is left out.
    let c = &config.config;
    let name = |role| c.model(role).map(|m| m.spec().to_string());
    let base = c.model(ModelRole::Base);
    let models = serde_json::json!({
        "router": name(ModelRole::Router),
        "base": name(ModelRole::Base),
        "long_context": name(ModelRole::LongContext),
        "embedder": c.pipeline.embedder,
        "device": base.map(|m| m.device),
        "kv_dtype": base.and_then(|m| m.kv_dtype.clone()),
    });
    Ok(serde_json::json!({
        "suite": config.suite.as_str(),
        "split": config.split.as_str(),
        "seed": config.seed,
        "context_tokens": config.context_tokens,
        "models": models,
        "routing": routing,
        "edar_classifier": config.edar_classifier,
        // Forced RAG has asked the routing's own prompt since this key was added; runs from
        // before (no key) asked without Self-Route's decline and must not be resumed into.
        "forced_rag_prompt": "as routed",
    }))
}

/// Write `dir/run.json` on a first run; on a rerun, refuse other settings.
fn check_manifest(dir: &Path, manifest: &serde_json::Value) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io("creating", &dir))?;
    let path = dir.join("run.json");
    if !path.exists() {
        std::fs::write(&path, serde_json::to_string_pretty(manifest)?)
            .map_err(io("writing", &path))?;
        return Ok(());
    }
    let text = std::fs::read_to_string(&path).map_err(io("reading", &path))?;
    let old: serde_json::Value =
        serde_json::from_str(&text).map_err(other(format!("parsing {}", path.display())))?;
    let differ: Vec<String> = manifest
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| !same_setting(old.get(k.as_str()), v))
        .map(|(k, v)| {
            let was = old
                .get(k.as_str())
                .map_or("nothing".into(), |o| o.to_string());
            format!("{k}: {was} → {v}")
        })
        .collect();
    if !differ.is_empty() {
        bail!(
            "{} holds a run with other settings ({}); use another --out",
            dir.display(),
            differ.join("; ")
        );
    }
    Ok(())
}

/// Whether a recorded setting equals the current one, where a key the record lacks counts as
/// null: a setting added since (an optional one, off by default) leaves older runs resumable.
fn same_setting(old: Option<&serde_json::Value>, new: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (old.unwrap_or(&Value::Null), new) {
        (Value::Object(o), Value::Object(n)) => o
            .keys()
            .chain(n.keys())
            .all(|k| same_setting(o.get(k), n.get(k).unwrap_or(&Value::Null))),
        (o, n) => o == n,
    }
}

/// The engine's name for the corpus being evaluated.
const EVAL_CORPUS: &str = "eval";

/// Replace the scratch corpus's documents with the group's and load it unpinned: the first
/// question that may take long context prefills and pins its prefix, so a run of RAG systems
/// alone never prefills a corpus on the long-context model.
fn load_group(
    engine: &mut Engine,
    corpus: &ScratchCorpus<'_>,
    group: &Group,
    previous: &[String],
) -> Result<()> {
    let stale: Vec<String> = previous
        .iter()
        .filter(|id| !group.documents.iter().any(|d| &d.id == *id))
        .cloned()
        .collect();
    corpus.store.ingest(
        EVAL_CORPUS,
        &group.documents,
        &stale,
        corpus.embedder,
        corpus.tokenizer,
        ChunkerConfig::default(),
    )?;
    let info = engine.load_corpus_unpinned(EVAL_CORPUS)?;
    if let Some(why) = info.long_context_unavailable {
        bail!(
            "group {}: the long-context model cannot take the corpus ({why}); lower \
             --context-tokens",
            group.id
        );
    }
    Ok(())
}

/// Write `report.md` (ending with the run's settings), `report.json` and the figures for `rows`
/// into `dir`.
fn write_report(
    rows: &[ResultRow],
    dir: &Path,
    seed: u64,
    manifest: &serde_json::Value,
) -> Result<report::Report> {
    let r = report::build(rows, seed);
    let md = dir.join("report.md");
    let text = report::markdown(&r) + &settings_section(manifest);
    std::fs::write(&md, text).map_err(io("writing", &md))?;
    let json = dir.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&r)?).map_err(io("writing", &json))?;
    triage_eval::plots::write_all(&r, dir)?;
    Ok(r)
}

/// The report's last section: what the run used, from its manifest.
fn settings_section(m: &serde_json::Value) -> String {
    let get = |path: &str| {
        m.pointer(path)
            .map_or("?".into(), |v| v.to_string().trim_matches('"').to_string())
    };
    format!(
        "\n## Settings\n\nBase model {}, long-context model {}, embedder {}; seed {}, corpora of \
         ≈ {} long-context tokens; τ = {} ({} over the first {} tokens, in {}); edar's \
         classifier {}; abstention {}. The whole set is in `run.json`.\n",
        get("/models/base"),
        get("/models/long_context"),
        get("/models/embedder"),
        get("/seed"),
        get("/context_tokens"),
        // τ is an f32: print it as one.
        m.pointer("/routing/monitor/tau")
            .and_then(serde_json::Value::as_f64)
            .map_or("?".into(), |t| (t as f32).to_string()),
        get("/routing/monitor/estimator"),
        get("/routing/monitor/window"),
        get("/routing/monitor/unit"),
        get("/edar_classifier"),
        get("/routing/abstain"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_baseline_has_its_settings() {
        let base = RoutingConfig::default();
        let zero = ClassifierSetting::ZeroShot;
        let edar = System::Edar.routing(&base, &zero);
        assert_eq!(edar.classifier, zero);
        assert_eq!(edar.actions, [RoutePath::Rag, RoutePath::Lc]);
        assert!(!edar.monitor.self_route && edar.gate_nll.is_none());
        let dtr = System::Dtr.routing(&base, &zero);
        assert_eq!(dtr.gate_nll, Some(DTR_GATE_NLL));
        assert_eq!(dtr.retrieval.search, RagSearch::Dual);
        assert!(!dtr.allows(RoutePath::Lc));
        let sr = System::SelfRoute.routing(&base, &zero);
        assert!(sr.monitor.self_route && sr.classifier == ClassifierSetting::Off);
        assert!(sr.validate().is_ok());
        // Forced RAG asks what auto's first stage asks.
        assert!(System::Rag.routing(&base, &zero).monitor.self_route);
        assert_eq!(System::Hybrid.routing(&base, &zero).monitor, base.monitor);
        assert_eq!(System::Hybrid.route(), Route::Hybrid);
        assert_eq!(System::Edar.route(), Route::Auto);
        // auto is the configuration as given.
        let mine = RoutingConfig {
            gate_nll: Some(0.7),
            ..RoutingConfig::default()
        };
        assert_eq!(System::Auto.routing(&mine, &zero), mine);
        assert_eq!(System::Auto.route(), Route::Auto);
    }
}
