//! `triage serve`: load the configured models, start one engine thread each, set up the routing
//! pipeline over them, and serve the OpenAI-compatible API until Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use triage_models::device::DeviceSpec;
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;
use triage_server::routing::RoutingService;
use triage_server::{AppState, EngineWorker, ModelEntry, ServerConfig};

use crate::resolve;

/// Command-line overrides of the config file.
#[derive(Debug, Default)]
pub struct ServeOverrides {
    pub config: Option<PathBuf>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub api_key: Option<String>,
    /// Serve these models (names or paths) instead of the config's list.
    pub models: Vec<String>,
    /// Run every model on this device instead of each entry's `device`.
    pub device: Option<DeviceSpec>,
}

/// The config file (or the defaults) with the command line's overrides applied.
pub fn server_config(o: ServeOverrides) -> Result<ServerConfig> {
    let mut config = match &o.config {
        Some(path) => ServerConfig::from_file(path)?,
        None => ServerConfig::default(),
    };
    if let Some(host) = o.host {
        config.host = host;
    }
    if let Some(port) = o.port {
        config.port = port;
    }
    if o.api_key.is_some() {
        config.api_key = o.api_key;
    }
    if !o.models.is_empty() {
        config.models = o
            .models
            .iter()
            .map(|m| ModelEntry {
                path: Some(m.clone()),
                ..ModelEntry::named(m, "base", "1GiB")
            })
            .collect();
    }
    if let Some(device) = o.device {
        config.models.iter_mut().for_each(|m| m.device = device);
    }
    config.validate()?;
    Ok(config)
}

/// Load every model and start its engine thread.
pub fn start_workers(config: &ServerConfig) -> Result<Vec<EngineWorker>> {
    let mut workers = Vec::with_capacity(config.models.len());
    for entry in &config.models {
        let opts = LoadOptions::for_device(entry.device)?;
        let spec = entry.path.as_deref().unwrap_or(&entry.name);
        let (_, path) = resolve::resolve_model(spec)?;
        tracing::info!(model = %entry.name, path = %path.display(), role = %entry.role, device = %entry.device, "loading");
        let model = Model::load(&entry.name, &path, &opts)
            .with_context(|| format!("loading model {}", path.display()))?;
        let worker = EngineWorker::spawn(
            &entry.name,
            &entry.role,
            Arc::new(model),
            entry.engine_config()?,
        )?;
        workers.push(worker);
    }
    Ok(workers)
}

/// The routing pipeline over `workers`, when enabled and a model plays the base role; its
/// start-up corpora are loaded (prefixes pinned) before the server binds.
pub fn routing_service(
    config: &ServerConfig,
    workers: &[Arc<EngineWorker>],
) -> Result<Option<Arc<RoutingService>>> {
    let section = &config.pipeline;
    if !section.enabled || !workers.iter().any(|w| w.role == "base") {
        return Ok(None);
    }
    let embedder = match crate::retrieve::load_embedder(&section.embedder) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "routing pipeline off: no embedder");
            return Ok(None);
        }
    };
    let home = triage_models::paths::triage_home();
    let prefix_dir = section
        .prefix_dir
        .clone()
        .unwrap_or_else(|| home.join("prefixes"));
    let service = RoutingService::new(
        &section.alias,
        config.routing.clone(),
        workers,
        embedder,
        &home,
        prefix_dir,
    )?;
    for name in &section.corpora {
        let summary = service
            .load_corpus(name)
            .with_context(|| format!("loading corpus {name:?}"))?;
        tracing::info!(corpus = %name, prefix_tokens = ?summary.prefix_tokens, pinned = ?summary.pinned_from, "corpus ready");
    }
    tracing::info!(alias = %section.alias, "routing pipeline ready");
    Ok(Some(Arc::new(service)))
}

/// Run the server until a shutdown signal.
pub fn serve(overrides: ServeOverrides) -> Result<()> {
    let config = server_config(overrides)?;
    let workers: Vec<Arc<EngineWorker>> =
        start_workers(&config)?.into_iter().map(Arc::new).collect();
    let routing = routing_service(&config, &workers)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", config.host, config.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let bound = listener.local_addr().context("reading the bound address")?;
        tracing::info!(addr = %bound, auth = config.api_key.is_some(), "serving the OpenAI API");
        let state = AppState::with_routing(config, workers, routing);
        triage_server::serve(state, listener, triage_server::shutdown_signal()).await?;
        Ok(())
    })
}
