//! `Engine`: a host whose models run in the caller's thread (`triage::Engine`, the CLI's `ask`,
//! `eval` and `calibrate`). Roles naming the same model share one engine.
//!
//! ```no_run
//! use triage_host::{Engine, TriageConfig};
//! use triage_router::AskRequest;
//!
//! let engine = Engine::new(TriageConfig::default())?; // the default models, fetched
//! engine.load_corpus("docs")?; // made by `triage ingest --corpus docs FILES`
//! let answer = engine.ask(&AskRequest {
//!     corpus: "docs".into(),
//!     question: "When was the bridge opened?".into(),
//!     ..AskRequest::default()
//! })?;
//! println!("{} (path: {:?})", answer.text, answer.decision.path);
//! # Ok::<(), triage_host::HostError>(())
//! ```

use std::sync::Mutex;

use triage_engine::EngineSet;
use triage_router::{Generator, ModelRole, RoleEngines};

use crate::config::TriageConfig;
use crate::error::{HostError, Result};
use crate::host::{Host, ModelAccess};
use crate::loader::{load_embedder, load_shared};

/// The role models as engines in this process, stepped by the thread that asks.
pub struct InProcessModels {
    engines: Mutex<RoleEngines>,
}

impl ModelAccess for InProcessModels {
    fn with_generator<R>(&self, f: impl FnOnce(&mut dyn Generator) -> R) -> Result<R> {
        let mut engines = self
            .engines
            .lock()
            .map_err(|_| HostError::Internal("the engines were poisoned by a panic".into()))?;
        Ok(f(&mut *engines))
    }
}

impl InProcessModels {
    /// Load the model of every role the config's pipeline uses (the router only for a
    /// zero-shot classifier); roles naming one model share its engine.
    pub fn load(config: &TriageConfig) -> Result<Self> {
        let mut set = EngineSet::new();
        let mut assigned = Vec::new();
        let prefix_remote = config.pipeline.prefix_remote()?;
        for role in [ModelRole::Base, ModelRole::LongContext, ModelRole::Router] {
            if role == ModelRole::Router && !config.needs_router() {
                continue;
            }
            let entry = config.model(role).ok_or_else(|| {
                HostError::Config("no model plays the base role: add a [[models]] entry".into())
            })?;
            if set.get(&entry.name).is_none() {
                set.add(&entry.name, load_shared(entry)?, entry.engine_config()?)?;
                set.engine_mut(&entry.name)?
                    .set_prefix_remote(prefix_remote.clone());
            }
            assigned.push((role, entry.name.clone()));
        }
        let mut roles = RoleEngines::new(set);
        for (role, name) in assigned {
            roles.assign(role, &name)?;
        }
        Ok(Self {
            engines: Mutex::new(roles),
        })
    }
}

/// A host whose models run in the caller's thread.
pub type Engine = Host<InProcessModels>;

impl Host<InProcessModels> {
    /// Load the models and the corpora the config names.
    pub fn new(config: TriageConfig) -> Result<Self> {
        let models = InProcessModels::load(&config)?;
        let embedder = load_embedder(&config.pipeline.embedder)?;
        let data_dir = config.pipeline.data_dir();
        let prefix_dir = config.pipeline.prefix_dir();
        let engine = Self::with_models(models, config.routing, embedder, &data_dir, prefix_dir)?
            .with_corpus_limits(config.pipeline.limits)
            .with_pin_wait(config.pipeline.pin_wait());
        engine.load_corpora(&config.pipeline.corpora)?;
        Ok(engine)
    }
}

/// Only a CPU build can show refusing a GPU.
#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;
    use triage_models::DeviceSpec;

    /// A CPU build refuses a GPU when the engine starts, before it loads anything.
    #[test]
    fn a_cpu_build_refuses_a_gpu_before_loading() {
        let mut config = TriageConfig::default();
        config.set_device(DeviceSpec::Cuda(0));
        config
            .set_model(ModelRole::Base, "/nonexistent/base.gguf")
            .unwrap();
        let err = Engine::new(config).unwrap_err().to_string();
        assert!(err.contains("without the `cuda` feature"), "{err}");
    }
}
