//! Turning a model name or path from the user into a file on disk.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::catalog::{self, Format};

/// The path of `name_or_path`: a default model's name (it must have been fetched), or a local
/// GGUF file or safetensors folder.
pub fn resolve_model(name_or_path: &str) -> Result<(String, PathBuf)> {
    if let Some(entry) = catalog::find(name_or_path) {
        let dir = triage_models::paths::model_dir(entry.name);
        let path = match entry.format {
            Format::Gguf => dir.join("model.gguf"),
            Format::SafetensorsDir => dir,
            Format::Json => bail!("{name_or_path:?} is a data set, not a model"),
        };
        if !path.exists() {
            bail!(
                "model {name_or_path:?} is not fetched yet (expected {}): run `triage models fetch`",
                path.display()
            );
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
    bail!(
        "no model {name_or_path:?}: not a file or folder, and not one of the default models ({})",
        catalog::names().join(", ")
    )
}
