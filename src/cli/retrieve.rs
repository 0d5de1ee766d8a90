//! `triage retrieve`: search a corpus (dense, BM25, hybrid or dual-path, optionally reranked)
//! and print the hits.

use anyhow::Result;
use triage_drivers::RetrieveQuery;
use triage_router::{RetrieveMode, RetrieveParams};

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
    #[arg(long, default_value = triage::DEFAULT_BASE_MODEL)]
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

/// Search and print the hits (the whole answer as one JSON object with `--json`).
pub fn run(args: RetrieveArgs) -> Result<()> {
    let mode = match args.mode {
        Mode::Dense => RetrieveMode::Dense,
        Mode::Bm25 => RetrieveMode::Bm25,
        Mode::Hybrid => RetrieveMode::Hybrid,
        Mode::Dual => RetrieveMode::Dual,
    };
    let out = triage_drivers::retrieve(&RetrieveQuery {
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
    print_hits(&out);
    Ok(())
}

/// The pseudo-passage (dual-path) and one line per hit: rank, score, document, text.
fn print_hits(out: &serde_json::Value) {
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
}
