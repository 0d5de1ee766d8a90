//! `RoutingService`: the routing pipeline inside the server. Its models are the engine workers
//! (so pipeline requests share continuous batching with plain chat traffic), its corpora live in
//! the corpus store and are managed over `/v1/corpora`, and each loaded corpus keeps its
//! long-context prefix pinned in the long-context worker. Every method blocks: handlers call it
//! on tokio's blocking pool.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde::Serialize;
use triage_engine::generate::{tokenize_prompt, GenerateRequest, TokenOutput};
use triage_engine::llm_engine::{PrefixSource, StreamEvent};
use triage_models::model::Model;
use triage_retrieval::{BertEmbedder, ChunkerConfig, Corpus, CorpusStore, Document};
use triage_router::decision::DecisionRecord;
use triage_router::long_context::{prepare_long_context, LongContextPrompt};
use triage_router::{
    Answer, AnswerEvent, AskRequest, CorpusView, Generated, Generator, ModelRole, PinnedPrefix,
    Pipeline, RouterError, RoutingConfig,
};

use crate::worker::EngineWorker;

/// Why a pipeline call failed.
#[derive(Debug, thiserror::Error)]
pub enum RoutingError {
    /// The caller's mistake (a 400).
    #[error("{0}")]
    Invalid(String),
    #[error("no corpus named {0:?}")]
    UnknownCorpus(String),
    /// The server's failure (a 500).
    #[error("{0}")]
    Internal(String),
}

