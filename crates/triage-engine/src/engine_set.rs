//! `EngineSet`: several models in one process, each with its own `LlmEngine` (block pool, KV
//! budget, scheduler), addressed by name. The routing pipeline keeps its base and long-context
//! models here; a step advances every engine that has work.

use std::sync::Arc;

use triage_models::model::Model;

use crate::llm_engine::{EngineConfig, LlmEngine};
use crate::{EngineError, Result};

/// Named engines, in the order they were added.
#[derive(Debug, Default)]
pub struct EngineSet {
    engines: Vec<(String, LlmEngine)>,
}

impl EngineSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `model` under `name` with its own cache sized by `config.kv_budget`.
    pub fn add(&mut self, name: &str, model: Arc<Model>, config: EngineConfig) -> Result<()> {
        if self.get(name).is_some() {
            return Err(EngineError::Invalid(format!(
                "model {name:?} is already loaded"
            )));
        }
        let engine = LlmEngine::new(model, config)?;
        self.engines.push((name.to_string(), engine));
        Ok(())
    }

    /// Names of the loaded models.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.engines.iter().map(|(n, _)| n.as_str())
    }

    pub fn get(&self, name: &str) -> Option<&LlmEngine> {
        self.engines.iter().find(|(n, _)| n == name).map(|(_, e)| e)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut LlmEngine> {
        self.engines
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, e)| e)
    }

    /// The engine of `name`, or an error naming the models that are loaded.
    pub fn engine_mut(&mut self, name: &str) -> Result<&mut LlmEngine> {
        let known: Vec<String> = self.names().map(str::to_string).collect();
        self.get_mut(name).ok_or_else(|| {
            EngineError::Invalid(format!("model {name:?} is not loaded (loaded: {known:?})"))
        })
    }

    /// Whether any engine has a waiting or running request.
    pub fn has_unfinished(&self) -> bool {
        self.engines.iter().any(|(_, e)| e.has_unfinished())
    }

    /// One step of every engine with work; returns the tokens run in all of them.
    pub fn step(&mut self) -> Result<usize> {
        let mut total = 0;
        for (_, engine) in &mut self.engines {
            if engine.has_unfinished() {
                total += engine.step()?;
            }
        }
        Ok(total)
    }
}
