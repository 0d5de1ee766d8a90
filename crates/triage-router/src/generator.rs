//! `Generator`: how the routing stages reach the models. A stage hands a batch of requests to the
//! model that plays a role (router, base, long-context) and watches the tokens as they come; the
//! library drives `LlmEngine`s in this thread, the server its engine workers, tests a script.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use triage_core::PrefixHandle;
use triage_engine::EngineSet;
use triage_engine::{FinishReason, GenerateRequest, TokenOutput};
use triage_engine::{LlmEngine, PrefixSource, StreamEvent, Usage};
use triage_models::model::Model;

pub use triage_types::ModelRole;

use crate::error::{Result, RouterError};

/// One finished request.
#[derive(Debug, Clone)]
pub struct Generated {
    pub text: String,
    pub tokens: Vec<TokenOutput>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    /// From submission to the last event.
    pub elapsed: Duration,
}

/// A prefix kept resident in a model's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedPrefix {
    /// Tokens pinned (whole blocks only; the tail of the prefix is prefilled with each question).
    pub num_tokens: usize,
    pub source: PrefixSource,
}

/// The models behind the roles.
pub trait Generator {
    /// The model playing `role` (for its tokenizer, chat template and context length).
    fn model(&self, role: ModelRole) -> Result<Arc<Model>>;

    /// Run `requests` as one batch on `role`'s model. `watch(i, token)` sees each token of request
    /// `i` with the text it adds (cut at stop strings) as it is produced; returning `false` stops that request at once (its result then ends
    /// with `FinishReason::Cancelled`).
    fn generate(
        &mut self,
        role: ModelRole,
        requests: &[GenerateRequest],
        watch: &mut dyn FnMut(usize, &TokenOutput, &str) -> bool,
    ) -> Result<Vec<Generated>>;

    /// Keep `tokens` resident in `role`'s cache (persisted under `dir` when given) until
    /// [`Generator::unpin_prefix`].
    fn pin_prefix(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
    ) -> Result<PinnedPrefix>;

    /// Release what [`Generator::pin_prefix`] pinned for `tokens`.
    fn unpin_prefix(&mut self, role: ModelRole, tokens: &[u32]) -> Result<()>;
}

/// Run `requests` on `engine` until each has finished, stepping it (and so any other request
/// queued on it) meanwhile.
fn run_on_engine(
    engine: &mut LlmEngine,
    requests: &[GenerateRequest],
    watch: &mut dyn FnMut(usize, &TokenOutput, &str) -> bool,
) -> Result<Vec<Generated>> {
    let start = Instant::now();
    let mut live = Vec::with_capacity(requests.len());
    for request in requests {
        let (id, rx) = engine.add_request(request)?;
        live.push((id, rx));
    }
    let mut out: Vec<Option<Generated>> = vec![None; requests.len()];
    let mut partial: Vec<(String, Vec<TokenOutput>)> = vec![Default::default(); requests.len()];
    loop {
        for (i, (id, rx)) in live.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            for event in rx.try_iter() {
                match event {
                    StreamEvent::Token(token, text) => {
                        partial[i].0.push_str(&text);
                        let go_on = watch(i, &token, &text);
                        partial[i].1.push(token);
                        if !go_on {
                            engine.cancel(*id);
                        }
                    }
                    StreamEvent::Text(text) => partial[i].0.push_str(&text),
                    StreamEvent::Finished {
                        reason: FinishReason::Error(message),
                        ..
                    } => {
                        return Err(RouterError::Engine(
                            triage_engine::EngineError::RequestFailed(message),
                        ));
                    }
                    StreamEvent::Finished { reason, usage } => {
                        let (text, tokens) = std::mem::take(&mut partial[i]);
                        out[i] = Some(Generated {
                            text,
                            tokens,
                            finish_reason: reason,
                            usage,
                            elapsed: start.elapsed(),
                        });
                        break;
                    }
                }
            }
        }
        if out.iter().all(Option::is_some) {
            return Ok(out.into_iter().flatten().collect());
        }
        if !engine.has_unfinished() {
            return Err(RouterError::Invalid(
                "a request left the engine without finishing".into(),
            ));
        }
        engine.step()?;
    }
}

