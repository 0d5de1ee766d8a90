//! `triage ingest` and `triage retrieve`: corpora under `$TRIAGE_HOME`, embedded with the
//! fetched MiniLM (or another sentence-transformers folder).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::Device;
use serde_json::json;
use triage_models::bert::{CrossEncoder, SentenceEmbedder};
use triage_retrieval::{
    load_documents, BertEmbedder, ChunkerConfig, CorpusStore, Embedder, IngestReport, SearchMode,
    SearchOptions,
};

/// The default embedder: the fetched all-MiniLM-L6-v2.
pub const DEFAULT_EMBEDDER: &str = "minilm-l6";

fn store() -> CorpusStore {
    CorpusStore::new(&triage_models::paths::triage_home())
}

/// Load a sentence embedder by default-model name or folder path.
pub fn load_embedder(name_or_path: &str) -> Result<BertEmbedder> {
    let dir = if Path::new(name_or_path).is_dir() {
        PathBuf::from(name_or_path)
    } else {
        let dir = triage_models::paths::model_dir(name_or_path);
        if !dir.join("model.safetensors").exists() {
            bail!(
                "embedder {name_or_path:?} is not fetched (expected {}): run `triage models fetch {name_or_path}`",
                dir.display()
            );
        }
        dir
    };
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| name_or_path.to_string());
    let model = SentenceEmbedder::load(&dir, &Device::Cpu)
        .with_context(|| format!("loading embedder {}", dir.display()))?;
    Ok(BertEmbedder { name, model })
}

/// Ingest `paths` into `corpus`, deleting `delete`.
pub fn ingest(
    corpus: &str,
    paths: &[PathBuf],
    delete: &[String],
    embedder: &str,
    chunker: ChunkerConfig,
) -> Result<IngestReport> {
    if paths.is_empty() && delete.is_empty() {
        bail!("nothing to do: give files or folders to ingest, or --delete DOC_ID");
    }
    let mut docs = Vec::new();
    for p in paths {
        docs.extend(load_documents(p)?);
    }
    let embedder = load_embedder(embedder)?;
    let tokenizer = embedder.model.tokenizer().clone();
    Ok(store().ingest(corpus, &docs, delete, &embedder, &tokenizer, chunker)?)
}

/// Search `corpus` and return the JSON the command prints.
pub fn retrieve(
    corpus: &str,
    query: &str,
    mode: SearchMode,
    k: usize,
    embedder: Option<&str>,
    cross_encoder: Option<&Path>,
) -> Result<serde_json::Value> {
    if k == 0 {
        bail!("--k must be at least 1");
    }
    let corpus = store().open(corpus)?;
    let vector = if mode == SearchMode::Bm25 {
        None
    } else {
        // The corpus records its embedder as "name:dim:max_len".
        let stored = corpus
            .embedder_id()
            .split(':')
            .next()
            .unwrap_or(DEFAULT_EMBEDDER)
            .to_string();
        let embedder = load_embedder(embedder.unwrap_or(&stored))?;
        if embedder.id() != corpus.embedder_id() {
            bail!(
                "corpus was embedded with {}, not {}",
                corpus.embedder_id(),
                embedder.id()
            );
        }
        Some(embedder.embed(&[query])?.remove(0))
    };
    let options = SearchOptions {
        mode,
        k,
        ..SearchOptions::default()
    };
    let mut hits = corpus.search(query, vector.as_deref(), &options)?;
    let mut features = serde_json::Value::Null;
    if let Some(dir) = cross_encoder {
        let ce = CrossEncoder::load(dir, &Device::Cpu)
            .with_context(|| format!("loading cross-encoder {}", dir.display()))?;
        // The study's features come from the dense arm and its reranked order.
        let dense_options = SearchOptions {
            mode: SearchMode::Dense,
            ..options
        };
        let dense = match &vector {
            _ if mode == SearchMode::Dense => hits.clone(),
            Some(v) => corpus.search(query, Some(v), &dense_options)?,
            None => Vec::new(),
        };
        let dense_scores: Vec<(String, f32)> = dense
            .iter()
            .map(|h| (h.chunk.id.clone(), h.dense_score.unwrap_or(f32::NAN)))
            .collect();
        let reranked_dense = triage_retrieval::rerank(query, dense, &ce)?;
        let order: Vec<_> = reranked_dense
            .iter()
            .map(|h| (h.chunk.id.clone(), h.chunk.kind))
            .collect();
        features =
            serde_json::to_value(triage_retrieval::retrieval_features(&dense_scores, &order))?;
        hits = triage_retrieval::rerank(query, hits, &ce)?;
    }
    Ok(json!({
        "features": features,
        "corpus": corpus.name,
        "query": query,
        "mode": format!("{mode:?}").to_lowercase(),
        "hits": hits.iter().enumerate().map(|(i, h)| json!({
            "rank": i + 1,
            "id": h.chunk.id,
            "document": h.chunk.doc_id,
            "title": h.chunk.title,
            "kind": h.chunk.kind,
            "score": h.score,
            "dense_rank": h.dense_rank,
            "dense_score": h.dense_score,
            "bm25_rank": h.bm25_rank,
            "text": h.chunk.text,
        })).collect::<Vec<_>>(),
    }))
}
