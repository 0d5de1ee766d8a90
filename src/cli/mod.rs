//! The command line's grammar (clap) and the commands, one file each owning its flags and its
//! output; the drivers they call are in `triage-drivers`. Private to the binary.

pub mod ask;
pub mod bench;
pub mod calibrate;
pub mod eval;
pub mod generate;
pub mod ingest;
pub mod models;
pub mod retrieve;
pub mod serve;
pub mod signals;
pub mod train;

use std::sync::Arc;

use anyhow::Result;
use clap::{Parser, Subcommand};
use triage::{DeviceSpec, Model};

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
        command: models::ModelsCommand,
    },
    /// Generate text with one model.
    Generate(generate::GenerateArgs),
    /// Serve the OpenAI-compatible API (chat, completions, models, health, metrics).
    Serve(serve::ServeArgs),
    /// Add documents to a corpus (text, Markdown, JSON/JSONL records; folders recursively).
    Ingest(ingest::IngestArgs),
    /// Search a corpus.
    Retrieve(retrieve::RetrieveArgs),
    /// Answer a question over a corpus through the routing pipeline.
    Ask(ask::AskArgs),
    /// Fit the routing policies.
    Train {
        #[command(subcommand)]
        command: train::TrainCommand,
    },
    /// Evaluate systems on a suite: results.jsonl (resumable), report.md, report.json and
    /// figures (PNG and SVG).
    Eval(eval::EvalArgs),
    /// Choose τ on a suite's dev split and write it to a routing TOML the engine and the
    /// server read.
    Calibrate(calibrate::CalibrateArgs),
    /// Which signals tell a wrong RAG answer, from `triage eval` runs: each alone, the
    /// combined score fitted on the train runs and scored on the test runs, ablations, and
    /// leave-one-suite-out.
    Signals(signals::SignalsArgs),
    /// Benchmarks through the batching engine.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
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

/// `TRIAGE_Q8_KERNEL` picks the int8 kernel for benchmarks; a name this CPU cannot run is an
/// error here rather than a silent fallback.
pub fn check_q8_kernel_override() -> Result<()> {
    use triage_ops::KernelChoice;
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

/// Logs to stderr; `RUST_LOG` filters (default: info for the server, warnings for the other
/// commands, whose output is their result).
pub fn init_logging(server: bool) {
    let default = if server { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// A model by name or path, on `device`, shared with the engines that run it.
pub fn load_model(name_or_path: &str, device: DeviceSpec) -> Result<Arc<Model>> {
    Ok(Arc::new(triage::load_model(name_or_path, device)?))
}

/// Whether progress goes to a terminal (bars and download progress are drawn only there).
pub fn stderr_is_terminal() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}