/// One engine plays every role (tests, `triage retrieve`).
impl Generator for LlmEngine {
    fn model(&self, _role: ModelRole) -> Result<Arc<Model>> {
        Ok(LlmEngine::model(self).clone())
    }

    fn generate(
        &mut self,
        _role: ModelRole,
        requests: &[GenerateRequest],
        watch: &mut dyn FnMut(usize, &TokenOutput, &str) -> bool,
    ) -> Result<Vec<Generated>> {
        run_on_engine(self, requests, watch)
    }

    fn pin_prefix(
        &mut self,
        _role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
    ) -> Result<PinnedPrefix> {
        pin_on_engine(self, tokens, dir).map(|(_, pinned)| pinned)
    }

    fn unpin_prefix(&mut self, _role: ModelRole, _tokens: &[u32]) -> Result<()> {
        Err(RouterError::Invalid(
            "a bare engine does not track its pins; use RoleEngines".into(),
        ))
    }
}

fn pin_on_engine(
    engine: &mut LlmEngine,
    tokens: &[u32],
    dir: Option<&Path>,
) -> Result<(PrefixHandle, PinnedPrefix)> {
    let (handle, source) = match dir {
        Some(dir) => engine.pin_persisted_prefix(tokens, dir)?,
        None => engine.pin_prefix(tokens)?,
    };
    let pinned = PinnedPrefix {
        num_tokens: handle.num_tokens,
        source,
    };
    Ok((handle, pinned))
}

/// Engines by name with the role each plays; several roles may share one engine.
#[derive(Debug, Default)]
pub struct RoleEngines {
    engines: EngineSet,
    roles: HashMap<ModelRole, String>,
    pins: Vec<(ModelRole, Vec<u32>, PrefixHandle)>,
}

impl RoleEngines {
    pub fn new(engines: EngineSet) -> Self {
        Self {
            engines,
            ..Self::default()
        }
    }

    /// Let the engine named `name` play `role`.
    pub fn assign(&mut self, role: ModelRole, name: &str) -> Result<()> {
        if self.engines.get(name).is_none() {
            return Err(RouterError::Invalid(format!(
                "no engine named {name:?} for the {} role",
                role.as_str()
            )));
        }
        self.roles.insert(role, name.to_string());
        Ok(())
    }

    /// The name of the engine playing `role`.
    pub fn engine_name(&self, role: ModelRole) -> Result<&str> {
        self.roles.get(&role).map(String::as_str).ok_or_else(|| {
            RouterError::Invalid(format!("no model plays the {} role", role.as_str()))
        })
    }

    pub fn engines(&self) -> &EngineSet {
        &self.engines
    }

    fn engine_mut(&mut self, role: ModelRole) -> Result<&mut LlmEngine> {
        let name = self.engine_name(role)?.to_string();
        Ok(self.engines.engine_mut(&name)?)
    }
}

impl Generator for RoleEngines {
    fn model(&self, role: ModelRole) -> Result<Arc<Model>> {
        let name = self.engine_name(role)?;
        self.engines
            .get(name)
            .map(|e| e.model().clone())
            .ok_or_else(|| RouterError::Invalid(format!("engine {name:?} is gone")))
    }

    fn generate(
        &mut self,
        role: ModelRole,
        requests: &[GenerateRequest],
        watch: &mut dyn FnMut(usize, &TokenOutput, &str) -> bool,
    ) -> Result<Vec<Generated>> {
        run_on_engine(self.engine_mut(role)?, requests, watch)
    }

    fn pin_prefix(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
    ) -> Result<PinnedPrefix> {
        let (handle, pinned) = pin_on_engine(self.engine_mut(role)?, tokens, dir)?;
        self.pins.push((role, tokens.to_vec(), handle));
        Ok(pinned)
    }

    fn unpin_prefix(&mut self, role: ModelRole, tokens: &[u32]) -> Result<()> {
        let Some(idx) = self
            .pins
            .iter()
            .position(|(r, t, _)| *r == role && t == tokens)
        else {
            return Ok(());
        };
        let (_, _, handle) = self.pins.remove(idx);
        self.engine_mut(role)?.unpin_prefix(&handle);
        Ok(())
    }
}
