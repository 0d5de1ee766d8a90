//! `triage ingest`: add documents to a corpus under `$TRIAGE_HOME` (and mirror it into Milvus),
//! then say what changed.

use anyhow::Result;
use serde_json::json;
use triage_drivers::IngestParams;

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
        embedder: args.embedder,
        chunker,
    })?;
    let milvus = match &args.milvus {
        Some(uri) => Some(triage_drivers::sync_milvus(&args.corpus, uri)?),
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
