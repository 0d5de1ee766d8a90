//! Real models' configs (Qwen2.5-7B, Qwen3-8B, Qwen3-0.6B, Llama-3.1-8B, as their Hub repos
//! publish them in `hf_configs/`) cut to one or two layers and a 512-token vocabulary, with
//! random weights that transformers writes as bf16 shards (`hf_parity.py`): triage loads the
//! shards and gives transformers' logits, in f32, at positions from 3000 (where Llama 3.1's
//! rope scaling changes the result).

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Tensor};
use triage_models::config::{ModelConfig, RopeScaling};
use triage_models::model::load_weights;
use triage_models::paged_kv_cache::PagedSequence;
use triage_models::transformer::{LoadOptions, Transformer};
use triage_testkit::max_abs_diff;

/// The f32 tolerance of the other logits comparisons in this crate's tests.
const TOLERANCE: f32 = 1e-3;
const VOCAB: usize = 512;
const START: u32 = 3000;
const NUM_TOKENS: usize = 8;

fn python() -> String {
    std::env::var("TRIAGE_TEST_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/pyenv/bin/python").to_string()
    })
}

/// transformers' checkpoint and logits for `config` (a file in `hf_configs/`), in `out`.
fn write_reference(config: &str, layers: usize, out: &Path) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = python();
    let output = Command::new(&python)
        .arg(manifest.join("tests/hf_parity.py"))
        .arg(manifest.join("tests/hf_configs").join(config))
        .arg(out)
        .args([layers, VOCAB, START as usize, NUM_TOKENS].map(|n| n.to_string()))
        .arg("17")
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python}: {e}; scripts/test installs torch and transformers there")
        });
    assert!(
        output.status.success(),
        "hf_parity.py failed for {config}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

struct Expected {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    logits: Tensor,
}

fn expected(dir: &Path) -> Expected {
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        json[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let rows: Vec<Vec<f32>> = serde_json::from_value(json["logits"].clone()).unwrap();
    Expected {
        tokens: ids("tokens"),
        positions: ids("positions"),
        logits: Tensor::new(rows, &candle_core::Device::Cpu).unwrap(),
    }
}

fn logits(model: &Transformer, e: &Expected) -> Tensor {
    let rows: Vec<usize> = (0..e.tokens.len()).collect();
    let mut cache = PagedSequence::new(model.config(), 64, DType::F32, model.device()).unwrap();
    model
        .forward(&e.tokens, &e.positions, &rows, &mut cache)
        .unwrap()
}

fn read_config(path: &Path) -> ModelConfig {
    let json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    ModelConfig::from_hf_json(&json).unwrap()
}

/// Loads transformers' shards of `config` cut to `layers` and compares logits; returns the
/// folder and the difference.
fn check(config: &str, layers: usize) -> (tempfile::TempDir, PathBuf, f32) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    write_reference(config, layers, &dir);
    assert!(
        dir.join("model.safetensors.index.json").exists(),
        "{config}: transformers wrote no sharded checkpoint"
    );
    // The Hub's (v4) layout of the config reads as the v5 one transformers just wrote.
    let written = read_config(&dir.join("config.json"));
    assert_eq!(
        written,
        read_config(&dir.join("config.v4.json")),
        "{config}"
    );
    let model = load_weights(&dir, &LoadOptions::default())
        .unwrap()
        .transformer;
    assert_eq!(model.config().num_layers, layers);
    let e = expected(&dir);
    let diff = max_abs_diff(&logits(&model, &e), &e.logits);
    let scale = e
        .logits
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    eprintln!("{config}: max abs diff {diff} from transformers at logit scale {scale}");
    assert!(
        diff < TOLERANCE,
        "{config}: max abs diff {diff} from transformers, scale {scale}"
    );
    (tmp, dir, diff)
}

#[test]
fn qwen2_5_7b_matches_transformers() {
    check("qwen2.5-7b-instruct.json", 1);
}

#[test]
fn qwen3_8b_matches_transformers() {
    check("qwen3-8b.json", 1);
}

/// Two layers, a head of 128 against 1024 / 16 = 64, and a tied head.
#[test]
fn qwen3_0_6b_matches_transformers() {
    let (_tmp, dir, _) = check("qwen3-0.6b.json", 2);
    let c = read_config(&dir.join("config.json"));
    assert_eq!((c.head_dim, c.tie_embeddings), (128, true));
}

/// And the comparison can fail: without its rope scaling the same weights are far off.
#[test]
fn llama_3_1_8b_matches_transformers_with_its_rope_scaling() {
    let (_tmp, dir, diff) = check("llama-3.1-8b-instruct.json", 1);
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["rope_parameters"]["rope_type"] = "default".into();
    std::fs::write(&path, json.to_string()).unwrap();
    let unscaled = load_weights(&dir, &LoadOptions::default())
        .unwrap()
        .transformer;
    assert_eq!(unscaled.config().rope_scaling, RopeScaling::None);
    let e = expected(&dir);
    let off = max_abs_diff(&logits(&unscaled, &e), &e.logits);
    eprintln!("without its rope scaling: max abs diff {off}");
    assert!(
        off > 10.0 * TOLERANCE.max(diff),
        "ignoring rope scaling moved the logits only {off} (scaled: {diff})"
    );
}
