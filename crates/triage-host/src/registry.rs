//! `CorpusRegistry`: the corpora a host answers from. It opens a corpus from the store, checks
//! that it was embedded with the host's embedder, pins its long-context prefix (the new prefix
//! before the old one is unpinned, so an unchanged corpus keeps its cached blocks), swaps it in,
//! and unloads it. Changes run one at a time; readers never wait for a prefill.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::Serialize;
use triage_engine::llm_engine::PrefixSource;
use triage_retrieval::{BertEmbedder, ChunkerConfig, Corpus, CorpusStore, Document, Embedder};
use triage_router::long_context::{prepare_long_context, LongContextPrompt};
use triage_router::{CorpusView, Generator, ModelRole, PinnedPrefix, RoutingConfig};

use crate::error::{HostError, Result};

/// A corpus ready to answer from, with its long-context form (or why it has none).
#[derive(Debug)]
pub struct LoadedCorpus {
    pub corpus: Corpus,
    pub long_context: std::result::Result<LongContextPrompt, String>,
}

impl LoadedCorpus {
    /// What the pipeline reads.
    pub fn view<'a>(&'a self, name: &'a str) -> CorpusView<'a> {
        CorpusView {
            name,
            corpus: &self.corpus,
            backend: None,
            long_context: self.long_context.as_ref().map_err(Clone::clone),
        }
    }
}

/// What loading (or listing) a corpus reports.
#[derive(Debug, Clone, Serialize)]
pub struct CorpusSummary {
    pub name: String,
    #[serde(rename = "documents")]
    pub num_documents: usize,
    #[serde(rename = "chunks")]
    pub num_chunks: usize,
    /// Tokens of the corpus prefix in the long-context model, when it fits.
    pub prefix_tokens: Option<usize>,
    /// Tokens pinned in the cache by this load, and where their KV came from (`cache`,
    /// `disk`, `computed`); absent in listings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_tokens: Option<usize>,
    pub pinned_from: Option<&'static str>,
    /// Why the long-context path is unavailable for it.
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

/// The name the summaries give a prefix's source.
pub fn pinned_name(source: PrefixSource) -> &'static str {
    match source {
        PrefixSource::Cache => "cache",
        PrefixSource::Disk => "disk",
        PrefixSource::Computed => "computed",
    }
}

fn summary(name: &str, loaded: &LoadedCorpus, pinned: Option<PinnedPrefix>) -> CorpusSummary {
    CorpusSummary {
        name: name.to_string(),
        num_documents: loaded.corpus.num_documents(),
        num_chunks: loaded.corpus.chunks().len(),
        prefix_tokens: loaded.long_context.as_ref().ok().map(|lc| lc.prefix.len()),
        pinned_tokens: pinned.map(|p| p.num_tokens),
        pinned_from: pinned.map(|p| pinned_name(p.source)),
        long_context_unavailable: loaded.long_context.as_ref().err().cloned(),
    }
}

fn poisoned(what: &str) -> HostError {
    HostError::Internal(format!("{what} poisoned by a panicked request"))
}

/// The loaded corpora by name.
type Table = BTreeMap<String, Arc<LoadedCorpus>>;

/// The corpora of a host and the store they come from.
pub struct CorpusRegistry {
    store: CorpusStore,
    prefix_dir: PathBuf,
    embedder: BertEmbedder,
    corpora: RwLock<Table>,
    /// Changes run one at a time (ingesting and re-pinning one name are not concurrent-safe).
    writing: Mutex<()>,
}

impl std::fmt::Debug for CorpusRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CorpusRegistry")
            .field("prefix_dir", &self.prefix_dir)
            .finish()
    }
}

impl CorpusRegistry {
    /// Corpora from the store under `data_dir`, embedded with `embedder`, their pinned prefixes
    /// persisted under `prefix_dir`.
    pub fn new(data_dir: &Path, prefix_dir: PathBuf, embedder: BertEmbedder) -> Self {
        Self {
            store: CorpusStore::new(data_dir),
            prefix_dir,
            embedder,
            corpora: RwLock::new(BTreeMap::new()),
            writing: Mutex::new(()),
        }
    }

    /// Read corpora from the store under `data_dir` instead (tests, tools); loaded corpora stay.
    pub fn set_store(&mut self, data_dir: &Path) {
        self.store = CorpusStore::new(data_dir);
    }

    pub fn embedder(&self) -> &BertEmbedder {
        &self.embedder
    }

