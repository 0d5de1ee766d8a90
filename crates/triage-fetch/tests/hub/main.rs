//! Fetching from the Hugging Face Hub end to end against a local Hub (`hub::testing`) on
//! loopback: the cache layout, quant picks, resume after a cut connection, hash checks, gated
//! repos, offline mode, the `HF_*` settings, and the cache shared with Python. No network.

mod python;

use std::fs;
use std::path::{Path, PathBuf};

use triage_fetch::hub::testing::{sha256_hex, FakeRepo, LocalHub};
use triage_fetch::hub::{fetch_hub, resolve_hub, HubId, HubModel, HubSettings};
use triage_fetch::{resolve_model_with, FetchError, FetchStatus};

/// Deterministic filler bytes.
fn bytes(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

const WEIGHTS_LEN: usize = 300_000;

/// A transformers-style repo: what triage needs, and files it must leave alone.
fn safetensors_repo(id: &str) -> FakeRepo {
    FakeRepo::new(
        id,
        &[
            ("config.json", br#"{"model_type": "qwen2"}"#),
            ("tokenizer.json", br#"{"version": "1.0"}"#),
            ("tokenizer_config.json", br#"{"eos_token": "<|im_end|>"}"#),
            ("README.md", b"# a model"),
            ("model.safetensors", &bytes(WEIGHTS_LEN, 1)),
            ("consolidated.safetensors", &bytes(1000, 2)),
            ("pytorch_model.bin", &bytes(1000, 3)),
            ("original/params.json", b"{}"),
        ],
    )
}

fn gguf_repo(id: &str) -> FakeRepo {
    FakeRepo::new(
        id,
        &[
            ("README.md", b"# GGUF"),
            ("Model-Q4_K_M.gguf", &bytes(5000, 4)),
            ("Model-Q8_0.gguf", &bytes(7000, 5)),
            ("mmproj-Model-F16.gguf", &bytes(100, 6)),
        ],
    )
}

fn settings(hub: &LocalHub, cache: &Path) -> HubSettings {
    HubSettings {
        max_retries: 0,
        ..HubSettings::new(hub.url(), cache)
    }
}

fn id(spec: &str) -> HubId {
    HubId::parse(spec).unwrap_or_else(|| panic!("{spec} is an id"))
}

fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

fn names(model: &HubModel) -> Vec<&str> {
    model.files.iter().map(|f| f.name.as_str()).collect()
}

/// Requests to `resolve` or the CDN: file transfers and probes, not listings.
fn transfers(hub: &LocalHub) -> usize {
    hub.seen()
        .iter()
        .filter(|s| !s.target.starts_with("/api/"))
        .count()
}

#[test]
fn a_safetensors_repo_lands_in_the_hub_cache_layout() {
    let hub = LocalHub::start();
    let repo = safetensors_repo("org/tiny");
    hub.add(repo.clone());
    let cache = tempfile::tempdir().unwrap();
    let model = fetch_hub(&id("org/tiny"), &settings(&hub, cache.path()), false).unwrap();

    let dir = repo_dir(cache.path(), "org/tiny");
    assert_eq!(model.commit, repo.commit);
    assert_eq!(model.path, dir.join("snapshots").join(&repo.commit));
    assert_eq!(
        names(&model),
        [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model.safetensors"
        ]
    );
    assert_eq!(
        fs::read_to_string(dir.join("refs/main")).unwrap(),
        repo.commit
    );
    assert!(
        !dir.join("refs").join(&repo.commit).exists(),
        "no ref named by the commit"
    );
    for file in &repo.files {
        let pointer = model.path.join(&file.name);
        if !names(&model).contains(&file.name.as_str()) {
            assert!(!pointer.exists(), "{} must not be fetched", file.name);
            continue;
        }
        let link = fs::read_link(&pointer).unwrap();
        assert_eq!(
            link,
            Path::new("../../blobs").join(file.etag()),
            "{}",
            file.name
        );
        assert_eq!(
            fs::read(dir.join("blobs").join(file.etag())).unwrap(),
            file.bytes
        );
    }
    let weights = &model.files[3];
    assert_eq!(weights.status, FetchStatus::Fetched);
    assert_eq!(
        weights.sha256.as_deref(),
        Some(sha256_hex(&bytes(WEIGHTS_LEN, 1)).as_str())
    );

    let before = transfers(&hub);
    let again = fetch_hub(&id("org/tiny"), &settings(&hub, cache.path()), false).unwrap();
    assert!(again
        .files
        .iter()
        .all(|f| f.status == FetchStatus::AlreadyPresent));
    assert_eq!(transfers(&hub), before, "a second fetch only lists");
}

#[test]
fn a_sharded_repo_fetches_its_index_and_exactly_the_shards_it_names() {
    let hub = LocalHub::start();
    let index = br#"{"metadata": {"total_size": 3000}, "weight_map": {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors",
        "c.weight": "model-00001-of-00002.safetensors"}}"#;
    hub.add(FakeRepo::new(
        "org/sharded",
        &[
            ("config.json", b"{}"),
            ("tokenizer.json", b"{}"),
            ("generation_config.json", b"{}"),
            ("model.safetensors.index.json", index),
            ("model-00001-of-00002.safetensors", &bytes(2000, 7)),
            ("model-00002-of-00002.safetensors", &bytes(1000, 8)),
            ("old-model-00001-of-00001.safetensors", &bytes(1000, 9)),
        ],
    ));
    let cache = tempfile::tempdir().unwrap();
    let model = fetch_hub(&id("org/sharded"), &settings(&hub, cache.path()), false).unwrap();
    assert_eq!(
        names(&model),
        [
            "config.json",
            "tokenizer.json",
            "generation_config.json",
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ]
    );
    assert!(model.path.is_dir());
    assert!(!model
        .path
        .join("old-model-00001-of-00001.safetensors")
        .exists());
}

#[test]
fn a_quant_tag_picks_one_gguf_and_fetches_only_it() {
    let hub = LocalHub::start();
    hub.add(gguf_repo("org/m-GGUF"));
    let cache = tempfile::tempdir().unwrap();
    let s = settings(&hub, cache.path());
    let q8 = fetch_hub(&id("org/m-GGUF:q8_0"), &s, false).unwrap();
    assert_eq!(names(&q8), ["Model-Q8_0.gguf"]);
    assert_eq!(q8.path, q8.files[0].path);
    assert_eq!(fs::read(&q8.path).unwrap(), bytes(7000, 5));
    let q8_sha = sha256_hex(&bytes(7000, 5));
    for seen in hub.seen().iter().filter(|s| !s.target.starts_with("/api/")) {
        let t = &seen.target;
        assert!(
            t.ends_with("/Model-Q8_0.gguf") || t.ends_with(&q8_sha),
            "{t}"
        );
    }

    let default = fetch_hub(&id("org/m-GGUF"), &s, false).unwrap();
    assert_eq!(
        names(&default),
        ["Model-Q4_K_M.gguf"],
        "llama.cpp's default tag"
    );

    let err = fetch_hub(&id("org/m-GGUF:Q2_K"), &s, false).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, FetchError::NotFound(_)), "{err:?}");
    assert!(
        text.contains("Q2_K") && text.contains("Model-Q8_0.gguf"),
        "{text}"
    );
}