impl From<RouterError> for RoutingError {
    fn from(e: RouterError) -> Self {
        match e {
            RouterError::Invalid(m) => Self::Invalid(m),
            RouterError::Engine(triage_engine::EngineError::Invalid(m)) => Self::Invalid(m),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<triage_retrieval::RetrievalError> for RoutingError {
    fn from(e: triage_retrieval::RetrievalError) -> Self {
        use triage_retrieval::RetrievalError as E;
        match e {
            E::UnknownCorpus(name) => Self::UnknownCorpus(name),
            E::Invalid(_) | E::BadDocument { .. } => Self::Invalid(e.to_string()),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// The models of the pipeline, reached through their engine workers.
struct WorkerGenerator<'a> {
    roles: &'a HashMap<ModelRole, Arc<EngineWorker>>,
}

impl WorkerGenerator<'_> {
    fn worker(&self, role: ModelRole) -> triage_router::Result<&Arc<EngineWorker>> {
        self.roles.get(&role).ok_or_else(|| {
            RouterError::Invalid(format!("no served model plays the {} role", role.as_str()))
        })
    }
}

/// Collect one request's events; `watch` may stop it (dropping the receiver cancels it at the
/// engine's next step).
fn drain(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<StreamEvent>,
    prompt_tokens: usize,
    i: usize,
    watch: &mut dyn FnMut(usize, &TokenOutput, &str) -> bool,
    started: std::time::Instant,
) -> triage_router::Result<Generated> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(event) = rx.blocking_recv() {
        match event {
            StreamEvent::Token(token, piece) => {
                text.push_str(&piece);
                let go_on = watch(i, &token, &piece);
                tokens.push(token);
                if !go_on {
                    let completion_tokens = tokens.len();
                    drop(rx);
                    return Ok(Generated {
                        text,
                        tokens,
                        finish_reason: triage_engine::generate::FinishReason::Cancelled,
                        // A stopped request's usage never arrives (its listener is gone): the
                        // prompt is counted here, its cached part is unknown.
                        usage: triage_engine::llm_engine::Usage {
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens: 0,
                        },
                        elapsed: started.elapsed(),
                    });
                }
            }
            StreamEvent::Text(piece) => text.push_str(&piece),
            StreamEvent::Finished { reason, usage } => {
                return Ok(Generated {
                    text,
                    tokens,
                    finish_reason: reason,
                    usage,
                    elapsed: started.elapsed(),
                })
            }
        }
    }
    Err(RouterError::Invalid(
        "the engine stopped before the request finished".into(),
    ))
}

impl Generator for WorkerGenerator<'_> {
    fn model(&self, role: ModelRole) -> triage_router::Result<Arc<Model>> {
        Ok(self.worker(role)?.model.clone())
    }

    fn generate(
        &mut self,
        role: ModelRole,
        requests: &[GenerateRequest],
        watch: &mut dyn FnMut(usize, &TokenOutput, &str) -> bool,
    ) -> triage_router::Result<Vec<Generated>> {
        let worker = self.worker(role)?.clone();
        let started = std::time::Instant::now();
        let mut receivers = Vec::with_capacity(requests.len());
        for request in requests {
            let prompt_tokens = tokenize_prompt(&worker.model, &request.prompt)?.len();
            receivers.push((worker.submit_blocking(request.clone())?, prompt_tokens));
        }
        receivers
            .into_iter()
            .enumerate()
            .map(|(i, (rx, prompt_tokens))| drain(rx, prompt_tokens, i, watch, started))
            .collect()
    }

    fn pin_prefix(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
    ) -> triage_router::Result<PinnedPrefix> {
        let (num_tokens, source) = self
            .worker(role)?
            .pin_blocking(tokens.to_vec(), dir.map(Path::to_path_buf))?;
        Ok(PinnedPrefix { num_tokens, source })
    }

    fn unpin_prefix(&mut self, role: ModelRole, tokens: &[u32]) -> triage_router::Result<()> {
        Ok(self.worker(role)?.unpin(tokens.to_vec())?)
    }
}

/// A corpus ready to answer from.
struct LoadedCorpus {
    corpus: Corpus,
    long_context: Result<LongContextPrompt, String>,
}

/// What `/v1/corpora` reports about a corpus.
#[derive(Debug, Clone, Serialize)]
pub struct CorpusSummary {
    pub name: String,
    pub documents: usize,
    pub chunks: usize,
    /// Tokens of the corpus prefix in the long-context model, when it fits.
    pub prefix_tokens: Option<usize>,
    pub pinned_from: Option<&'static str>,
    pub long_context_unavailable: Option<String>,
}

/// One document of a corpus, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct DocumentSummary {
    pub id: String,
    pub title: String,
    pub chunks: usize,
}

/// What a change to a corpus's documents did.
#[derive(Debug, Clone, Serialize)]
pub struct DocumentsChange {
    pub added: usize,
    pub updated: usize,
    pub unchanged: usize,
    pub deleted: usize,
    pub corpus: CorpusSummary,
}

/// The pipeline, its models, and the corpora it answers from.
pub struct RoutingService {
    /// The `model` name clients use for the pipeline.
    pub alias: String,
    pipeline: Pipeline,
    roles: HashMap<ModelRole, Arc<EngineWorker>>,
    embedder: BertEmbedder,
    store: CorpusStore,
    prefix_dir: PathBuf,
    corpora: RwLock<BTreeMap<String, Arc<LoadedCorpus>>>,
    /// Changes to corpora run one at a time (ingesting and re-pinning are not concurrent-safe
    /// for one name).
    writing: Mutex<()>,
}

impl std::fmt::Debug for RoutingService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutingService")
            .field("alias", &self.alias)
            .finish()
    }
}

fn pinned_name(source: PrefixSource) -> &'static str {
    match source {
        PrefixSource::Cache => "cache",
        PrefixSource::Disk => "disk",
        PrefixSource::Computed => "computed",
    }
}

impl RoutingService {
    /// A service over `workers` (by role: the base model is required; the long-context role
    /// falls back to the base model, the router role to the base model too).
    pub fn new(
        alias: &str,
        config: RoutingConfig,
        workers: &[Arc<EngineWorker>],
        embedder: BertEmbedder,
        data_dir: &Path,
        prefix_dir: PathBuf,
    ) -> Result<Self, RoutingError> {
        let pipeline = Pipeline::new(config)?;
        let by_role = |names: &[&str]| {
            workers
                .iter()
                .find(|w| names.contains(&w.role.as_str()))
                .cloned()
        };
        let base = by_role(&["base"]).ok_or_else(|| {
            RoutingError::Invalid("routing needs a model with role \"base\"".into())
        })?;
        let mut roles = HashMap::new();
        roles.insert(
            ModelRole::LongContext,
            by_role(&["long-context", "long_context"]).unwrap_or_else(|| base.clone()),
        );
        roles.insert(
            ModelRole::Router,
            by_role(&["router"]).unwrap_or_else(|| base.clone()),
        );
        roles.insert(ModelRole::Base, base);
        Ok(Self {
            alias: alias.to_string(),
            pipeline,
            roles,
            embedder,
            store: CorpusStore::new(data_dir),
            prefix_dir,
            corpora: RwLock::new(BTreeMap::new()),
            writing: Mutex::new(()),
        })
    }

