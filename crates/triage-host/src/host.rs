//! `Host`: the routing pipeline, its models and its corpora in one value, whatever runs the
//! models. `triage::Engine` is a host over engines in the caller's thread; the server's is a
//! host over its engine threads. Either way one pinner thread of the host pins corpus prefixes
//! in the background (see `registry/pins.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use triage_retrieval::{BertEmbedder, Corpus, Document};
use triage_router::{
    Answer, AnswerEvent, AskRequest, DecisionRecord, Generator, ModelRole, Pipeline, Route,
    RoutePath, RoutingConfig,
};

use crate::config::{needs_router, CorpusLimits};
use crate::error::{HostError, Result};
use crate::registry::{
    CorpusRegistry, CorpusSummary, DocumentSummary, DocumentsChange, LoadedCorpus, PrefixUse,
};

/// How long a routed question waits, by default, for its corpus's long-context prefix to be
/// pinned before it answers without it.
pub const DEFAULT_PIN_WAIT: Duration = Duration::from_millis(1000);

/// How a host reaches its models: it lends the pipeline a [`Generator`] for one call.
pub trait ModelAccess: Send + Sync {
    /// Run `f` with a generator over the role models.
    fn with_generator<R>(&self, f: impl FnOnce(&mut dyn Generator) -> R) -> Result<R>;

    /// [`ModelAccess::with_generator`] whose generations stop once `cancelled` is set (the
    /// caller went away). Models stepped in the caller's own thread cannot be left behind, so
    /// the default ignores it.
    fn with_cancellable_generator<R>(
        &self,
        cancelled: &AtomicBool,
        f: impl FnOnce(&mut dyn Generator) -> R,
    ) -> Result<R> {
        let _ = cancelled;
        self.with_generator(f)
    }
}

/// The pipeline, the models it reaches through `M`, and the corpora it answers from.
pub struct Host<M> {
    models: Arc<M>,
    pipeline: Pipeline,
    corpora: Arc<CorpusRegistry>,
    /// How long a question that may take long context waits for a pin of its corpus that is
    /// under way; past it, the question answers without the long-context path (forced long
    /// context waits for the pin to end).
    pin_wait: Duration,
    /// Runs the queued pins; stopped and joined on drop.
    pinner: Option<JoinHandle<()>>,
}

impl<M> Drop for Host<M> {
    fn drop(&mut self) {
        self.corpora.close_pins();
        if let Some(pinner) = self.pinner.take() {
            let _ = pinner.join();
        }
    }
}

/// The pinner: take queued pins in order until the registry closes.
fn spawn_pinner<M: ModelAccess + 'static>(
    models: Arc<M>,
    corpora: Arc<CorpusRegistry>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("triage-pinner".into())
        .spawn(move || {
            while !corpora.pins_closed() {
                if let Some(task) = corpora.next_pin_task(Duration::from_secs(60)) {
                    if let Err(e) = corpora.run_pin(&*models, task) {
                        tracing::error!(error = %e, "pinning a corpus prefix failed");
                    }
                }
            }
        })
        .map_err(|e| HostError::Internal(format!("starting the pinner thread: {e}")))
}

impl<M> std::fmt::Debug for Host<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("corpora", &self.corpora.names().unwrap_or_default())
            .finish()
    }
}

