//! `CorpusRegistry`: the corpora a host answers from. It opens a corpus from the store, checks
//! that it was embedded with the host's embedder, swaps it in, queues the pin of its
//! long-context prefix (run in the background, see `pins.rs`: the old prefix is released once
//! the new one is pinned, so the blocks they share are reused; when the prefix does not fit,
//! older prefixes are released first), and unloads it. A change returns once its documents are
//! stored and the new generation is swapped in, not when its prefix is pinned. A prefix that is
//! not resident (released, or never pinned because the corpus was loaded unpinned) is queued by
//! the first question that may take long context, never by one that cannot. Changes to one
//! corpus run one at a time; changes to different corpora, and readers, do not wait for each
//! other.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use triage_retrieval::{BertEmbedder, ChunkerConfig, Corpus, CorpusStore, Document, Embedder};
use triage_router::{long_context_prompt, LongContextPrompt};
use triage_router::{CorpusView, Generator, PinnedPrefix, RoutingConfig};

use crate::config::CorpusLimits;
use crate::error::{HostError, Result};

mod pins;
mod summary;

pub use pins::PinTask;
use pins::{PinQueue, PinSlot, PinState};
pub(crate) use summary::summary;
use summary::{document_bytes, not_loaded};
pub use summary::{CorpusSummary, DocumentSummary, DocumentsChange, PinStatus};

/// Whether a caller may read a corpus's long-context prefix: only then is a prefix that is not
/// resident pinned for it (a prefill of the whole corpus on the long-context model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixUse {
    /// A question that may take long context (auto routing, forced long context), a corpus
    /// loaded to serve such questions, a change to the corpus.
    MayRead,
    /// A question that cannot (closed book, RAG, hybrid), a document listing, a corpus loaded
    /// for RAG answers only.
    Never,
}

/// A corpus ready to answer from, with its long-context form (or why it has none).
#[derive(Debug)]
pub struct LoadedCorpus {
    pub corpus: Corpus,
    pub long_context: std::result::Result<LongContextPrompt, String>,
    /// Every pin and release goes through this lock, so a prefix is released once per pin.
    pin: Mutex<PinSlot>,
    /// Signalled whenever the pin's state changes (questions wait on it for a pin to end).
    pin_changed: Condvar,
    /// The registry's clock at its last use (the least recently used is released first).
    last_used: AtomicU64,
}

impl LoadedCorpus {
    fn new(corpus: Corpus, long_context: std::result::Result<LongContextPrompt, String>) -> Self {
        let pin = if long_context.is_ok() {
            PinState::NotResident
        } else {
            PinState::NoPrefix
        };
        Self {
            corpus,
            long_context,
            pin: Mutex::new(PinSlot::new(pin)),
            pin_changed: Condvar::new(),
            last_used: AtomicU64::new(0),
        }
    }

    /// The pin when the prefix is resident.
    fn pinned(&self) -> Option<PinnedPrefix> {
        match self.pin_state() {
            PinState::Pinned(pinned) => Some(pinned),
            _ => None,
        }
    }

    /// Whether a caller that reads the prefix as `prefix` says needs it pinned first.
    fn wants_pin(&self, prefix: PrefixUse) -> bool {
        prefix == PrefixUse::MayRead && matches!(self.pin_state(), PinState::NotResident)
    }

    fn pin_state(&self) -> PinState {
        self.slot().state.clone()
    }

    /// The long-context prompt when the path is usable: the corpus has one, its prefix fits,
    /// and no pin of it is under way (a question never reads a prefix still being prefilled:
    /// it answers by RAG, and its decision record says why).
    fn usable_long_context(&self) -> std::result::Result<&LongContextPrompt, String> {
        let lc = self.long_context.as_ref().map_err(Clone::clone)?;
        let slot = self.slot();
        let generation = self.corpus.generation;
        match &slot.state {
            PinState::DoesNotFit(why) => Err(why.clone()),
            PinState::Pinning(_) if slot.retired => Err(format!(
                "generation {generation} was replaced while its long-context prefix was being pinned"
            )),
            PinState::Pinning(job) => {
                let (done, total) = job.progress();
                Err(format!(
                    "the long-context prefix of generation {generation} is being pinned ({done} of {total} tokens)"
                ))
            }
            _ => Ok(lc),
        }
    }

