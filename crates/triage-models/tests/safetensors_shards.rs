//! Sharded safetensors folders through the real loader: the shards the index names give the
//! single file's logits exactly, stray files are not read, and every inconsistency between the
//! index, the shards and the config is an error that names the shard or tensor.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_sharded_safetensors, write_tiny_safetensors, TinySpec};
use triage_models::model::load_weights;
use triage_models::paged_kv_cache::PagedSequence;
use triage_models::transformer::{LoadOptions, Transformer};

const INDEX: &str = "model.safetensors.index.json";

fn logits(model: &Transformer) -> Tensor {
    let tokens = [3u32, 70, 12, 255, 9, 40];
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let rows: Vec<usize> = (0..tokens.len()).collect();
    let mut cache = PagedSequence::new(model.config(), 64, DType::F32, model.device()).unwrap();
    model
        .forward(&tokens, &positions, &rows, &mut cache)
        .unwrap()
}

fn load_err(dir: &Path) -> String {
    load_weights(dir, &LoadOptions::default())
        .expect_err("the folder must be refused")
        .to_string()
}

fn read_index(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(INDEX)).unwrap()).unwrap()
}

fn write_index(dir: &Path, index: &serde_json::Value) {
    std::fs::write(dir.join(INDEX), index.to_string()).unwrap();
}

/// A three-shard Qwen3 folder (its q/k norms included) in a fresh temporary folder.
fn sharded() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sharded");
    write_sharded_safetensors(&dir, &TinySpec::new(Architecture::Qwen3), DType::BF16, 3).unwrap();
    (tmp, dir)
}

#[test]
fn shards_give_the_single_files_logits_and_strays_are_not_read() {
    for arch in [
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Llama,
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (one, three) = (tmp.path().join("one"), tmp.path().join("three"));
        let spec = TinySpec::new(arch);
        write_tiny_safetensors(&one, &spec, DType::BF16).unwrap();
        write_sharded_safetensors(&three, &spec, DType::BF16, 3).unwrap();
        // Mistral repos ship `consolidated.safetensors` beside the shards; a leftover single
        // file is no better. Neither is named by the index, so neither may be opened.
        std::fs::write(
            three.join("consolidated.safetensors"),
            b"not a safetensors file",
        )
        .unwrap();
        std::fs::write(three.join("model.safetensors"), b"stale").unwrap();
        let a = load_weights(&one, &LoadOptions::default()).unwrap();
        let b = load_weights(&three, &LoadOptions::default()).unwrap();
        let (a, b) = (logits(&a.transformer), logits(&b.transformer));
        let diff = (a - b).unwrap().abs().unwrap().max_keepdim(1).unwrap();
        let diff: f32 = diff
            .max(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(diff, 0.0, "{arch:?}: sharded logits differ by {diff}");
    }
}

#[test]
fn a_missing_shard_is_named() {
    let (_tmp, dir) = sharded();
    std::fs::remove_file(dir.join("model-00002-of-00003.safetensors")).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("model-00002-of-00003.safetensors") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn a_tensor_the_index_misplaces_or_no_shard_holds_is_named() {
    let (_tmp, dir) = sharded();
    let mut index = read_index(&dir);
    let name = "model.layers.1.self_attn.k_norm.weight";
    let held_by = index["weight_map"][name].as_str().unwrap().to_string();
    let other = [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
    ]
    .into_iter()
    .find(|s| *s != held_by)
    .unwrap();
    index["weight_map"][name] = other.into();
    write_index(&dir, &index);
    let err = load_err(&dir);
    assert!(
        err.contains(name) && err.contains(other) && err.contains(&held_by),
        "{err}"
    );

    let (_tmp, dir) = sharded();
    let mut index = read_index(&dir);
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] =
        "model-00001-of-00003.safetensors".into();
    write_index(&dir, &index);
    let err = load_err(&dir);
    assert!(
        err.contains("model.layers.9.mlp.up_proj.weight") && err.contains("no shard holds it"),
        "{err}"
    );
}

#[test]
fn a_tensor_in_two_shards_is_named_with_both() {
    let (_tmp, dir) = sharded();
    let mut index = read_index(&dir);
    let name = "model.norm.weight";
    let first = index["weight_map"][name].as_str().unwrap().to_string();
    let extra = "model-extra.safetensors";
    let t = Tensor::ones(64, DType::BF16, &Device::Cpu).unwrap();
    let extra_only = Tensor::ones(4, DType::BF16, &Device::Cpu).unwrap();
    candle_core::safetensors::save(
        &[
            (name.to_string(), t),
            ("extra.only".to_string(), extra_only),
        ]
        .into_iter()
        .collect(),
        dir.join(extra),
    )
    .unwrap();
    index["weight_map"]["extra.only"] = extra.into();
    write_index(&dir, &index);
    let err = load_err(&dir);
    assert!(
        err.contains(name) && err.contains(&first) && err.contains(extra),
        "{err}"
    );
}

#[test]
fn a_shape_that_disagrees_with_the_config_names_tensor_and_shard() {
    let (_tmp, dir) = sharded();
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["intermediate_size"] = 96.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let err = load_err(&dir);
    let index = read_index(&dir);
    let name = "model.layers.0.mlp.gate_proj.weight";
    let shard = index["weight_map"][name].as_str().unwrap();
    assert!(
        err.contains(name) && err.contains(shard) && err.contains("[96, 64]"),
        "{err}"
    );
}

#[test]
fn truncated_or_corrupt_shards_are_errors_not_panics() {
    let (_tmp, dir) = sharded();
    let shard = dir.join("model-00003-of-00003.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    for cut in [0, 4, 8, 20, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&shard, &bytes[..cut]).unwrap();
        let err = load_err(&dir);
        assert!(
            err.contains("model-00003-of-00003.safetensors"),
            "cut {cut}: {err}"
        );
    }
    // A header whose length field points past the end of the file.
    let mut huge = bytes.clone();
    huge[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&shard, &huge).unwrap();
    assert!(load_err(&dir).contains("header"));
}

#[test]
fn an_index_that_points_outside_the_folder_is_refused() {
    let (_tmp, dir) = sharded();
    let mut index = read_index(&dir);
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors".into();
    write_index(&dir, &index);
    let err = load_err(&dir);
    assert!(err.contains("../elsewhere.safetensors"), "{err}");
}

#[test]
fn without_an_index_the_only_file_is_read_and_several_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    write_tiny_safetensors(&dir, &TinySpec::new(Architecture::Llama), DType::F32).unwrap();
    std::fs::rename(
        dir.join("model.safetensors"),
        dir.join("weights.safetensors"),
    )
    .unwrap();
    std::fs::write(dir.join("consolidated.safetensors"), b"ignored").unwrap();
    load_weights(&dir, &LoadOptions::default()).expect("the one weights file loads");
    std::fs::copy(
        dir.join("weights.safetensors"),
        dir.join("more.safetensors"),
    )
    .unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("more.safetensors")
            && err.contains("weights.safetensors")
            && err.contains(INDEX),
        "{err}"
    );
    std::fs::remove_file(dir.join("more.safetensors")).unwrap();
    std::fs::remove_file(dir.join("weights.safetensors")).unwrap();
    let err = load_err(&dir);
    assert!(err.contains("no model.safetensors"), "{err}");
}
