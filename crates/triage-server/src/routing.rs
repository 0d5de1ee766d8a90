//! `RoutingService`: the routing pipeline inside the server, a [`Host`] whose models are the
//! engine workers (so pipeline requests share continuous batching with plain chat traffic). Its
//! corpora live in the corpus store and are managed over `/v1/corpora`; each loaded corpus keeps
//! its long-context prefix pinned in the long-context worker. Every method blocks: handlers call
//! it on tokio's blocking pool.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use triage_engine::{
    tokenize_prompt, EngineError, FinishReason, GenerateRequest, PinJob, StreamEvent, TokenOutput,
};
use triage_host::{Host, HostError, ModelAccess};
use triage_models::model::Model;
use triage_retrieval::BertEmbedder;
use triage_router::{Generated, Generator, ModelRole, RouterError, RoutingConfig};

use crate::metrics::ResidentPrefix;
use crate::worker::EngineWorker;

/// The models of the pipeline, reached through their engine workers.
struct WorkerGenerator<'a> {
    roles: &'a HashMap<ModelRole, Arc<EngineWorker>>,
    /// Set when the client went away: generations stop at their next token.
    cancelled: Option<&'a AtomicBool>,
}

/// The error of a generation stopped because its client went away.
fn client_gone() -> RouterError {
    RouterError::Invalid("the client went away; the request was cancelled".into())
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
    cancelled: Option<&AtomicBool>,
) -> triage_router::Result<Generated> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(event) = rx.blocking_recv() {
        // Dropping the receiver (on return) cancels the request at the engine's next step.
        if cancelled.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(client_gone());
        }
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
                        finish_reason: FinishReason::Cancelled,
                        // A stopped request's usage never arrives (its listener is gone): the
                        // prompt is counted here, its cached part is unknown.
                        usage: triage_engine::Usage {
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens: 0,
                        },
                        elapsed: started.elapsed(),
                    });
                }
            }
            StreamEvent::Text(piece) => text.push_str(&piece),
            StreamEvent::Finished { reason, .. } if !reason.is_normal() => {
                // The engine cut the request off (an engine error, a forced shutdown): the
                // pipeline's answer would be partial, so it fails rather than look finished.
                let message = match reason {
                    FinishReason::Error(message) => message,
                    _ => "the engine cancelled the request (shutting down)".to_string(),
                };
                return Err(RouterError::Engine(EngineError::RequestFailed(message)));
            }
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
    Err(RouterError::Engine(EngineError::RequestFailed(
        "the engine stopped before the request finished".into(),
    )))
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
        if self.cancelled.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(client_gone());
        }
        let started = std::time::Instant::now();
        let mut receivers = Vec::with_capacity(requests.len());
        for request in requests {
            let prompt_tokens = tokenize_prompt(&worker.model, &request.prompt)?.len();
            receivers.push((worker.submit_blocking(request.clone())?, prompt_tokens));
        }
        receivers
            .into_iter()
            .enumerate()
            .map(|(i, (rx, prompt_tokens))| {
                drain(rx, prompt_tokens, i, watch, started, self.cancelled)
            })
            .collect()
    }

    fn start_pin(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
        job: Arc<PinJob>,
    ) -> triage_router::Result<()> {
        Ok(self
            .worker(role)?
            .start_pin(tokens.to_vec(), dir.map(Path::to_path_buf), job)?)
    }

    /// The engine threads step their pins.
    fn drive_pins(&mut self) -> triage_router::Result<bool> {
        Ok(false)
    }

    fn unpin_prefix(&mut self, role: ModelRole, tokens: &[u32]) -> triage_router::Result<()> {
        Ok(self.worker(role)?.unpin(tokens.to_vec())?)
    }
}

/// The workers that play the pipeline's roles.
pub struct WorkerModels {
    roles: HashMap<ModelRole, Arc<EngineWorker>>,
}

