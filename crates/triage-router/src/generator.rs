//! `Generator`: how the routing stages reach the models. A stage hands a batch of requests to the
//! model that plays a role (router, base, long-context) and watches the tokens as they come; the
//! library drives `LlmEngine`s in this thread, the server its engine workers, tests a script.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use triage_engine::{EngineError, EngineSet, PinJob};
use triage_engine::{FinishReason, GenerateRequest, TokenOutput};
use triage_engine::{LlmEngine, StreamEvent, Usage};
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

pub use triage_engine::PinnedPrefix;

/// How long a blocking pin sleeps between looks at a job that another thread runs.
const PIN_POLL: Duration = Duration::from_millis(50);

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

    /// Start keeping `tokens` resident in `role`'s cache (persisted under `dir` when given)
    /// and return at once: `job` reports the prefill's progress and ends once the prefix is
    /// pinned, failed or cancelled. A pinned prefix stays until [`Generator::unpin_prefix`].
    fn start_pin(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
        job: Arc<PinJob>,
    ) -> Result<()>;

    /// Step, once, the engines running pins started here when nothing else steps them (models
    /// run in the caller's thread); whether it stepped. Engines on threads of their own step
    /// themselves: this returns `false`, and the caller waits on the job.
    fn drive_pins(&mut self) -> Result<bool>;

    /// Keep `tokens` resident in `role`'s cache (persisted under `dir` when given) until
    /// [`Generator::unpin_prefix`], returning once pinned.
    fn pin_prefix(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
    ) -> Result<PinnedPrefix> {
        let job = PinJob::new(tokens.len());
        self.start_pin(role, tokens, dir, job.clone())?;
        loop {
            if let Some(outcome) = job.outcome() {
                return outcome
                    .map_err(|e| RouterError::Engine(EngineError::Invalid(e.to_string())));
            }
            if !self.drive_pins()? {
                job.wait(PIN_POLL);
            }
        }
    }

    /// Release what [`Generator::start_pin`] pinned for `tokens`.
    fn unpin_prefix(&mut self, role: ModelRole, tokens: &[u32]) -> Result<()>;
}

/// Step `engine` once if it runs a pin; whether it did.
fn drive_engine_pins(engine: &mut LlmEngine) -> Result<bool> {
    if !engine.has_pending_pins() {
        return Ok(false);
    }
    engine.step()?;
    Ok(true)
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

    fn start_pin(
        &mut self,
        _role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
        job: Arc<PinJob>,
    ) -> Result<()> {
        self.begin_pin(tokens, dir, job);
        Ok(())
    }

    fn drive_pins(&mut self) -> Result<bool> {
        drive_engine_pins(self)
    }

    fn unpin_prefix(&mut self, _role: ModelRole, tokens: &[u32]) -> Result<()> {
        self.release_pin(tokens);
        Ok(())
    }
}

/// Engines by name with the role each plays; several roles may share one engine.
#[derive(Debug, Default)]
pub struct RoleEngines {
    engines: EngineSet,
    roles: HashMap<ModelRole, String>,
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

    fn start_pin(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
        job: Arc<PinJob>,
    ) -> Result<()> {
        self.engine_mut(role)?.begin_pin(tokens, dir, job);
        Ok(())
    }

    fn drive_pins(&mut self) -> Result<bool> {
        let names: Vec<String> = self.engines.names().map(str::to_string).collect();
        let mut stepped = false;
        for name in names {
            stepped |= drive_engine_pins(self.engines.engine_mut(&name)?)?;
        }
        Ok(stepped)
    }

    fn unpin_prefix(&mut self, role: ModelRole, tokens: &[u32]) -> Result<()> {
        self.engine_mut(role)?.release_pin(tokens);
        Ok(())
    }
}
