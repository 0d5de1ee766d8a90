//! Real models against llama.cpp: same prompt ids, same 32 greedy tokens, and first-step logits
//! that agree (top-5 identical, small max abs difference). The golden files were made by
//! `scripts/golden/make_llamacpp_golden.py` on the fetched (re-quantized) GGUF files.

use std::path::PathBuf;

use serde_json::Value;
use triage::{generate, EntropySettings, GenerateRequest, LoadOptions, Model, Prompt, SamplingParams};
use triage_models::attention::ContiguousKvCache;

/// Largest |ours - llama.cpp| allowed on first-step logits. Both quantize activations to Q8 in
/// mat-vecs but we prefill with dense f32 weights, so a few hundredths are expected.
const MAX_LOGIT_DIFF: f32 = 0.35;

fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/llamacpp_{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file")).expect("golden json")
}

fn fetched(name: &str) -> Model {
    let path = triage_models::paths::fetched_gguf(name);
    assert!(path.exists(), "{} missing: run `triage models fetch {name}` (scripts/test does)", path.display());
    Model::load(name, &path, &LoadOptions::default()).expect("load model")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn check_model(name: &str) {
    let golden = golden(name);
    let model = fetched(name);
    let sampled = ids(&golden["sampled_ids"]);
    let mut worst = 0f32;
    for case in golden["prompts"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = ids(&case["prompt_ids"]);
        let ours = model.tokenizer.encode(prompt, model.tokenizer.add_bos(), true).unwrap();
        assert_eq!(ours, prompt_ids, "{name}: prompt ids of {prompt:?}");

        // First-step logits.
        let mut cache = ContiguousKvCache::new(model.transformer.config().num_layers);
        let positions: Vec<u32> = (0..prompt_ids.len() as u32).collect();
        let logits = model.transformer.forward(&prompt_ids, &positions, &[prompt_ids.len() - 1], &mut cache).unwrap();
        let logits = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let top = case["first_logits"]["top"].as_array().unwrap();
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let top5_ref: Vec<u32> = top.iter().take(5).map(|p| p[0].as_u64().unwrap() as u32).collect();
        assert_eq!(&order[..5], &top5_ref[..], "{name}: top-5 of {prompt:?}");
        let refs = top
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
            .chain(sampled.iter().copied().zip(case["first_logits"]["sampled"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32)));
        for (id, value) in refs {
            worst = worst.max((logits[id as usize] - value).abs());
        }

        // Greedy decoding.
        let request = GenerateRequest {
            prompt: Prompt::Tokens(prompt_ids.clone()),
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: Some(32),
                ignore_eos: true,
                ..Default::default()
            },
            entropy: EntropySettings::default(),
        };
        let out = generate(&model, &request, |_, _| true).unwrap();
        let ours: Vec<u32> = out.tokens.iter().map(|t| t.id).collect();
        assert_eq!(ours, ids(&case["generated_ids"]), "{name}: greedy tokens of {prompt:?}");
    }
    eprintln!("{name}: first-step logits max abs diff vs llama.cpp = {worst}");
    assert!(worst < MAX_LOGIT_DIFF, "{name}: max abs logit diff {worst}");
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_model("smollm2-135m");
}

#[test]
fn qwen_0_5b_matches_llama_cpp() {
    check_model("qwen2.5-coder-0.5b");
}
