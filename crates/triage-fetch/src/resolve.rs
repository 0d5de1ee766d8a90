//! Turning a model name or path, or a data set's file name, from the user into a file on disk.

use std::path::{Path, PathBuf};

use crate::catalog::{self, Format};
use crate::error::{FetchError, Result};

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

/// The path of `name_or_path`: a default model's name (it must have been fetched), or a local
/// GGUF file or safetensors folder.
pub fn resolve_model(name_or_path: &str) -> Result<(String, PathBuf)> {
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
    if let Some(path) = hf_cached(name_or_path)? {
        let name = name_or_path.replace('/', "--");
        return Ok((name, path));
    }
    Err(FetchError::NotFound(format!(
        "no model {name_or_path:?}: not a file or folder, not one of the default models ({}), and \
         not a Hugging Face `org/repo[/file]` in the local hub cache",
        catalog::names().join(", ")
    )))
}

/// The hub cache folder: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
fn hf_hub_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return PathBuf::from(home).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}

/// `org/repo` (a safetensors snapshot folder) or `org/repo/path/in/repo` (one file) from the
/// Hugging Face hub cache, at the revision `refs/main` names. Downloading is not done here: this
/// machine class reaches no hub, so a repo must already be in the cache (`huggingface-cli download`).
fn hf_cached(spec: &str) -> Result<Option<PathBuf>> {
    let mut parts = spec.splitn(3, '/');
    let (Some(org), Some(repo)) = (parts.next(), parts.next()) else {
        return Ok(None);
    };
    if org.is_empty() || repo.is_empty() || org.starts_with('.') {
        return Ok(None);
    }
    let repo_dir = hf_hub_cache().join(format!("models--{org}--{repo}"));
    let Ok(revision) = std::fs::read_to_string(repo_dir.join("refs").join("main")) else {
        return Ok(None);
    };
    let snapshot = repo_dir.join("snapshots").join(revision.trim());
    let path = match parts.next() {
        Some(file) => snapshot.join(file),
        None => snapshot,
    };
    if !path.exists() {
        return Err(FetchError::NotFound(format!(
            "{spec:?} is not in the Hugging Face cache (looked for {})",
            path.display()
        )));
    }
    Ok(Some(path))
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
