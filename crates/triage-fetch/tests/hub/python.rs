//! The hub cache shared with Python's `huggingface_hub` both ways: what Python downloads, triage
//! resolves offline; what triage fetches, Python finds offline. The python is
//! `$TRIAGE_TEST_PYTHON`, else the venv `scripts/test` makes (`target/pyenv`).

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use triage_fetch::hub::testing::LocalHub;
use triage_fetch::hub::{fetch_hub, resolve_hub, HubSettings};

use super::{bytes, gguf_repo, id, names, safetensors_repo, settings};

fn python() -> String {
    std::env::var("TRIAGE_TEST_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/pyenv/bin/python").to_string()
    })
}

/// Runs `interop.py MODE CACHE REPO FILES...` against `hub` (offline for `cached`) and returns
/// the path Python gives each file.
fn interop(
    mode: &str,
    hub: &LocalHub,
    cache: &Path,
    repo: &str,
    files: &[&str],
) -> HashMap<String, String> {
    let python = python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hub/interop.py");
    let mut cmd = Command::new(&python);
    cmd.arg(script)
        .arg(mode)
        .arg(cache)
        .arg(repo)
        .args(files)
        .env("HF_ENDPOINT", hub.url())
        .env("HF_HOME", cache.with_extension("py-home"))
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("NO_PROXY", "127.0.0.1");
    for var in [
        "HF_TOKEN",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ] {
        cmd.env_remove(var).env_remove(var.to_ascii_lowercase());
    }
    if mode == "cached" {
        cmd.env("HF_HUB_OFFLINE", "1");
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {python}: {e}; set TRIAGE_TEST_PYTHON to a python with huggingface_hub (scripts/test makes target/pyenv)")
    });
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{python} interop.py {mode} failed (is huggingface_hub installed there? scripts/test installs it):\n{stdout}\n{stderr}"
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("interop.py printed {stdout:?}: {e}"))
}

#[test]
fn python_and_triage_share_the_hub_cache_both_ways() {
    let hub = LocalHub::start();
    hub.add(safetensors_repo("org/py-st"));
    hub.add(gguf_repo("org/py-GGUF"));
    hub.add(safetensors_repo("org/rs-st"));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");

    // Python downloads; triage resolves from the cache, offline.
    let st_files = [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ];
    let py = interop("download", &hub, &cache, "org/py-st", &st_files);
    interop(
        "download",
        &hub,
        &cache,
        "org/py-GGUF",
        &["Model-Q8_0.gguf"],
    );
    let requests = hub.seen().len();
    let offline = HubSettings {
        offline: true,
        ..HubSettings::new(hub.url(), &cache)
    };
    let st = resolve_hub(&id("org/py-st"), &offline, false).unwrap();
    assert_eq!(names(&st), st_files);
    for file in &st.files {
        assert_eq!(file.path, Path::new(&py[&file.name]), "{}", file.name);
    }
    let gguf = resolve_hub(&id("org/py-GGUF:Q8_0"), &offline, false).unwrap();
    assert_eq!(fs::read(&gguf.path).unwrap(), bytes(7000, 5));
    assert_eq!(hub.seen().len(), requests, "triage made no request");

    // triage fetches; Python finds the files in the cache, offline.
    let rs = fetch_hub(&id("org/rs-st"), &settings(&hub, &cache), false).unwrap();
    let found = interop("cached", &hub, &cache, "org/rs-st", &names(&rs));
    for file in &rs.files {
        assert_eq!(Path::new(&found[&file.name]), file.path, "{}", file.name);
    }
}
