//! `triage ingest` and `triage retrieve`: corpora under `$TRIAGE_HOME`, embedded with the
//! fetched MiniLM (or another sentence-transformers folder), searched through `triage-router`'s
//! `Retriever` (the base model writes pseudo-passages and reranks).

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::Device;
use serde_json::json;
use triage_engine::{EngineConfig, KvBudget, LlmEngine};
use triage_milvus::{MilvusBackend, SyncReport};
use triage_models::bert::CrossEncoder;
use triage_retrieval::SearchBackend;
use triage_retrieval::{
    load_documents, BertEmbedder, ChunkerConfig, Corpus, CorpusStore, Embedder, IngestReport,
};
use triage_router::{RerankWith, RetrieveMode, RetrieveParams, Retriever};

use triage_fetch::DEFAULT_EMBEDDER;
use triage_host::{load_embedder, load_model};
use triage_models::DeviceSpec;

use crate::error::{bail, Context, Result};

fn store() -> CorpusStore {
    CorpusStore::new(&triage_models::paths::triage_home())
}

/// What `triage ingest` adds to a corpus and removes from it.
#[derive(Debug, Clone)]
pub struct IngestParams {
    pub corpus: String,
    /// Files or folders to add (changed documents replace their old chunks).
    pub paths: Vec<PathBuf>,
    /// Document ids to remove.
    pub delete: Vec<String>,
    /// The sentence embedder (a default model's name or a folder).
    pub embedder: String,
    pub chunker: ChunkerConfig,
}

/// Ingest the paths into the corpus under `$TRIAGE_HOME`, deleting what `params` says.
pub fn ingest(params: &IngestParams) -> Result<IngestReport> {
    let IngestParams {
        corpus,
        paths,
        delete,
        embedder,
        chunker,
    } = params;
    if paths.is_empty() && delete.is_empty() {
        bail!("nothing to do: give files or folders to ingest, or --delete DOC_ID");
    }
    let mut docs = Vec::new();
    for p in paths {
        docs.extend(load_documents(p)?);
    }
    // The server's default bounds: a corpus ingested here is served as it is.
    triage_retrieval::DocumentLimits::default().check(&docs)?;
    let embedder = load_embedder(embedder)?;
    let tokenizer = embedder.model.tokenizer().clone();
    Ok(store().ingest(corpus, &docs, delete, &embedder, &tokenizer, *chunker)?)
}

/// What `triage retrieve` searches for, and how.
#[derive(Debug, Clone)]
pub struct RetrieveQuery {
    pub corpus: String,
    pub query: String,
    pub params: RetrieveParams,
    /// The embedder the corpus was built with, when it is not a default model.
    pub embedder: Option<String>,
    /// Rerank with the base model's yes/no judgements.
    pub rerank: bool,
    /// Rerank with this BERT cross-encoder folder instead.
    pub cross_encoder: Option<PathBuf>,
    /// The base model (name or path) for dual-path search and LLM reranking.
    pub model: String,
    /// Rank with the corpus's mirror in this Milvus (`http://HOST:PORT`) instead of the
    /// embedded indexes.
    pub milvus: Option<String>,
}

/// The corpus's own embedder (or `name_or_path`), checked against what the corpus was built with.
fn corpus_embedder(corpus: &Corpus, name_or_path: Option<&str>) -> Result<BertEmbedder> {
    // The corpus records its embedder as "name:dim:max_len".
    let stored = corpus
        .embedder_id()
        .split(':')
        .next()
        .unwrap_or(DEFAULT_EMBEDDER)
        .to_string();
    let embedder = load_embedder(name_or_path.unwrap_or(&stored))?;
    if embedder.id() != corpus.embedder_id() {
        bail!(
            "corpus was embedded with {}, not {}",
            corpus.embedder_id(),
            embedder.id()
        );
    }
    Ok(embedder)
}

/// A batching engine over the base model, sized for one query's reranking pool.
pub(crate) fn base_engine(name_or_path: &str) -> Result<LlmEngine> {
    let model = load_model(name_or_path, DeviceSpec::Cpu)?;
    let config = EngineConfig {
        kv_budget: KvBudget::Blocks(4096),
        max_num_seqs: 32,
        ..EngineConfig::default()
    };
    Ok(LlmEngine::new(Arc::new(model), config)?)
}

/// Make the Milvus collection of `corpus` hold exactly its chunks.
pub fn sync_milvus(corpus: &str, uri: &str) -> Result<SyncReport> {
    let corpus = store().open(corpus)?;
    let milvus = MilvusBackend::connect(uri, &corpus)?;
    Ok(milvus.sync(&corpus)?)
}

/// Search and return the JSON the command prints.
pub fn retrieve(cmd: &RetrieveQuery) -> Result<serde_json::Value> {
    if cmd.rerank && cmd.cross_encoder.is_some() {
        bail!("--rerank and --cross-encoder both choose a reranker: give one");
    }
    let corpus = store().open(&cmd.corpus)?;
    let embedder = corpus_embedder(&corpus, cmd.embedder.as_deref())?;
    let needs_engine = cmd.rerank || cmd.params.mode == RetrieveMode::Dual;
    let mut engine = if needs_engine {
        Some(base_engine(&cmd.model)?)
    } else {
        None
    };
    let mut cross_encoder = match &cmd.cross_encoder {
        Some(dir) => Some(
            CrossEncoder::load(dir, &Device::Cpu)
                .with_context(|| format!("loading cross-encoder {}", dir.display()))?,
        ),
        None => None,
    };
    let rerank_with = match (&mut cross_encoder, cmd.rerank) {
        (Some(ce), _) => RerankWith::Custom(ce),
        (None, true) => RerankWith::Llm,
        (None, false) => RerankWith::None,
    };
    let milvus = match &cmd.milvus {
        Some(uri) => Some(MilvusBackend::connect(uri, &corpus)?),
        None => None,
    };
    let mut retriever = Retriever {
        corpus: &corpus,
        embedder: &embedder,
        generator: engine
            .as_mut()
            .map(|e| e as &mut dyn triage_router::Generator),
        backend: milvus.as_ref().map(|m| m as &dyn SearchBackend),
    };
    let found = retriever.retrieve(&cmd.query, &cmd.params, rerank_with)?;
    Ok(json!({
        "corpus": corpus.name,
        "query": cmd.query,
        "mode": format!("{:?}", cmd.params.mode).to_lowercase(),
        "pseudo_passage": found.pseudo_passage,
        "features": found.features,
        "hits": found.hits.iter().enumerate().map(|(i, h)| json!({
            "rank": i + 1,
            "id": h.chunk.id,
            "document": h.chunk.doc_id,
            "title": h.chunk.title,
            "kind": h.chunk.kind,
            "score": h.score,
            "dense_rank": h.dense_rank,
            "dense_score": h.dense_score,
            "bm25_rank": h.bm25_rank,
            "pseudo_rank": h.pseudo_rank,
            "text": h.chunk.text,
        })).collect::<Vec<_>>(),
    }))
}
