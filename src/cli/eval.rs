//! `triage eval`: run a suite's questions through each system (forced paths, the routed
//! baselines, the oracle), append every scored answer to `results.jsonl` (resumable), then write
//! `report.md`, `report.json` and the figures; and the routing TOML `triage calibrate` writes.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use triage_eval::report;
use triage_eval::suites::{self, Group, Split, SuiteName, SuiteParams};
use triage_eval::{AnswerParts, ResultRow, ResultsFile, RowContext};
use triage_retrieval::{ChunkerConfig, CorpusStore};
use triage_router::{Calibration, ClassifierSetting, RagSearch, RetrievalSettings, UNANSWERABLE};
use triage_router::{Route, RoutePath, RoutingConfig};

use triage::{AskRequest, Engine, ModelRole, TriageConfig};

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

/// Parse `none,rag,...`.
pub fn parse_systems(list: &str) -> Result<Vec<System>> {
    let mut out: Vec<System> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let s: System = name.parse()?;
        if !out.contains(&s) {
            out.push(s);
        }
    }
    if out.is_empty() {
        bail!("--systems names no system");
    }
    if out == [System::Oracle] {
        bail!("the oracle picks among none, rag, hybrid and lc: name some of them too");
    }
    Ok(out)
}

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
    let trained = crate::cli::train::default_classifier_path();
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
/// `--limit` (rows of others, from an earlier run with another limit, stay in the file).
pub fn run(config: &EvalConfig) -> Result<EvalRun> {
    let scratch = tempfile::tempdir().context("creating a scratch corpus store")?;
    let mut triage_config = config.config.clone();
    let edar = config.edar_classifier.clone();
    let uses_router = config.systems.contains(&System::Edar)
        && matches!(
            edar,
            ClassifierSetting::ZeroShot | ClassifierSetting::ZeroShotThreshold(_)
        );
    if uses_router {
        // Load the router model with the engine: it is only loaded for a zero-shot setting.
        triage_config.routing.classifier = edar.clone();
    }
    triage_config.pipeline.prefix_dir = Some(scratch.path().join("prefixes"));
    triage_config.pipeline.corpora.clear();
    let mut engine = Engine::new(triage_config)?.with_store(scratch.path());
    let groups = build_groups(config, &engine)?;
    // Unanswerable questions are right only when abstained from: every system may abstain.
    let mut base_routing = config.config.routing.clone();
    if groups
        .iter()
        .flat_map(|g| &g.examples)
        .any(|e| e.golds.is_empty())
    {
        base_routing.abstain = true;
    }
    let manifest = manifest(config, &base_routing)?;
    check_manifest(&config.out, &manifest)?;
    let mut results = ResultsFile::open(&config.out)?;
    let answering: Vec<System> = config
        .systems
        .iter()
        .copied()
        .filter(|s| *s != System::Oracle)
        .collect();
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
        .context("progress bar template")?,
    );
    bar.set_prefix(format!(
        "{} {}",
        config.suite.as_str(),
        config.split.as_str()
    ));
    bar.set_position(done as u64);
    let embedder = triage::load_embedder(&config.config.pipeline.embedder)?;
    let tokenizer = embedder.model.tokenizer().clone();
    let store = CorpusStore::new(scratch.path());
    let mut previous: Vec<String> = Vec::new();
    for (gi, group) in groups.iter().enumerate() {
        let pending = group.examples.iter().any(|e| {
            config
                .systems
                .iter()
                .any(|s| !results.is_done(s.as_str(), &e.id))
        });
        if !pending {
            continue;
        }
        bar.set_message(format!("corpus {}/{}: loading", gi + 1, groups.len()));
        load_group(&mut engine, &store, &embedder, &tokenizer, group, &previous)?;
        previous = group.documents.iter().map(|d| d.id.clone()).collect();
        bar.set_message(format!("corpus {}/{}", gi + 1, groups.len()));
        let at = RowContext {
            suite: config.suite.as_str(),
            split: config.split,
            group: &group.id,
        };
        for example in &group.examples {
            for &system in &answering {
                if results.is_done(system.as_str(), &example.id) {
                    continue;
                }
                engine.set_routing(system.routing(&base_routing, &edar))?;
                let answer = engine
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
                results.append(ResultRow::from_answer(&at, system, example, parts, score))?;
                bar.inc(1);
            }
            if config.systems.contains(&System::Oracle) && !results.is_done("oracle", &example.id) {
                let rows: Vec<&ResultRow> = results
                    .rows()
                    .iter()
                    .filter(|r| r.example == example.id)
                    .collect();
                if let Some(row) = report::oracle_row(&rows) {
                    results.append(row)?;
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    let current: std::collections::HashSet<&str> = groups
        .iter()
        .flat_map(|g| &g.examples)
        .map(|e| e.id.as_str())
        .collect();
    let rows: Vec<ResultRow> = results
        .rows()
        .iter()
        .filter(|r| current.contains(r.example.as_str()))
        .cloned()
        .collect();
    let report = write_report(&rows, &config.out, config.seed, &manifest)?;
    Ok(EvalRun { rows, report })
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
pub fn export(config: &EvalConfig, file: &Path) -> Result<usize> {
    let scratch = tempfile::tempdir().context("creating a scratch corpus store")?;
    let mut triage_config = config.config.clone();
    triage_config.pipeline.corpora.clear();
    let engine = Engine::new(triage_config)?.with_store(scratch.path());
    let groups = build_groups(config, &engine)?;
    let mut out = String::new();
    for group in &groups {
        out.push_str(&serde_json::to_string(group)?);
        out.push('\n');
    }
    std::fs::write(file, out).with_context(|| format!("writing {}", file.display()))?;
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
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("run.json");
    if !path.exists() {
        std::fs::write(&path, serde_json::to_string_pretty(manifest)?)
            .with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let old: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
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
    store: &CorpusStore,
    embedder: &triage_retrieval::BertEmbedder,
    tokenizer: &dyn triage_retrieval::TokenOffsets,
    group: &Group,
    previous: &[String],
) -> Result<()> {
    let stale: Vec<String> = previous
        .iter()
        .filter(|id| !group.documents.iter().any(|d| &d.id == *id))
        .cloned()
        .collect();
    store.ingest(
        EVAL_CORPUS,
        &group.documents,
        &stale,
        embedder,
        tokenizer,
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
    std::fs::write(&md, text).with_context(|| format!("writing {}", md.display()))?;
    let json = dir.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&r)?)
        .with_context(|| format!("writing {}", json.display()))?;
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

/// What `triage calibrate` writes: `[routing.monitor]` and `[routing.retrieval]` tables the
/// engine and the server read. The retrieval settings travel with τ: the RAG answers it was
/// chosen on came from them, and another search (dense or hybrid) moves the statistic.
#[derive(Debug, Serialize)]
struct CalibratedFile {
    routing: CalibratedRouting,
}

#[derive(Debug, Serialize)]
struct CalibratedRouting {
    monitor: CalibratedMonitor,
    retrieval: RetrievalSettings,
}

#[derive(Debug, Serialize)]
struct CalibratedMonitor {
    /// Absent when a combined score decides instead (the engine's default τ stays, unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    tau: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    combined_score: Option<PathBuf>,
    window: usize,
    estimator: triage_engine::entropy_monitor::EntropyEstimator,
    unit: triage_engine::entropy_monitor::EntropyUnit,
    /// Whether the RAG prompt offered Self-Route's decline: τ and the score hold only for
    /// answers to the prompt they were calibrated on.
    self_route: bool,
    calibration: Calibration,
}

/// What decides escalation in a calibrated routing file.
pub enum Escalation {
    Tau(f64),
    /// The combined score saved at this path, its threshold inside it.
    Combined(PathBuf),
}

/// The routing TOML for a calibration on RAG answers retrieved with `retrieval`.
pub fn calibrated_toml(
    escalation: Escalation,
    calibration: &Calibration,
    routing: &RoutingConfig,
) -> Result<String> {
    let (tau, combined_score) = match escalation {
        Escalation::Tau(tau) => (Some(tau as f32), None),
        Escalation::Combined(path) => (None, Some(path)),
    };
    let file = CalibratedFile {
        routing: CalibratedRouting {
            retrieval: routing.retrieval.clone(),
            monitor: CalibratedMonitor {
                tau,
                combined_score,
                window: calibration.window,
                estimator: calibration.estimator,
                unit: calibration.unit,
                self_route: routing.monitor.self_route,
                calibration: calibration.clone(),
            },
        },
    };
    Ok(format!(
        "# Written by `triage calibrate` on the {} split of {} ({} queries).\n{}",
        calibration.split,
        calibration.suite,
        calibration.queries,
        toml::to_string(&file).context("writing the calibration as TOML")?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systems_parse_and_each_baseline_has_its_settings() {
        assert_eq!(
            parse_systems("rag, lc,rag,oracle").unwrap(),
            [System::Rag, System::Lc, System::Oracle]
        );
        assert!(parse_systems("rag,psychic").is_err());
        assert!(parse_systems("oracle").is_err());
        assert!(parse_systems(",").is_err());
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

    #[test]
    fn the_calibrated_file_is_a_routing_config_the_engine_reads() {
        let calibration = Calibration {
            model: "qwen2.5-coder-0.5b".into(),
            estimator: Default::default(),
            unit: Default::default(),
            window: 30,
            suite: "squad-v2".into(),
            split: "dev".into(),
            queries: 40,
            data_sha256: "ab".repeat(32),
            rule: "elbow".into(),
            accuracy: 0.7,
            rag_accuracy: 0.5,
            lc_accuracy: 0.72,
            escalation_rate: 0.4,
            accuracy_retained: 0.97,
            token_reduction: 0.3,
        };
        let retrieval = RetrievalSettings {
            search: RagSearch::Hybrid,
            k: 6,
            ..RetrievalSettings::default()
        };
        let mut routing = RoutingConfig {
            retrieval: retrieval.clone(),
            ..RoutingConfig::default()
        };
        routing.monitor.self_route = false;
        let text = calibrated_toml(Escalation::Tau(0.85), &calibration, &routing).unwrap();
        let config = TriageConfig::from_toml_str(&text).unwrap();
        assert_eq!(config.routing.monitor.tau, 0.85);
        // τ holds for the retrieval and the RAG prompt its answers came from, so the file
        // carries both.
        assert_eq!(config.routing.retrieval, retrieval);
        assert!(!config.routing.monitor.self_route);
        assert_eq!(
            config.routing.monitor.calibration.as_ref(),
            Some(&calibration)
        );
        config.routing.validate().unwrap();
        // The server reads the same file, validated whole as `triage serve` does.
        config.validate().unwrap();
        // Changing the estimator after calibrating is refused.
        let edited = text.replace(
            "[routing.monitor]\n",
            "[routing.monitor]\nunit = \"bits\"\n",
        );
        let edited = edited.replacen("unit = \"nats\"\n", "", 1);
        let config = TriageConfig::from_toml_str(&edited).unwrap();
        let err = config.routing.validate().unwrap_err().to_string();
        assert!(err.contains("calibrated"), "{err}");
        // A calibrated combined score: the file names it and leaves τ at the default.
        let path = PathBuf::from("/runs/squad-v2-calibrated.combined.json");
        let text =
            calibrated_toml(Escalation::Combined(path.clone()), &calibration, &routing).unwrap();
        let config = TriageConfig::from_toml_str(&text).unwrap();
        assert_eq!(config.routing.monitor.combined_score, Some(path));
        assert_eq!(
            config.routing.monitor.tau,
            RoutingConfig::default().monitor.tau
        );
        config.routing.validate().unwrap();
    }
}