    fn write_lock(&self) -> Result<MutexGuard<'_, ()>> {
        self.writing.lock().map_err(|_| poisoned("the corpus lock"))
    }

    fn table(&self) -> Result<RwLockReadGuard<'_, Table>> {
        self.corpora
            .read()
            .map_err(|_| poisoned("the corpus table"))
    }

    fn table_mut(&self) -> Result<RwLockWriteGuard<'_, Table>> {
        self.corpora
            .write()
            .map_err(|_| poisoned("the corpus table"))
    }

    /// The loaded corpus `name`, if it is loaded.
    pub fn get(&self, name: &str) -> Result<Option<Arc<LoadedCorpus>>> {
        Ok(self.table()?.get(name).cloned())
    }

    /// The corpus `name`; one in the store but not loaded yet (made by `triage ingest`, or
    /// before a restart) is loaded now, its prefix pinned on first use.
    pub fn get_or_load(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
    ) -> Result<Arc<LoadedCorpus>> {
        if let Some(loaded) = self.get(name)? {
            return Ok(loaded);
        }
        let _guard = self.write_lock()?;
        self.get_or_load_locked(generator, routing, name)
    }

    fn get_or_load_locked(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
    ) -> Result<Arc<LoadedCorpus>> {
        if let Some(loaded) = self.get(name)? {
            return Ok(loaded);
        }
        let corpus = self.open(name)?;
        self.swap_in(generator, routing, corpus)?;
        self.get(name)?
            .ok_or_else(|| HostError::UnknownCorpus(name.to_string()))
    }

    fn open(&self, name: &str) -> Result<Corpus> {
        self.store.open(name).map_err(|e| match e {
            triage_retrieval::RetrievalError::UnknownCorpus(n) => HostError::UnknownCorpus(n),
            other => other.into(),
        })
    }

    /// Open `name` from the store (it must exist) and pin its long-context prefix; a corpus
    /// loaded before is replaced.
    pub fn load(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
    ) -> Result<CorpusSummary> {
        let _guard = self.write_lock()?;
        let corpus = self.open(name)?;
        self.swap_in(generator, routing, corpus)
    }

    /// Make an already opened corpus answerable.
    pub fn add(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        corpus: Corpus,
    ) -> Result<CorpusSummary> {
        let _guard = self.write_lock()?;
        self.swap_in(generator, routing, corpus)
    }

    /// Check the embedder, pin the new prefix, swap the corpus in, then unpin the old prefix
    /// unless it is the same (its blocks stay cached).
    fn swap_in(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        corpus: Corpus,
    ) -> Result<CorpusSummary> {
        if corpus.embedder_id() != self.embedder.id() {
            return Err(HostError::EmbedderMismatch {
                corpus: corpus.name.clone(),
                corpus_embedder: corpus.embedder_id().to_string(),
                embedder: self.embedder.id(),
            });
        }
        let (long_context, pinned) =
            prepare_long_context(generator, &corpus, routing, &self.prefix_dir)?;
        let name = corpus.name.clone();
        let loaded = Arc::new(LoadedCorpus {
            corpus,
            long_context,
        });
        let summary = summary(&name, &loaded, pinned);
        let old = self.table_mut()?.insert(name, loaded.clone());
        if let Some(Ok(old_lc)) = old.as_ref().map(|o| o.long_context.as_ref()) {
            let unchanged = loaded
                .long_context
                .as_ref()
                .is_ok_and(|lc| lc.prefix == old_lc.prefix);
            if !unchanged {
                generator.unpin_prefix(ModelRole::LongContext, &old_lc.prefix)?;
            }
        }
        Ok(summary)
    }

    /// Stop answering from `name` and release its pinned prefix.
    pub fn unload(&self, generator: &mut dyn Generator, name: &str) -> Result<()> {
        let _guard = self.write_lock()?;
        let old = self
            .table_mut()?
            .remove(name)
            .ok_or_else(|| HostError::UnknownCorpus(name.to_string()))?;
        if let Ok(lc) = &old.long_context {
            generator.unpin_prefix(ModelRole::LongContext, &lc.prefix)?;
        }
        Ok(())
    }

    /// Delete corpus `name` from the store, unloading it (and releasing its prefix) first.
    pub fn delete(&self, generator: &mut dyn Generator, name: &str) -> Result<()> {
        let _guard = self.write_lock()?;
        if let Some(old) = self.table_mut()?.remove(name) {
            if let Ok(lc) = &old.long_context {
                generator.unpin_prefix(ModelRole::LongContext, &lc.prefix)?;
            }
        }
        self.store.delete(name).map_err(|e| match e {
            triage_retrieval::RetrievalError::UnknownCorpus(n) => HostError::UnknownCorpus(n),
            other => other.into(),
        })
    }

    /// The names of the loaded corpora.
    pub fn names(&self) -> Result<Vec<String>> {
        Ok(self.table()?.keys().cloned().collect())
    }

    /// The loaded corpora.
    pub fn list(&self) -> Result<Vec<CorpusSummary>> {
        Ok(self
            .table()?
            .iter()
            .map(|(name, loaded)| summary(name, loaded, None))
            .collect())
    }

    /// Create a corpus (a conflict if it exists) with `documents`.
    pub fn create(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        documents: &[Document],
    ) -> Result<DocumentsChange> {
        let _guard = self.write_lock()?;
        if self.store.list()?.iter().any(|n| n == name) {
            return Err(HostError::CorpusExists(name.to_string()));
        }
        self.change(generator, routing, name, documents, &[])
    }

    /// Add or replace documents of an existing corpus.
    pub fn add_documents(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        documents: &[Document],
    ) -> Result<DocumentsChange> {
        let _guard = self.write_lock()?;
        self.get_or_load_locked(generator, routing, name)?;
        self.change(generator, routing, name, documents, &[])
    }

    /// Delete documents by id from an existing corpus.
    pub fn delete_documents(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        ids: &[String],
    ) -> Result<DocumentsChange> {
        let _guard = self.write_lock()?;
        let loaded = self.get_or_load_locked(generator, routing, name)?;
        if let Some(missing) = ids
            .iter()
            .find(|id| !loaded.corpus.chunks().iter().any(|c| &c.doc_id == *id))
        {
            return Err(HostError::Invalid(format!(
                "corpus {name:?} has no document {missing:?}"
            )));
        }
        self.change(generator, routing, name, &[], ids)
    }

    fn change(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        documents: &[Document],
        delete: &[String],
    ) -> Result<DocumentsChange> {
        if let Some(d) = documents.iter().find(|d| d.id.trim().is_empty()) {
            return Err(HostError::Invalid(format!(
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
        let corpus = self.open(name)?;
        let summary = self.swap_in(generator, routing, corpus)?;
        Ok(DocumentsChange {
            added: report.added,
            updated: report.updated,
            unchanged: report.unchanged,
            deleted: report.deleted,
            corpus: summary,
        })
    }

    /// The documents of a corpus.
    pub fn list_documents(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
    ) -> Result<Vec<DocumentSummary>> {
        let loaded = self.get_or_load(generator, routing, name)?;
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
}
