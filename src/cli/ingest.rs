//! `triage ingest`: add documents to a corpus under `$TRIAGE_HOME` (and mirror it into Milvus),
//! then say what changed. With `--wait`, also pin the new generation's long-context prefix the
//! way a server does (the library's background pin, waited for), which saves it for the next
//! start.

use anyhow::Result;
use serde_json::json;
use triage_drivers::IngestParams;

use super::EngineArgs;

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
    #[arg(long, default_value = triage::DEFAULT_EMBEDDER)]
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
    /// Then pin the corpus's long-context prefix in the long-context model and wait for it:
    /// the prefix is saved under the prefix folder, so a server (re)started over this corpus
    /// reads it from disk instead of prefilling it. Without it, a server pins the new
    /// generation in the background when it loads it.
    #[arg(long)]
    pub wait: bool,
    /// The engine (models, prefix folder) `--wait` pins with.
    #[command(flatten)]
    pub engine: EngineArgs,
    #[arg(long)]
    pub json: bool,
}

/// Ingest, mirror into Milvus when asked, and print the changes (one JSON object with `--json`).
pub fn run(args: IngestArgs) -> Result<()> {
    let chunker = triage_retrieval::ChunkerConfig {
        max_tokens: args.chunk_tokens,
        overlap_tokens: args.overlap_tokens,
    };
    let report = triage_drivers::ingest(&IngestParams {
        corpus: args.corpus.clone(),
        paths: args.paths,
        delete: args.delete,
        embedder: args.embedder.clone(),
        chunker,
    })?;
    let milvus = match &args.milvus {
        Some(uri) => Some(triage_drivers::sync_milvus(&args.corpus, uri)?),
        None => None,
    };
    let pinned = if args.wait {
        Some(pin(&args.engine, &args.embedder, &args.corpus)?)
    } else {
        None
    };
    if args.json {
        let mut out = serde_json::to_value(&report)?;
        if let Some(m) = milvus {
            out["milvus"] = json!({"inserted": m.inserted, "deleted": m.deleted, "total": m.total});
        }
        if let Some(corpus) = &pinned {
            out["pin"] = serde_json::to_value(&corpus.pin)?;
        }
        println!("{out}");
    } else {
        if let Some(corpus) = &pinned {
            println!(
                "{}: long-context prefix {}",
                args.corpus,
                pin_text(&corpus.pin)
            );
        }
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

/// Load the stored corpus in an engine over `engine`'s models, embedded with `embedder` (the
/// one it was just ingested with), and wait for its prefix's pin.
fn pin(engine: &EngineArgs, embedder: &str, corpus: &str) -> Result<triage::CorpusSummary> {
    let mut config = engine.load()?;
    config.pipeline.embedder = embedder.to_string();
    // `ingest` writes under $TRIAGE_HOME whatever the config's `data_dir` says.
    let home = triage_models::paths::triage_home();
    let engine = triage::Engine::new(config)?.with_store(&home);
    Ok(engine.load_corpus(corpus)?)
}

fn pin_text(pin: &triage::PinStatus) -> String {
    match pin {
        triage::PinStatus::Pinned { tokens, from } => format!("pinned: {tokens} tokens ({from})"),
        triage::PinStatus::Unavailable { reason } => format!("not pinned: {reason}"),
        other => format!("{other:?}"),
    }
}