    fn write_lock(&self) -> Result<std::sync::MutexGuard<'_, ()>, RoutingError> {
        self.writing
            .lock()
            .map_err(|_| RoutingError::Internal("corpus lock poisoned".into()))
    }

    fn generator(&self) -> WorkerGenerator<'_> {
        WorkerGenerator { roles: &self.roles }
    }

    fn cached(&self, name: &str) -> Result<Option<Arc<LoadedCorpus>>, RoutingError> {
        Ok(self
            .corpora
            .read()
            .map_err(|_| RoutingError::Internal("corpus table poisoned".into()))?
            .get(name)
            .cloned())
    }

    /// A loaded corpus; one in the store but not loaded yet (made by `triage ingest`, or before
    /// a restart) is loaded now, its prefix pinned on first use.
    fn loaded(&self, name: &str) -> Result<Arc<LoadedCorpus>, RoutingError> {
        if let Some(loaded) = self.cached(name)? {
            return Ok(loaded);
        }
        let _guard = self.write_lock()?;
        if let Some(loaded) = self.cached(name)? {
            return Ok(loaded);
        }
        self.reload(name)?;
        self.cached(name)?
            .ok_or_else(|| RoutingError::UnknownCorpus(name.to_string()))
    }

    fn summary(name: &str, loaded: &LoadedCorpus, pinned: Option<PinnedPrefix>) -> CorpusSummary {
        CorpusSummary {
            name: name.to_string(),
            documents: loaded.corpus.num_documents(),
            chunks: loaded.corpus.chunks().len(),
            prefix_tokens: loaded.long_context.as_ref().ok().map(|lc| lc.prefix.len()),
            pinned_from: pinned.map(|p| pinned_name(p.source)),
            long_context_unavailable: loaded.long_context.as_ref().err().cloned(),
        }
    }

    /// [`RoutingService::loaded`] for a caller that holds the write lock.
    fn loaded_locked(&self, name: &str) -> Result<Arc<LoadedCorpus>, RoutingError> {
        if let Some(loaded) = self.cached(name)? {
            return Ok(loaded);
        }
        self.reload(name)?;
        self.cached(name)?
            .ok_or_else(|| RoutingError::UnknownCorpus(name.to_string()))
    }

    /// Open `name` from the store (it must exist) and pin its long-context prefix.
    pub fn load_corpus(&self, name: &str) -> Result<CorpusSummary, RoutingError> {
        let _guard = self.write_lock()?;
        self.reload(name)
    }

    /// (Re)open `name` and swap it in, pinning the new prefix before unpinning the old one so an
    /// unchanged corpus keeps its cached blocks.
    fn reload(&self, name: &str) -> Result<CorpusSummary, RoutingError> {
        let corpus = self.store.open(name)?;
        let (long_context, pinned) = prepare_long_context(
            &mut self.generator(),
            &corpus,
            &self.pipeline.config,
            &self.prefix_dir,
        )?;
        let loaded = Arc::new(LoadedCorpus {
            corpus,
            long_context,
        });
        let summary = Self::summary(name, &loaded, pinned);
        let old = self
            .corpora
            .write()
            .map_err(|_| RoutingError::Internal("corpus table poisoned".into()))?
            .insert(name.to_string(), loaded.clone());
        if let Some(Ok(old_lc)) = old.as_ref().map(|o| o.long_context.as_ref()) {
            let unchanged = loaded
                .long_context
                .as_ref()
                .is_ok_and(|lc| lc.prefix == old_lc.prefix);
            if !unchanged {
                self.generator()
                    .unpin_prefix(ModelRole::LongContext, &old_lc.prefix)?;
            }
        }
        Ok(summary)
    }

    /// The loaded corpora.
    pub fn list_corpora(&self) -> Result<Vec<CorpusSummary>, RoutingError> {
        let corpora = self
            .corpora
            .read()
            .map_err(|_| RoutingError::Internal("corpus table poisoned".into()))?;
        Ok(corpora
            .iter()
            .map(|(name, loaded)| Self::summary(name, loaded, None))
            .collect())
    }

    /// Create a corpus (an error if it exists) with `documents`.
    pub fn create_corpus(
        &self,
        name: &str,
        documents: &[Document],
    ) -> Result<DocumentsChange, RoutingError> {
        let _guard = self.write_lock()?;
        if self.store.list()?.iter().any(|n| n == name) {
            return Err(RoutingError::Invalid(format!(
                "corpus {name:?} already exists"
            )));
        }
        self.change(name, documents, &[])
    }

    /// Add or replace documents of an existing corpus.
    pub fn add_documents(
        &self,
        name: &str,
        documents: &[Document],
    ) -> Result<DocumentsChange, RoutingError> {
        let _guard = self.write_lock()?;
        self.loaded_locked(name)?;
        self.change(name, documents, &[])
    }

    /// Delete documents by id from an existing corpus.
    pub fn delete_documents(
        &self,
        name: &str,
        ids: &[String],
    ) -> Result<DocumentsChange, RoutingError> {
        let _guard = self.write_lock()?;
        let loaded = self.loaded_locked(name)?;
        if let Some(missing) = ids
            .iter()
            .find(|id| !loaded.corpus.chunks().iter().any(|c| &c.doc_id == *id))
        {
            return Err(RoutingError::Invalid(format!(
                "corpus {name:?} has no document {missing:?}"
            )));
        }
        self.change(name, &[], ids)
    }

    fn change(
        &self,
        name: &str,
        documents: &[Document],
        delete: &[String],
    ) -> Result<DocumentsChange, RoutingError> {
        if let Some(d) = documents.iter().find(|d| d.id.trim().is_empty()) {
            return Err(RoutingError::Invalid(format!(
                "a document needs a non-empty id (title {:?})",
                d.title
            )));
        }
        let tokenizer = self.embedder.model.tokenizer().clone();
        let report = self.store.ingest(
            name,
            documents,
            delete,
            &self.embedder,
            &tokenizer,
            ChunkerConfig::default(),
        )?;
        let corpus = self.reload(name)?;
        Ok(DocumentsChange {
            added: report.added,
            updated: report.updated,
            unchanged: report.unchanged,
            deleted: report.deleted,
            corpus,
        })
    }

    /// The documents of a corpus.
    pub fn list_documents(&self, name: &str) -> Result<Vec<DocumentSummary>, RoutingError> {
        let loaded = self.loaded(name)?;
        let mut docs: BTreeMap<&str, DocumentSummary> = BTreeMap::new();
        for c in loaded.corpus.chunks() {
            docs.entry(&c.doc_id)
                .or_insert_with(|| DocumentSummary {
                    id: c.doc_id.clone(),
                    title: c.title.clone(),
                    chunks: 0,
                })
                .chunks += 1;
        }
        Ok(docs.into_values().collect())
    }

    fn view<'a>(&self, name: &'a str, loaded: &'a LoadedCorpus) -> CorpusView<'a> {
        CorpusView {
            name,
            corpus: &loaded.corpus,
            backend: None,
            long_context: loaded.long_context.as_ref().map_err(Clone::clone),
        }
    }

    /// Answer one question; `events` sees the path and the answer's text as they come.
    pub fn ask(
        &self,
        request: &AskRequest,
        events: &mut dyn FnMut(AnswerEvent),
    ) -> Result<Answer, RoutingError> {
        let loaded = self.loaded(&request.corpus)?;
        let view = self.view(&request.corpus, &loaded);
        Ok(self.pipeline.ask(
            &mut self.generator(),
            &self.embedder,
            &view,
            request,
            events,
        )?)
    }

    /// Decide the first path without answering.
    pub fn plan(&self, request: &AskRequest) -> Result<DecisionRecord, RoutingError> {
        let loaded = self.loaded(&request.corpus)?;
        let view = self.view(&request.corpus, &loaded);
        Ok(self
            .pipeline
            .plan(&mut self.generator(), &self.embedder, &view, request)?)
    }
}