#[test]
fn a_cut_connection_resumes_on_the_next_fetch() {
    let hub = LocalHub::start();
    let repo = safetensors_repo("org/cut");
    hub.add(repo.clone());
    hub.cut_after("model.safetensors", 100_000);
    let cache = tempfile::tempdir().unwrap();
    let s = settings(&hub, cache.path());

    let err = fetch_hub(&id("org/cut"), &s, false).unwrap_err();
    assert!(err.to_string().contains("resume"), "{err}");
    let sha = sha256_hex(&bytes(WEIGHTS_LEN, 1));
    let part = repo_dir(cache.path(), "org/cut")
        .join("blobs")
        .join(format!("{sha}.part"));
    assert_eq!(
        fs::metadata(&part).unwrap().len(),
        100_000,
        "what arrived is kept"
    );

    let model = fetch_hub(&id("org/cut"), &s, false).unwrap();
    let ranges: Vec<String> = hub
        .seen()
        .iter()
        .filter(|r| r.target == format!("/cdn/{sha}"))
        .filter_map(|r| r.range.clone())
        .collect();
    assert!(ranges.contains(&"bytes=100000-".to_string()), "{ranges:?}");
    let weights = model.path.join("model.safetensors");
    assert_eq!(sha256_hex(&fs::read(weights).unwrap()), sha);
    assert!(!part.exists());
}

#[test]
fn a_cut_connection_is_retried_within_one_fetch() {
    let hub = LocalHub::start();
    hub.add(gguf_repo("org/retry-GGUF"));
    hub.cut_after("Model-Q8_0.gguf", 3000);
    let cache = tempfile::tempdir().unwrap();
    let s = HubSettings {
        max_retries: 2,
        ..settings(&hub, cache.path())
    };
    let model = fetch_hub(&id("org/retry-GGUF:Q8_0"), &s, false).unwrap();
    assert_eq!(fs::read(&model.path).unwrap(), bytes(7000, 5));
    let resumed = hub
        .seen()
        .iter()
        .any(|r| r.range.as_deref() == Some("bytes=3000-"));
    assert!(resumed, "{:?}", hub.seen());
}

