//! Where fetched models and data live on disk (`$TRIAGE_HOME`, default `~/.cache/triage`).

use std::path::PathBuf;

/// Root of triage's on-disk cache: `$TRIAGE_HOME`, else `$HOME/.cache/triage`.
pub fn triage_home() -> PathBuf {
    if let Some(home) = std::env::var_os("TRIAGE_HOME") {
        return PathBuf::from(home);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("triage")
}

/// Folder of one fetched model: `$TRIAGE_HOME/models/<name>`.
pub fn model_dir(name: &str) -> PathBuf {
    triage_home().join("models").join(name)
}

/// The GGUF file of a fetched GGUF model: `$TRIAGE_HOME/models/<name>/model.gguf`.
pub fn fetched_gguf(name: &str) -> PathBuf {
    model_dir(name).join("model.gguf")
}

/// Folder of fetched data sets: `$TRIAGE_HOME/data`.
pub fn data_dir() -> PathBuf {
    triage_home().join("data")
}
