//! Loading what a config names: a model (name or path → file → weights on its device) and the
//! sentence embedder. The one place a model name becomes a loaded `Model`.

use std::sync::Arc;

use candle_core::Device;
use triage_models::bert::SentenceEmbedder;
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;
use triage_models::DeviceSpec;
use triage_retrieval::BertEmbedder;

use crate::config::ModelEntry;
use crate::error::{HostError, Result};

/// Load `name_or_path` (a fetched default's name, a GGUF file, a safetensors folder, or a hub
/// id in the local cache) onto `device` with the device's load options.
pub fn load_model(name_or_path: &str, device: DeviceSpec) -> Result<Model> {
    load_named(None, name_or_path, device)
}

/// Load the model of a config entry. It goes by the entry's name when the entry gives a
/// `path` (clients select it by that name), else by the name the catalog or file gives it.
pub fn load_entry(entry: &ModelEntry) -> Result<Model> {
    match &entry.path {
        Some(path) => load_named(Some(&entry.name), path, entry.device),
        None => load_model(&entry.name, entry.device),
    }
}

/// Load `spec` under `name`, or under the name resolving it gives.
fn load_named(name: Option<&str>, spec: &str, device: DeviceSpec) -> Result<Model> {
    // The device first: a missing GPU (or a CPU-only build) is the error to report, not the file.
    let opts = LoadOptions::for_device(device)?;
    let (resolved, path) = triage_fetch::resolve_model(spec)?;
    let name = name.unwrap_or(&resolved);
    tracing::info!(model = %name, path = %path.display(), %device, "loading");
    Model::load(name, &path, &opts).map_err(|e| HostError::Load {
        what: path.display().to_string(),
        message: e.to_string(),
    })
}

/// [`load_model`] behind an `Arc`, as engines share it.
pub fn load_shared(entry: &ModelEntry) -> Result<Arc<Model>> {
    load_entry(entry).map(Arc::new)
}

/// The sentence embedder `name_or_path` (a fetched default's name or a folder), on the CPU.
pub fn load_embedder(name_or_path: &str) -> Result<BertEmbedder> {
    let (name, dir) = triage_fetch::resolve_embedder(name_or_path)?;
    let model = SentenceEmbedder::load(&dir, &Device::Cpu).map_err(|e| HostError::Load {
        what: format!("embedder {}", dir.display()),
        message: e.to_string(),
    })?;
    Ok(BertEmbedder { name, model })
}