impl<M: ModelAccess + 'static> Host<M> {
    /// A host over `models` routing with `routing`, its corpora from the store under
    /// `data_dir`. Loads no corpus: see [`Host::load_corpora`].
    pub fn with_models(
        models: M,
        routing: RoutingConfig,
        embedder: BertEmbedder,
        data_dir: &Path,
        prefix_dir: PathBuf,
    ) -> Result<Self> {
        let models = Arc::new(models);
        let corpora = Arc::new(CorpusRegistry::new(data_dir, prefix_dir, embedder));
        let pinner = spawn_pinner(models.clone(), corpora.clone())?;
        Ok(Self {
            models,
            pipeline: Pipeline::new(routing)?,
            corpora,
            pin_wait: DEFAULT_PIN_WAIT,
            pinner: Some(pinner),
        })
    }

    /// How long a routed question waits for a pin of its corpus under way (see
    /// [`DEFAULT_PIN_WAIT`]).
    pub fn with_pin_wait(mut self, wait: Duration) -> Self {
        self.pin_wait = wait;
        self
    }

    /// Wait until the pin of corpus `name`'s long-context prefix, if one is under way, has
    /// ended (pinned, or found not to fit), and return the corpus as it stands. A change
    /// returns before its prefix is pinned; this is how a caller waits for it.
    pub fn wait_pinned(&self, name: &str) -> Result<CorpusSummary> {
        let loaded = self
            .corpora
            .get(name)?
            .ok_or_else(|| HostError::UnknownCorpus(name.to_string()))?;
        let released = self.corpora.wait_pinned(&loaded, None);
        let mut summary = crate::registry::summary(name, &loaded);
        summary.unpinned_corpora = released;
        Ok(summary)
    }

    /// Corpus `name` as it is served now (loaded for RAG first if it is only in the store).
    pub fn corpus(&self, name: &str) -> Result<CorpusSummary> {
        let routing = &self.pipeline.config;
        self.models.with_generator(|g| {
            self.corpora
                .get_or_load(g, routing, name, PrefixUse::Never)
                .map(|loaded| crate::registry::summary(name, &loaded))
        })?
    }

    /// Load `names` (at start), logging each.
    pub fn load_corpora(&self, names: &[String]) -> Result<()> {
        for name in names {
            let summary = self.load_corpus(name)?;
            tracing::info!(corpus = %name, prefix_tokens = ?summary.prefix_tokens, pinned = ?summary.pinned_from, "corpus ready");
        }
        Ok(())
    }

    /// Bound the corpora callers may create and how large they may grow.
    pub fn with_corpus_limits(self, limits: CorpusLimits) -> Self {
        self.corpora.set_limits(limits);
        self
    }

    /// Use a corpus store other than `$TRIAGE_HOME/corpora` (tests, tools).
    pub fn with_store(self, data_dir: &Path) -> Self {
        self.corpora.set_store(data_dir);
        self
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    pub fn embedder(&self) -> &BertEmbedder {
        self.corpora.embedder()
    }

    /// Route the next questions with other settings (the evaluation harness runs several
    /// systems over one set of loaded models). A zero-shot classifier needs the router model.
    pub fn set_routing(&mut self, routing: RoutingConfig) -> Result<()> {
        if needs_router(&routing) {
            self.models
                .with_generator(|g| g.model(ModelRole::Router).map(|_| ()))?
                .map_err(|_| {
                    HostError::Config(
                        "a zero-shot classifier needs the router model: start the engine with it"
                            .into(),
                    )
                })?;
        }
        self.pipeline = Pipeline::new(routing)?;
        Ok(())
    }

    /// Open the corpus `name` and pin its prefix in the long-context model (from the cache, from
    /// the persisted file, or prefilled now and saved), returning once it is pinned. A corpus
    /// too long for the model loads without the long-context path.
    pub fn load_corpus(&self, name: &str) -> Result<CorpusSummary> {
        let routing = &self.pipeline.config;
        self.models
            .with_generator(|g| self.corpora.load(g, routing, name, PrefixUse::MayRead))??;
        self.wait_pinned(name)
    }

    /// Open the corpus `name` without pinning its prefix: the first question that may take long
    /// context pins it, so a caller that answers by RAG only never pays the long-context
    /// model's prefill of the whole corpus.
    pub fn load_corpus_unpinned(&self, name: &str) -> Result<CorpusSummary> {
        let routing = &self.pipeline.config;
        self.models
            .with_generator(|g| self.corpora.load(g, routing, name, PrefixUse::Never))?
    }

    /// Make an already opened corpus answerable, returning once its prefix is pinned.
    pub fn add_corpus(&self, corpus: Corpus) -> Result<CorpusSummary> {
        let routing = &self.pipeline.config;
        let name = corpus.name.clone();
        self.models
            .with_generator(|g| self.corpora.add(g, routing, corpus))??;
        self.wait_pinned(&name)
    }

    /// Stop answering from `name` and release its pinned prefix.
    pub fn unload_corpus(&self, name: &str) -> Result<()> {
        self.models
            .with_generator(|g| self.corpora.unload(g, name))?
    }

    /// Delete a corpus from the store, unloading it first.
    pub fn delete_corpus(&self, name: &str) -> Result<()> {
        self.models
            .with_generator(|g| self.corpora.delete(g, name))?
    }

    /// Names of the loaded corpora.
    pub fn corpora(&self) -> Result<Vec<String>> {
        self.corpora.names()
    }

    /// The loaded corpora.
    pub fn list_corpora(&self) -> Result<Vec<CorpusSummary>> {
        self.corpora.list()
    }

    /// Create a corpus (a conflict if it exists) with `documents`. Returns once they are
    /// stored; the long-context prefix is pinned in the background ([`Host::wait_pinned`]).
    pub fn create_corpus(&self, name: &str, documents: &[Document]) -> Result<DocumentsChange> {
        let routing = &self.pipeline.config;
        self.models
            .with_generator(|g| self.corpora.create(g, routing, name, documents))?
    }

    /// Add or replace documents of an existing corpus. Returns once they are stored; the
    /// long-context prefix is pinned again in the background ([`Host::wait_pinned`]).
    pub fn add_documents(&self, name: &str, documents: &[Document]) -> Result<DocumentsChange> {
        let routing = &self.pipeline.config;
        self.models
            .with_generator(|g| self.corpora.add_documents(g, routing, name, documents))?
    }

    /// Delete documents by id from an existing corpus. Returns once the change is stored; the
    /// long-context prefix is pinned again in the background ([`Host::wait_pinned`]).
    pub fn delete_documents(&self, name: &str, ids: &[String]) -> Result<DocumentsChange> {
        let routing = &self.pipeline.config;
        self.models
            .with_generator(|g| self.corpora.delete_documents(g, routing, name, ids))?
    }

    /// The documents of a corpus.
    pub fn list_documents(&self, name: &str) -> Result<Vec<DocumentSummary>> {
        let routing = &self.pipeline.config;
        self.models
            .with_generator(|g| self.corpora.list_documents(g, routing, name))?
    }

    /// The number of tokens of `text` for the long-context model (what corpus lengths are
    /// measured in).
    pub fn count_tokens(&self, text: &str) -> Result<usize> {
        let model = self
            .models
            .with_generator(|g| g.model(ModelRole::LongContext))??;
        let ids = model
            .tokenizer
            .encode(text, false, false)
            .map_err(triage_router::RouterError::from)?;
        Ok(ids.len())
    }

    /// Answer one question.
    pub fn ask(&self, request: &AskRequest) -> Result<Answer> {
        self.ask_stream(request, |_| {})
    }

    /// Answer one question, passing to `on_event` the corpus generation that answers, then the
    /// answer's path and text as they are decided and generated. A corpus in the store that is
    /// not loaded yet (or whose stored generation is newer) is loaded first.
    pub fn ask_stream(
        &self,
        request: &AskRequest,
        on_event: impl FnMut(AnswerEvent),
    ) -> Result<Answer> {
        self.ask_stream_until(request, &AtomicBool::new(false), on_event)
    }

    /// [`Host::ask_stream`] that gives up, at the next generated token, once `cancelled` is set
    /// (a server's client went away: its question should not cost a full run).
    pub fn ask_stream_until(
        &self,
        request: &AskRequest,
        cancelled: &AtomicBool,
        mut on_event: impl FnMut(AnswerEvent),
    ) -> Result<Answer> {
        let (loaded, released) = self.corpus_for(request)?;
        self.models.with_cancellable_generator(cancelled, |g| {
            let generation = loaded.corpus.generation;
            on_event(AnswerEvent::Corpus { generation });
            let view = loaded.view(&request.corpus);
            let mut answer =
                self.pipeline
                    .ask(g, self.corpora.embedder(), &view, request, &mut on_event)?;
            answer.decision.unpinned_corpora = released;
            answer.decision.corpus_generation = Some(generation);
            Ok(answer)
        })?
    }

    /// Decide the first path without answering.
    pub fn plan(&self, request: &AskRequest) -> Result<DecisionRecord> {
        let (loaded, released) = self.corpus_for(request)?;
        self.models.with_generator(|g| {
            let view = loaded.view(&request.corpus);
            let mut record = self
                .pipeline
                .plan(g, self.corpora.embedder(), &view, request)?;
            record.unpinned_corpora = released;
            record.corpus_generation = Some(loaded.corpus.generation);
            Ok(record)
        })?
    }

    /// The corpus a question is asked over, with its pin waited for as its route says: a
    /// forced long context until the pin ends, auto routing that may take long context up to
    /// the host's `pin_wait` (then it answers without it, and its record says why), other
    /// routes not at all. Also the corpora that pin released to make room.
    fn corpus_for(&self, request: &AskRequest) -> Result<(Arc<LoadedCorpus>, Vec<String>)> {
        let routing = &self.pipeline.config;
        let prefix = prefix_use(request.route, routing);
        let loaded = self.models.with_generator(|g| {
            self.corpora
                .get_or_load(g, routing, &request.corpus, prefix)
        })??;
        let released = match (prefix, request.route) {
            (PrefixUse::Never, _) => Vec::new(),
            (PrefixUse::MayRead, Route::Lc) => self.corpora.wait_pinned(&loaded, None),
            (PrefixUse::MayRead, _) => self.corpora.wait_pinned(&loaded, Some(self.pin_wait)),
        };
        Ok((loaded, released))
    }
}

/// Whether a question on `route` may read the corpus's long-context prefix: a forced long
/// context does, and so does auto routing that may escalate or route to long context.
fn prefix_use(route: Route, routing: &RoutingConfig) -> PrefixUse {
    match route {
        Route::Lc => PrefixUse::MayRead,
        Route::Auto if routing.allows(RoutePath::Lc) => PrefixUse::MayRead,
        Route::Auto | Route::None | Route::Rag | Route::Hybrid => PrefixUse::Never,
    }
}

#[cfg(test)]
mod tests;
