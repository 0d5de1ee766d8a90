//! Starting the server's models: one engine thread per configured model, and the routing
//! pipeline over them (its start-up corpora loaded, prefixes pinned) before the server binds.

use std::sync::Arc;

use triage_engine::LlmEngine;
use triage_host::TriageConfig;
use triage_host::{load_embedder, load_shared};
use triage_router::ModelRole;

use crate::error::Result;
use crate::routing::RoutingService;
use crate::worker::EngineWorker;

/// Load every model the config lists (a router only when a zero-shot classifier needs it) and
/// start its engine thread.
pub fn start_workers(config: &TriageConfig) -> Result<Vec<EngineWorker>> {
    let mut workers = Vec::with_capacity(config.models.len());
    let prefix_remote = config.pipeline.prefix_remote()?;
    for entry in config.models_to_load() {
        let model = load_shared(entry)?;
        let mut engine = LlmEngine::new(model.clone(), entry.engine_config()?)?;
        engine.set_prefix_remote(prefix_remote.clone());
        let worker = EngineWorker::spawn(&entry.name, entry.role, model, engine)?;
        workers.push(worker);
    }
    Ok(workers)
}

/// The routing pipeline over `workers`, when enabled and a model plays the base role.
pub fn routing_service(
    config: &TriageConfig,
    workers: &[Arc<EngineWorker>],
) -> Result<Option<Arc<RoutingService>>> {
    let section = &config.pipeline;
    if !section.enabled || !workers.iter().any(|w| w.role == ModelRole::Base) {
        return Ok(None);
    }
    let embedder = match load_embedder(&section.embedder) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %e, "routing pipeline off: no embedder");
            return Ok(None);
        }
    };
    let service = RoutingService::new(
        &section.alias,
        config.routing.clone(),
        workers,
        embedder,
        &section.data_dir(),
        section.prefix_dir(),
    )?
    .with_corpus_limits(section.limits)
    .with_pin_wait(section.pin_wait());
    service.host.load_corpora(&section.corpora)?;
    tracing::info!(alias = %section.alias, "routing pipeline ready");
    Ok(Some(Arc::new(service)))
}