#[test]
fn a_wrong_hash_is_an_error_and_leaves_no_cache_entry() {
    let hub = LocalHub::start();
    hub.add(safetensors_repo("org/bad"));
    hub.corrupt("model.safetensors");
    let cache = tempfile::tempdir().unwrap();
    let s = settings(&hub, cache.path());
    let err = fetch_hub(&id("org/bad"), &s, false).unwrap_err();
    let sha = sha256_hex(&bytes(WEIGHTS_LEN, 1));
    let mut served = bytes(WEIGHTS_LEN, 1);
    served[0] ^= 0xff;
    let text = err.to_string();
    assert!(matches!(err, FetchError::Integrity(_)), "{err:?}");
    for needle in ["model.safetensors", sha.as_str(), &sha256_hex(&served)] {
        assert!(text.contains(needle), "{needle} not in {text}");
    }
    let dir = repo_dir(cache.path(), "org/bad");
    assert!(
        !dir.join("blobs").join(&sha).exists(),
        "the bad blob is gone"
    );
    let commit = &safetensors_repo("org/bad").commit;
    let pointer = dir.join("snapshots").join(commit).join("model.safetensors");
    assert!(fs::symlink_metadata(pointer).is_err(), "so is its link");
    assert!(
        !dir.join("refs/main").exists(),
        "main never pointed at a broken snapshot"
    );
    let offline = HubSettings { offline: true, ..s };
    assert!(resolve_hub(&id("org/bad"), &offline, false).is_err());
}

#[test]
fn a_gated_repo_needs_hf_token_and_sends_it_as_bearer() {
    let hub = LocalHub::start();
    hub.add(gguf_repo("org/gated-GGUF").gated("hf_good_token"));
    let cache = tempfile::tempdir().unwrap();
    let s = settings(&hub, cache.path());

    let err = fetch_hub(&id("org/gated-GGUF:Q8_0"), &s, false).unwrap_err();
    assert!(matches!(err, FetchError::NotFound(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("401") && text.contains("HF_TOKEN"), "{text}");

    let wrong = HubSettings {
        token: Some("hf_wrong_secret".into()),
        ..s.clone()
    };
    let text = fetch_hub(&id("org/gated-GGUF:Q8_0"), &wrong, false)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("no access") && !text.contains("hf_wrong_secret"),
        "{text}"
    );

    let good = HubSettings {
        token: Some("hf_good_token".into()),
        ..s
    };
    let model = fetch_hub(&id("org/gated-GGUF:Q8_0"), &good, false).unwrap();
    assert_eq!(fs::read(&model.path).unwrap(), bytes(7000, 5));
    let bearer = hub.seen().into_iter().any(|s| {
        s.target.contains("/resolve/") && s.authorization.as_deref() == Some("Bearer hf_good_token")
    });
    assert!(bearer, "{:?}", hub.seen());

    let unknown = fetch_hub(&id("org/nope"), &good, false).unwrap_err();
    assert!(unknown.to_string().contains("does not exist"), "{unknown}");
}

#[test]
fn cached_models_resolve_with_the_hub_down_and_offline() {
    let cache = tempfile::tempdir().unwrap();
    let (s, gguf_path, st_path) = {
        let hub = LocalHub::start();
        hub.add(safetensors_repo("org/st"));
        hub.add(gguf_repo("org/g-GGUF"));
        let s = settings(&hub, cache.path());
        let gguf = fetch_hub(&id("org/g-GGUF:Q8_0"), &s, false).unwrap();
        let st = fetch_hub(&id("org/st"), &s, false).unwrap();
        (s, gguf.path, st.path)
    };
    // The Hub is gone: cached ids resolve online (no request needed) and offline.
    for offline in [false, true] {
        let s = HubSettings {
            offline,
            ..s.clone()
        };
        assert_eq!(
            resolve_hub(&id("org/g-GGUF:Q8_0"), &s, false).unwrap().path,
            gguf_path
        );
        assert_eq!(resolve_hub(&id("org/st"), &s, false).unwrap().path, st_path);
        let (name, path) = resolve_model_with("org/g-GGUF:Q8_0", &s).unwrap();
        assert_eq!(
            (name.as_str(), path),
            ("org--g-GGUF:Q8_0", gguf_path.clone())
        );
    }
    let offline = HubSettings { offline: true, ..s };
    let model = fetch_hub(&id("org/st"), &offline, false).unwrap();
    assert_eq!(model.path, st_path, "fetch offline is the cache");
}

#[test]
fn offline_without_the_model_is_a_clear_error_and_no_request() {
    let hub = LocalHub::start();
    hub.add(gguf_repo("org/g-GGUF"));
    let cache = tempfile::tempdir().unwrap();
    let s = HubSettings {
        offline: true,
        ..settings(&hub, cache.path())
    };
    for result in [
        resolve_hub(&id("org/g-GGUF:Q8_0"), &s, false),
        fetch_hub(&id("org/g-GGUF:Q8_0"), &s, false),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, FetchError::NotFound(_)), "{err:?}");
        let text = err.to_string();
        let cache_dir = cache.path().display().to_string();
        assert!(
            text.contains("HF_HUB_OFFLINE") && text.contains(&cache_dir),
            "{text}"
        );
    }
    let err = resolve_model_with("org/g-GGUF:Q8_0", &s).unwrap_err();
    assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");
    assert_eq!(hub.seen(), [], "offline makes no request");
}

