//! Turning a model name, path or Hub id, or a data set's file name, from the user into a file on disk.

use std::path::{Path, PathBuf};

use crate::catalog::{self, Format};
use crate::error::{FetchError, Result};
use crate::hub::{resolve_hub, HubId, HubSettings};

/// Where `models fetch --data` puts the evaluation file `file`; an error naming the fetch
/// command when it is missing.
pub fn data_file(file: &str) -> Result<PathBuf> {
    let path = triage_models::paths::data_dir().join(file);
    if !path.exists() {
        return Err(FetchError::NotFound(format!(
            "{} is missing: run `triage models fetch --data`",
            path.display()
        )));
    }
    Ok(path)
}

/// The path of `name_or_path`: a default model's name (it must have been fetched), a local GGUF
/// file or safetensors folder, or a Hugging Face id (`org/repo`, `org/repo:QUANT`,
/// `org/repo/file`), taken from the hub cache or downloaded into it on first use, with the
/// `HF_*` settings of this process's environment.
pub fn resolve_model(name_or_path: &str) -> Result<(String, PathBuf)> {
    resolve_model_with(name_or_path, &HubSettings::from_env())
}

/// [`resolve_model`] with explicit Hub settings.
pub fn resolve_model_with(name_or_path: &str, hub: &HubSettings) -> Result<(String, PathBuf)> {
    if let Some(entry) = catalog::find(name_or_path) {
        let dir = triage_models::paths::model_dir(entry.name);
        let path = match entry.format {
            Format::Gguf => dir.join("model.gguf"),
            Format::SafetensorsDir => dir,
            Format::Json => {
                return Err(FetchError::Invalid(format!(
                    "{name_or_path:?} is a data set, not a model"
                )))
            }
        };
        if !path.exists() {
            return Err(FetchError::NotFound(format!(
                "model {name_or_path:?} is not fetched yet (expected {}): run `triage models fetch`",
                path.display()
            )));
        }
        return Ok((entry.name.to_string(), path));
    }
    let path = Path::new(name_or_path);
    if path.exists() {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| name_or_path.to_string());
        return Ok((name, path.to_path_buf()));
    }
    if let Some(id) = HubId::parse(name_or_path) {
        // Bars only where stderr is a terminal (the bar checks).
        let model = resolve_hub(&id, hub, true)?;
        return Ok((name_or_path.replace('/', "--"), model.path));
    }
    Err(FetchError::NotFound(format!(
        "no model {name_or_path:?}: not a file or folder, not one of the default models ({}), and \
         not a Hugging Face id (`org/repo`, `org/repo:QUANT`, `org/repo/file.gguf`)",
        catalog::names().join(", ")
    )))
}

/// The folder of the sentence embedder `name_or_path` (a fetched default's name or a folder) and
/// the name it goes by (the folder's name).
pub fn resolve_embedder(name_or_path: &str) -> Result<(String, PathBuf)> {
    let dir = if Path::new(name_or_path).is_dir() {
        PathBuf::from(name_or_path)
    } else {
        let dir = triage_models::paths::model_dir(name_or_path);
        if !dir.join("model.safetensors").exists() {
            return Err(FetchError::NotFound(format!(
                "embedder {name_or_path:?} is not fetched (expected {}): run `triage models fetch {name_or_path}`",
                dir.display()
            )));
        }
        dir
    };
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| name_or_path.to_string());
    Ok((name, dir))
}