impl WorkerModels {
    /// The workers by role: the base model is required; the long-context and router roles
    /// fall back to it.
    pub fn new(workers: &[Arc<EngineWorker>]) -> Result<Self, HostError> {
        let by_role = |role: ModelRole| workers.iter().find(|w| w.role == role).cloned();
        let base = by_role(ModelRole::Base)
            .ok_or_else(|| HostError::Config("routing needs a model with role \"base\"".into()))?;
        let mut roles = HashMap::new();
        for role in [ModelRole::LongContext, ModelRole::Router] {
            roles.insert(role, by_role(role).unwrap_or_else(|| base.clone()));
        }
        roles.insert(ModelRole::Base, base);
        Ok(Self { roles })
    }
}

impl ModelAccess for WorkerModels {
    fn with_generator<R>(&self, f: impl FnOnce(&mut dyn Generator) -> R) -> Result<R, HostError> {
        Ok(f(&mut WorkerGenerator {
            roles: &self.roles,
            cancelled: None,
        }))
    }

    fn with_cancellable_generator<R>(
        &self,
        cancelled: &AtomicBool,
        f: impl FnOnce(&mut dyn Generator) -> R,
    ) -> Result<R, HostError> {
        Ok(f(&mut WorkerGenerator {
            roles: &self.roles,
            cancelled: Some(cancelled),
        }))
    }
}

/// The pipeline, its models, and the corpora it answers from.
pub struct RoutingService {
    /// The `model` name clients use for the pipeline.
    pub alias: String,
    pub host: Host<WorkerModels>,
    /// The workers playing its roles (a pipeline request takes a queue ticket on the base
    /// model's, and is refused while any of them has stopped).
    pub workers: Vec<Arc<EngineWorker>>,
    /// The worker that pins corpus prefixes (the long-context role's).
    long_context: Option<Arc<EngineWorker>>,
}

impl std::fmt::Debug for RoutingService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutingService")
            .field("alias", &self.alias)
            .finish()
    }
}

impl RoutingService {
    /// A service over `workers` (see [`WorkerModels::new`]), its corpora in the store under
    /// `data_dir`.
    pub fn new(
        alias: &str,
        config: RoutingConfig,
        workers: &[Arc<EngineWorker>],
        embedder: BertEmbedder,
        data_dir: &Path,
        prefix_dir: PathBuf,
    ) -> Result<Self, HostError> {
        let models = WorkerModels::new(workers)?;
        let mut roles: Vec<Arc<EngineWorker>> = Vec::new();
        for role in [ModelRole::Base, ModelRole::LongContext, ModelRole::Router] {
            if let Some(w) = models.roles.get(&role) {
                if !roles.iter().any(|r| Arc::ptr_eq(r, w)) {
                    roles.push(w.clone());
                }
            }
        }
        let long_context = models.roles.get(&ModelRole::LongContext).cloned();
        Ok(Self {
            long_context,
            alias: alias.to_string(),
            host: Host::with_models(models, config, embedder, data_dir, prefix_dir)?,
            workers: roles,
        })
    }

    /// The corpus prefixes pinned now, for `/metrics`: the tokens of their whole blocks (only
    /// those are pinned).
    pub fn resident_prefixes(&self) -> Vec<ResidentPrefix> {
        let (Some(worker), Ok(corpora)) = (&self.long_context, self.host.list_corpora()) else {
            return Vec::new();
        };
        let block_size = worker.stats.block_size.load(Ordering::Relaxed).max(1);
        corpora
            .into_iter()
            .filter(|c| c.prefix_pinned)
            .filter_map(|c| {
                Some(ResidentPrefix {
                    generation: c.generation?,
                    tokens: c.prefix_tokens? / block_size * block_size,
                    corpus: c.name,
                    model: worker.name.clone(),
                })
            })
            .collect()
    }

    /// Bound the corpora clients may create over `/v1/corpora` and how large they may grow.
    pub fn with_corpus_limits(mut self, limits: triage_host::CorpusLimits) -> Self {
        self.host = self.host.with_corpus_limits(limits);
        self
    }

    /// How long a routed question waits for a pin of its corpus under way.
    pub fn with_pin_wait(mut self, wait: std::time::Duration) -> Self {
        self.host = self.host.with_pin_wait(wait);
        self
    }
}
