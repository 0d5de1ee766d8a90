//! Real models against llama.cpp on the same re-quantized GGUF files: same prompt ids, same
//! greedy tokens, first-step logits that agree. Golden files: `scripts/golden/make_llamacpp_golden.py`
//! (llama-cpp-python 0.3.36, f32 K/V cache like ours).
//!
//! Tolerances, measured 2026-11-29: llama.cpp's own f16-vs-f32 K/V cache choice moves SmolLM2's
//! first-step logits by up to 1.3 and the 0.5B's by a few tenths, and flips near-ties; ours differ
//! from llama.cpp's f32-cache run by at most 0.37 (0.5B) and 0.78 (SmolLM2) since prompts under
//! 64 tokens run through triage's Q8_0 kernel (int8 activations, as llama.cpp's do; it was 0.30
//! and 0.57 when every prefill ran in f32). So the test asks for the same top-1 everywhere and
//! the same top-5 set for the 0.5B, the same 32 greedy tokens on at least 4 of 5 prompts (a
//! near-tie may flip one continuation), and a max abs difference inside llama.cpp's own spread.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;
use triage::{
    generate, EntropySettings, GenerateRequest, LoadOptions, Model, Prompt, SamplingParams,
};
use triage_models::attention::ContiguousKvCache;

fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/golden/llamacpp_{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file"))
        .expect("golden json")
}

fn fetched(name: &str) -> Model {
    let path = triage_models::paths::fetched_gguf(name);
    assert!(
        path.exists(),
        "{} missing: run `triage models fetch {name}` (scripts/test does)",
        path.display()
    );
    Model::load(name, &path, &LoadOptions::default()).expect("load model")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn first_logits(model: &Model, prompt_ids: &[u32]) -> Vec<f32> {
    let mut cache = ContiguousKvCache::new(model.transformer.config().num_layers);
    let positions: Vec<u32> = (0..prompt_ids.len() as u32).collect();
    let logits = model
        .transformer
        .forward(prompt_ids, &positions, &[prompt_ids.len() - 1], &mut cache)
        .unwrap();
    logits.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn greedy(model: &Model, prompt_ids: &[u32]) -> Vec<u32> {
    let request = GenerateRequest {
        prompt: Prompt::Tokens(prompt_ids.to_vec()),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(32),
            ignore_eos: true,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    };
    let out = generate(model, &request, |_, _| true).unwrap();
    out.tokens.iter().map(|t| t.id).collect()
}

fn check_model(name: &str, max_logit_diff: f32, strict_top5: bool) {
    let golden = golden(name);
    let model = fetched(name);
    let sampled = ids(&golden["sampled_ids"]);
    let (mut worst, mut identical) = (0f32, 0);
    let cases = golden["prompts"].as_array().unwrap();
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = ids(&case["prompt_ids"]);
        let ours = model
            .tokenizer
            .encode(prompt, model.tokenizer.add_bos(), true)
            .unwrap();
        assert_eq!(ours, prompt_ids, "{name}: prompt ids of {prompt:?}");

        let logits = first_logits(&model, &prompt_ids);
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let top = case["first_logits"]["top"].as_array().unwrap();
        let reference: Vec<(u32, f32)> = top
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
            .chain(
                sampled.iter().copied().zip(
                    case["first_logits"]["sampled"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32),
                ),
            )
            .collect();
        let diff = reference
            .iter()
            .map(|&(id, v)| (logits[id as usize] - v).abs())
            .fold(0f32, f32::max);
        worst = worst.max(diff);
        let top5: BTreeSet<u32> = order[..5].iter().copied().collect();
        let top5_ref: BTreeSet<u32> = reference[..5].iter().map(|p| p.0).collect();
        assert_eq!(order[0], reference[0].0, "{name}: top-1 of {prompt:?}");
        if strict_top5 {
            assert_eq!(top5, top5_ref, "{name}: top-5 of {prompt:?}");
        } else {
            let top10_ref: BTreeSet<u32> = reference[..10].iter().map(|p| p.0).collect();
            assert!(
                top5.is_subset(&top10_ref),
                "{name}: top-5 of {prompt:?} outside llama.cpp's top-10"
            );
        }

        let tokens = greedy(&model, &prompt_ids);
        let expected = ids(&case["generated_ids"]);
        let same = tokens
            .iter()
            .zip(&expected)
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!("{name}: {prompt:?}: logit diff {diff:.3}, greedy agrees on {same}/32");
        assert!(same >= 1, "{name}: first greedy token of {prompt:?}");
        identical += usize::from(same == expected.len());
    }
    eprintln!(
        "{name}: max abs logit diff {worst:.3}; {identical}/{} greedy runs identical",
        cases.len()
    );
    assert!(worst < max_logit_diff, "{name}: max abs logit diff {worst}");
    assert!(
        identical + 1 >= cases.len(),
        "{name}: only {identical} identical greedy runs"
    );
}

#[test]
fn qwen_0_5b_matches_llama_cpp() {
    check_model("qwen2.5-coder-0.5b", 0.45, true);
}

#[test]
fn smollm2_matches_llama_cpp() {
    // SmolLM2 is the more sensitive model (see the module docs): its 5th place may swap with 6th.
    check_model("smollm2-135m", 1.0, false);
}