#[test]
fn hf_hub_cache_and_hf_home_choose_the_cache() {
    let hub = LocalHub::start();
    hub.add(gguf_repo("org/g-GGUF"));
    let dir = tempfile::tempdir().unwrap();
    let (home, hub_cache) = (dir.path().join("hf-home"), dir.path().join("hub-cache"));
    let vars = |with_cache: bool| {
        let (url, home, hub_cache) = (hub.url().to_string(), home.clone(), hub_cache.clone());
        HubSettings::from_vars(move |name| match name {
            "HF_ENDPOINT" => Some(url.clone()),
            "HF_HOME" => Some(home.display().to_string()),
            "HF_HUB_CACHE" if with_cache => Some(hub_cache.display().to_string()),
            _ => None,
        })
    };
    let in_home = fetch_hub(&id("org/g-GGUF:Q8_0"), &vars(false), false).unwrap();
    assert!(
        in_home
            .path
            .starts_with(home.join("hub/models--org--g-GGUF")),
        "{:?}",
        in_home.path
    );
    let in_cache = fetch_hub(&id("org/g-GGUF:Q8_0"), &vars(true), false).unwrap();
    assert!(in_cache
        .path
        .starts_with(hub_cache.join("models--org--g-GGUF")));
}

#[test]
fn a_new_commit_downloads_only_what_changed() {
    let hub = LocalHub::start();
    let mut repo = safetensors_repo("org/moving");
    hub.add(repo.clone());
    let cache = tempfile::tempdir().unwrap();
    let s = settings(&hub, cache.path());
    let first = fetch_hub(&id("org/moving"), &s, false).unwrap();

    repo.commit = "c".repeat(40);
    repo.files[0].bytes = br#"{"model_type": "qwen2", "new": true}"#.to_vec();
    hub.add(repo.clone());
    let before = hub.seen().len();
    let second = fetch_hub(&id("org/moving"), &s, false).unwrap();
    let fetched: Vec<&str> = second
        .files
        .iter()
        .filter(|f| f.status == FetchStatus::Fetched)
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        fetched,
        ["config.json"],
        "the weights' blob is linked, not downloaded"
    );
    let targets: Vec<String> = hub.seen()[before..]
        .iter()
        .map(|r| r.target.clone())
        .collect();
    assert!(
        targets.iter().all(|t| !t.contains("model.safetensors")),
        "{targets:?}"
    );
    let refs = repo_dir(cache.path(), "org/moving").join("refs/main");
    assert_eq!(fs::read_to_string(refs).unwrap(), repo.commit);
    assert!(
        first.path.join("model.safetensors").exists(),
        "the old snapshot stays"
    );
}

#[test]
fn a_part_file_as_long_as_the_blob_starts_over() {
    let hub = LocalHub::start();
    hub.add(gguf_repo("org/p-GGUF"));
    let cache = tempfile::tempdir().unwrap();
    let sha = sha256_hex(&bytes(7000, 5));
    let blobs = repo_dir(cache.path(), "org/p-GGUF").join("blobs");
    fs::create_dir_all(&blobs).unwrap();
    fs::write(blobs.join(format!("{sha}.part")), vec![0u8; 7000]).unwrap();
    let model = fetch_hub(&id("org/p-GGUF:Q8_0"), &settings(&hub, cache.path()), false).unwrap();
    assert_eq!(sha256_hex(&fs::read(&model.path).unwrap()), sha);
}