    /// What the pipeline reads.
    pub fn view<'a>(&'a self, name: &'a str) -> CorpusView<'a> {
        CorpusView {
            name,
            corpus: &self.corpus,
            backend: None,
            long_context: self.usable_long_context(),
        }
    }
}

/// A store error, a missing corpus as the host's own `UnknownCorpus`.
fn store_error(e: triage_retrieval::RetrievalError) -> HostError {
    match e {
        triage_retrieval::RetrievalError::UnknownCorpus(n) => HostError::UnknownCorpus(n),
        other => other.into(),
    }
}

fn poisoned(what: &str) -> HostError {
    HostError::Internal(format!("{what} poisoned by a panicked request"))
}

/// The loaded corpora by name.
type Table = BTreeMap<String, Arc<LoadedCorpus>>;

/// The corpora of a host and the store they come from.
pub struct CorpusRegistry {
    store: RwLock<CorpusStore>,
    prefix_dir: PathBuf,
    embedder: BertEmbedder,
    limits: RwLock<CorpusLimits>,
    corpora: RwLock<Table>,
    /// One writer per corpus (ingesting and re-pinning one name are not concurrent-safe);
    /// entries exist only for names in the store or being created.
    writers: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Ticks once per use of any corpus: the order in which prefixes are released.
    clock: AtomicU64,
    /// Pins waiting for the pinner.
    pins: PinQueue,
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
            store: RwLock::new(CorpusStore::new(data_dir)),
            prefix_dir,
            embedder,
            limits: RwLock::new(CorpusLimits::default()),
            corpora: RwLock::new(BTreeMap::new()),
            writers: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(0),
            pins: PinQueue::default(),
        }
    }

    /// Read corpora from the store under `data_dir` instead (tests, tools); loaded corpora stay.
    pub fn set_store(&self, data_dir: &Path) {
        *self.store.write().unwrap_or_else(PoisonError::into_inner) = CorpusStore::new(data_dir);
    }

    /// Bound what callers may store.
    pub fn set_limits(&self, limits: CorpusLimits) {
        *self.limits.write().unwrap_or_else(PoisonError::into_inner) = limits;
    }

    // Both hold plain values that are only ever replaced whole, so a poisoned lock still
    // holds a valid one.
    fn store(&self) -> CorpusStore {
        self.store
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn limits(&self) -> CorpusLimits {
        *self.limits.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn embedder(&self) -> &BertEmbedder {
        &self.embedder
    }

    /// The writer lock of corpus `name` (held for the whole of a change to it).
    fn writer(&self, name: &str) -> Result<Arc<Mutex<()>>> {
        let mut writers = self
            .writers
            .lock()
            .map_err(|_| poisoned("the writer table"))?;
        Ok(writers.entry(name.to_string()).or_default().clone())
    }

    /// Run `f` holding the writer lock of corpus `name`.
    fn with_writer<R>(&self, name: &str, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let lock = self.writer(name)?;
        let _guard = lock.lock().map_err(|_| poisoned("a corpus lock"))?;
        f()
    }

    /// `UnknownCorpus` unless `name` is in the store.
    fn require_stored(&self, name: &str) -> Result<()> {
        if self.in_store(name)? {
            Ok(())
        } else {
            Err(HostError::UnknownCorpus(name.to_string()))
        }
    }

    fn forget_writer(&self, name: &str) {
        if let Ok(mut writers) = self.writers.lock() {
            writers.remove(name);
        }
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

    fn touch(&self, loaded: &LoadedCorpus) {
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        loaded.last_used.store(now, Ordering::Relaxed);
    }

    /// The loaded corpus `name`, if it is loaded.
    pub fn get(&self, name: &str) -> Result<Option<Arc<LoadedCorpus>>> {
        Ok(self.table()?.get(name).cloned())
    }

    fn in_store(&self, name: &str) -> Result<bool> {
        Ok(self.store().list()?.iter().any(|n| n == name))
    }

    /// The corpus `name`. One in the store but not loaded yet (made by `triage ingest`, by
    /// another replica sharing the store, or before a restart) is loaded now; so is a newer
    /// generation another writer stored. Its prefix's pin is queued when `prefix` says the
    /// caller may read it and it is not resident: see [`CorpusRegistry::wait_pinned`].
    pub fn get_or_load(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        prefix: PrefixUse,
    ) -> Result<Arc<LoadedCorpus>> {
        if let Some(loaded) = self.get(name)? {
            self.touch(&loaded);
            if !self.superseded(&loaded, name)? {
                if loaded.wants_pin(prefix) {
                    self.request_pin(name, &loaded);
                }
                return Ok(loaded);
            }
        } else if !self.in_store(name)? {
            return Err(HostError::UnknownCorpus(name.to_string()));
        }
        self.with_writer(name, || {
            self.get_or_load_locked(generator, routing, name, prefix)
        })
    }

    fn get_or_load_locked(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        prefix: PrefixUse,
    ) -> Result<Arc<LoadedCorpus>> {
        if let Some(loaded) = self.get(name)? {
            if !self.superseded(&loaded, name)? {
                if loaded.wants_pin(prefix) {
                    self.request_pin(name, &loaded);
                }
                return Ok(loaded);
            }
        }
        let corpus = self.open(name)?;
        Ok(self.swap_in(generator, routing, corpus, prefix)?.1)
    }

    /// Wait up to `timeout` (for ever with `None`) while the pin of `loaded`'s generation runs;
    /// the corpora its pin released to make room, once pinned (to the first caller that asks).
    /// Call it without holding the models: a pinner that steps them in this process needs them.
    pub fn wait_pinned(&self, loaded: &LoadedCorpus, timeout: Option<Duration>) -> Vec<String> {
        loaded.wait_pinned(timeout)
    }

    fn open(&self, name: &str) -> Result<Corpus> {
        self.store().open(name).map_err(store_error)
    }

    /// Whether the store holds a newer generation of `name` than `loaded` (another writer
    /// sharing the store changed it). A corpus the store does not hold is never superseded.
    fn superseded(&self, loaded: &LoadedCorpus, name: &str) -> Result<bool> {
        let live = self.store().live_generation(name).map_err(store_error)?;
        Ok(live.is_some_and(|g| g > loaded.corpus.generation))
    }

    /// Open `name` from the store (it must exist) and, for [`PrefixUse::MayRead`], queue the
    /// pin of its long-context prefix; with [`PrefixUse::Never`] the first question that may
    /// take long context queues it. A corpus loaded before is replaced.
    pub fn load(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        prefix: PrefixUse,
    ) -> Result<CorpusSummary> {
        self.require_stored(name)?;
        self.with_writer(name, || {
            let corpus = self.open(name)?;
            Ok(self.swap_in(generator, routing, corpus, prefix)?.0)
        })
    }

    /// Make an already opened corpus answerable.
    pub fn add(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        corpus: Corpus,
    ) -> Result<CorpusSummary> {
        let name = corpus.name.clone();
        self.with_writer(&name, || {
            Ok(self
                .swap_in(generator, routing, corpus, PrefixUse::MayRead)?
                .0)
        })
    }

    /// The loaded corpus other than `except` whose pinned prefix was used least recently.
    fn least_recently_used_pinned(
        &self,
        except: &str,
    ) -> Result<Option<(String, Arc<LoadedCorpus>)>> {
        Ok(self
            .table()?
            .iter()
            .filter(|(n, l)| n.as_str() != except && l.pinned().is_some())
            .min_by_key(|(_, l)| l.last_used.load(Ordering::Relaxed))
            .map(|(n, l)| (n.clone(), l.clone())))
    }

    /// Check the embedder, swap the corpus in, and queue the pin of its prefix (unless `prefix`
    /// says it is not read yet). The old generation's pin is cancelled if it is still running;
    /// a prefix it holds is released once the new one's pin ends (pins are counted, so blocks
    /// the two share stay resident), or now when the new one is not pinned.
    fn swap_in(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        corpus: Corpus,
        prefix: PrefixUse,
    ) -> Result<(CorpusSummary, Arc<LoadedCorpus>)> {
        if corpus.embedder_id() != self.embedder.id() {
            return Err(HostError::EmbedderMismatch {
                corpus: corpus.name.clone(),
                corpus_embedder: corpus.embedder_id().to_string(),
                embedder: self.embedder.id(),
            });
        }
        let long_context = long_context_prompt(generator, &corpus, routing)?;
        let name = corpus.name.clone();
        let loaded = Arc::new(LoadedCorpus::new(corpus, long_context));
        self.touch(&loaded);
        if loaded.wants_pin(prefix) {
            self.request_pin(&name, &loaded);
        }
        let old = self.table_mut()?.insert(name.clone(), loaded.clone());
        if let Some(old) = old {
            let release = self.retire(&old, Some(&loaded));
            self.release_now(generator, &release)?;
        }
        Ok((summary(&name, &loaded), loaded))
    }

    /// Stop serving `old` (unloaded or deleted): its pin stops, its prefixes are released.
    fn drop_loaded(&self, generator: &mut dyn Generator, old: &Arc<LoadedCorpus>) -> Result<()> {
        let release = self.retire(old, None);
        self.release_now(generator, &release)
    }

    /// Stop answering from `name` and release its pinned prefix.
    pub fn unload(&self, generator: &mut dyn Generator, name: &str) -> Result<()> {
        self.with_writer(name, || {
            let old = self
                .table_mut()?
                .remove(name)
                .ok_or_else(|| HostError::UnknownCorpus(name.to_string()))?;
            self.drop_loaded(generator, &old)
        })
    }

    /// Delete corpus `name` from the store, unloading it (and releasing its prefix) first.
    pub fn delete(&self, generator: &mut dyn Generator, name: &str) -> Result<()> {
        if !self.in_store(name)? && self.get(name)?.is_none() {
            return Err(HostError::UnknownCorpus(name.to_string()));
        }
        self.with_writer(name, || {
            let removed = self.table_mut()?.remove(name);
            if let Some(old) = removed {
                self.drop_loaded(generator, &old)?;
            }
            let deleted = self.store().delete(name).map_err(store_error);
            self.forget_writer(name);
            deleted
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
            .map(|(name, loaded)| summary(name, loaded))
            .collect())
    }

    fn check_count(&self, what: &str, n: usize) -> Result<()> {
        let max = self.limits().max_documents_per_request;
        if n > max {
            return Err(HostError::Invalid(format!(
                "{n} {what} in one request; at most {max} (split the request)"
            )));
        }
        Ok(())
    }

    /// Create a corpus (a conflict if it exists) with `documents`.
    pub fn create(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        documents: &[Document],
    ) -> Result<DocumentsChange> {
        self.check_count("documents", documents.len())?;
        let stored = self.store().list()?;
        if stored.iter().any(|n| n == name) {
            return Err(HostError::CorpusExists(name.to_string()));
        }
        if stored.len() >= self.limits().max_corpora {
            return Err(HostError::Invalid(format!(
                "the store holds {} corpora, the most this server keeps; delete one first",
                stored.len()
            )));
        }
        self.with_writer(name, || {
            if self.in_store(name)? {
                return Err(HostError::CorpusExists(name.to_string()));
            }
            let change = self.change(generator, routing, name, None, documents, &[]);
            if !self.in_store(name).unwrap_or(true) {
                self.forget_writer(name);
            }
            change
        })
    }

    /// Add or replace documents of an existing corpus.
    pub fn add_documents(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        documents: &[Document],
    ) -> Result<DocumentsChange> {
        self.check_count("documents", documents.len())?;
        self.require_stored(name)?;
        self.with_writer(name, || {
            let loaded = self.get_or_load_locked(generator, routing, name, PrefixUse::Never)?;
            self.change(generator, routing, name, Some(&loaded), documents, &[])
        })
    }

    /// Delete documents by id from an existing corpus.
    pub fn delete_documents(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        ids: &[String],
    ) -> Result<DocumentsChange> {
        self.check_count("document ids", ids.len())?;
        self.require_stored(name)?;
        self.with_writer(name, || {
            let loaded = self.get_or_load_locked(generator, routing, name, PrefixUse::Never)?;
            let known = document_bytes(&loaded.corpus);
            if let Some(missing) = ids.iter().find(|id| !known.contains_key(id.as_str())) {
                return Err(HostError::Invalid(format!(
                    "corpus {name:?} has no document {missing:?}"
                )));
            }
            self.change(generator, routing, name, Some(&loaded), &[], ids)
        })
    }

    /// Refuse a change that would take the corpus past its byte limit.
    fn check_bytes(
        &self,
        name: &str,
        old: Option<&LoadedCorpus>,
        documents: &[Document],
        delete: &[String],
    ) -> Result<()> {
        let mut bytes = old.map(|o| document_bytes(&o.corpus)).unwrap_or_default();
        for id in delete {
            bytes.remove(id.as_str());
        }
        for d in documents {
            bytes.insert(d.id.as_str(), d.text.len() + d.title.len());
        }
        let total: usize = bytes.values().sum();
        let max = self.limits().max_corpus_bytes;
        if total > max {
            return Err(HostError::TooLarge(format!(
                "corpus {name:?} would hold {total} bytes of text; this server keeps at most {max} per corpus"
            )));
        }
        Ok(())
    }

    /// Store the change as a new generation, then load it and queue its prefix's pin (the
    /// change returns without waiting for it). A load that fails after the store succeeded is reported in the answer (the documents are kept; the previous generation is
    /// still served), not as an error that would make the caller send them again.
    fn change(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
        old: Option<&LoadedCorpus>,
        documents: &[Document],
        delete: &[String],
    ) -> Result<DocumentsChange> {
        if let Some(d) = documents.iter().find(|d| d.id.trim().is_empty()) {
            return Err(HostError::Invalid(format!(
                "a document needs a non-empty id (title {:?})",
                d.title
            )));
        }
        self.limits().documents().check(documents)?;
        self.check_bytes(name, old, documents, delete)?;
        let tokenizer = self.embedder.model.tokenizer().clone();
        let report = self.store().ingest(
            name,
            documents,
            delete,
            &self.embedder,
            &tokenizer,
            old.map_or_else(ChunkerConfig::default, |o| o.corpus.chunker()),
        )?;
        let reloaded = self
            .open(name)
            .and_then(|corpus| self.swap_in(generator, routing, corpus, PrefixUse::MayRead));
        let (corpus, reload_error) = match reloaded {
            Ok((summary, _)) => (summary, None),
            Err(e) => {
                tracing::error!(corpus = %name, error = %e, "stored a new generation but could not load it");
                let served = self.get(name)?.map(|l| summary(name, &l));
                let message = format!(
                    "the documents are stored, but loading them failed ({e}); {} until the next load",
                    if served.is_some() { "the previous documents are served" } else { "the corpus is not served" }
                );
                (served.unwrap_or_else(|| not_loaded(name)), Some(message))
            }
        };
        Ok(DocumentsChange {
            added: report.added,
            updated: report.updated,
            unchanged: report.unchanged,
            deleted: report.deleted,
            corpus,
            reload_error,
        })
    }

    /// The documents of a corpus.
    pub fn list_documents(
        &self,
        generator: &mut dyn Generator,
        routing: &RoutingConfig,
        name: &str,
    ) -> Result<Vec<DocumentSummary>> {
        let loaded = self.get_or_load(generator, routing, name, PrefixUse::Never)?;
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

#[cfg(test)]
mod tests;
