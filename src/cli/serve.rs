//! `triage serve`: the config with the command line's overrides, the server's models and
//! pipeline started, then the OpenAI-compatible API until Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use triage::{DeviceSpec, ModelEntry, ModelRole, TriageConfig};
use triage_server::{routing_service, start_workers};
use triage_server::{AppState, EngineWorker};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML file: host, port, api_key, limits and the models with roles and KV budgets.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to bind (default 127.0.0.1: loopback only).
    #[arg(long)]
    pub host: Option<String>,
    #[arg(long)]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer KEY` on every /v1 request.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line) instead: a flag shows in `ps`.
    /// `TRIAGE_API_KEY` in the environment is read when neither is given.
    #[arg(long, conflicts_with = "api_key")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Serve this model (name or path) instead of the config's list; repeatable.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// Run every model on `cpu`, `cuda` or `cuda:N` instead of each entry's `device`.
    #[arg(long)]
    pub device: Option<DeviceSpec>,
    /// Decode eagerly, op by op, even where a model's entry sets `cuda_graphs = true` (as
    /// vLLM's `--enforce-eager`).
    #[arg(long)]
    pub no_cuda_graphs: bool,
}

/// The config file (or the defaults) with the command line's overrides applied.
fn server_config(o: ServeArgs) -> Result<TriageConfig> {
    let mut config = match &o.config {
        Some(path) => TriageConfig::from_file(path)?,
        None => TriageConfig::default(),
    };
    if let Some(host) = o.host {
        config.server.host = host;
    }
    if let Some(port) = o.port {
        config.server.port = port;
    }
    if let Some(path) = &o.api_key_file {
        config.server.api_key = Some(triage_host::read_api_key(path)?);
    }
    if o.api_key.is_some() {
        config.server.api_key = o.api_key;
    }
    if config.server.api_key.is_none() {
        config.server.api_key = std::env::var("TRIAGE_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
    }
    if !o.models.is_empty() {
        config.models = o
            .models
            .iter()
            .map(|m| ModelEntry {
                path: Some(m.clone()),
                ..ModelEntry::named(m, ModelRole::Base, "1GiB")
            })
            .collect();
    }
    if let Some(device) = o.device {
        config.set_device(device);
    }
    if o.no_cuda_graphs {
        config.disable_cuda_graphs();
    }
    config.validate()?;
    Ok(config)
}

/// Run the server until a shutdown signal.
pub fn run(args: ServeArgs) -> Result<()> {
    let config = server_config(args)?;
    if let Some(warning) = config.server.exposure_warning() {
        tracing::warn!("{warning}");
    }
    let workers: Vec<Arc<EngineWorker>> =
        start_workers(&config)?.into_iter().map(Arc::new).collect();
    let routing = routing_service(&config, &workers)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", config.server.host, config.server.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let bound = listener.local_addr().context("reading the bound address")?;
        tracing::info!(addr = %bound, auth = config.server.api_key.is_some(), "serving the OpenAI API");
        let state = AppState::with_routing(config, workers, routing);
        triage_server::serve(state, listener, triage_server::shutdown_signal()).await?;
        Ok(())
    })
}
