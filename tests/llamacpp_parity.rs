//! Real models against llama.cpp on the same GGUF files, as shipped: same prompt ids, same
//! greedy tokens, first-step logits that agree. Golden files: `scripts/golden/make_llamacpp_golden.py`
//! (llama-cpp-python 0.3.36, f32 K/V cache like ours).
//!
//! Tolerances, measured 2026-11-29: llama.cpp's own f16-vs-f32 K/V cache choice moves SmolLM2's
//! first-step logits by up to 1.3 and the 0.5B's by a few tenths, and flips near-ties; ours differ
//! from llama.cpp's f32-cache run by at most 0.37 (0.5B) and 0.78 (SmolLM2) since prompts under
//! 64 tokens run through triage's Q8_0 kernel (int8 activations, as llama.cpp's do; it was 0.30
//! and 0.57 when every prefill ran in f32). So the test asks for the same top-1 everywhere, the
//! same top-5 set for the 0.5B up to a near-tie at fifth place, and a max abs difference inside
//! llama.cpp's own spread. Greedy continuations must equal llama.cpp's or leave them only at a
//! near-tie (llama.cpp's token within `NEAR_TIE` nats of ours at the split), on at least 2 of 5
//! prompts whole.
//!
//! Measured 2026-12-02 after the 0.5B's Q4_K layers moved to triage's packed kernel (exact
//! integer sums per super-block; candle's repacked kernel before, with its own float order):
//! 3 of 5 continuations identical, the other two split at gaps of 0.048 and 0.108 nats; SmolLM2
//! 4 of 5, one split at 0.090. No summation order reproduces llama.cpp's here: its own x86
//! repacked order, tried, flipped two other prompts.
//!
//! Measured 2026-12-02 after the Q8_0 kernel moved to interleaved weights (each 32-value block
//! summed exactly in int32 and fused once, where llama.cpp keeps eight partial sums per block
//! and adds them at the end, an order that held our kernel to under half its rate, see
//! `q8_matmul`): the 0.5B keeps 2 of 5 continuations whole, the other three split at gaps of
//! 0.016, 0.021 and 0.023 nats, a tenth of `NEAR_TIE`; SmolLM2 3 of 5 (0.026 and 0.209). Max
//! first-step logit differences are unchanged (0.32 and 0.81).
//!
//! Measured 2026-12-05 on the files as shipped (Q5_0 for the 0.5B, Q4_1 for SmolLM2, which
//! triage had rewritten as Q8_0 at fetch until its kernels held them; golden files made again
//! with llama-cpp-python built for AVX-512/VNNI): the 0.5B keeps 4 of 5 continuations whole (the
//! fifth splits at 0.047), max logit difference 0.37. SmolLM2 keeps 2 of 5; the others split at
//! 0.30, 0.33 and 0.17 nats, max logit difference 1.03. SmolLM2's split points are llama.cpp's
//! own: its f16-cache run leaves its f32-cache golden run on the same two prompts at the same
//! tokens (5 and 6), one of them at a gap of 0.33, with first-step logits up to 0.86 apart
//! (`scripts/golden/llamacpp_spread.py`). So
//! SmolLM2's near-tie is 0.35 nats and its logit bound 1.1, each just above llama.cpp's own
//! spread on this file; the 0.5B keeps 0.25 and 0.45.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use triage::{
    generate, EntropySettings, GenerateRequest, LoadOptions, Model, Prompt, SamplingParams,
};
use triage_models::paged_kv_cache::{default_kv_dtype, PagedSequence};

/// Two log-probabilities (or logits) closer than a model's near-tie are a near-tie: llama.cpp's
/// own choice of an f16 or f32 K/V cache moves the 0.5B's logits by a few tenths and splits
/// SmolLM2's continuations at gaps up to 0.33 (see the module docs), so which of two such tokens
/// wins is a matter of summation order, not of computing another model.
const NEAR_TIE: f32 = 0.25;
const NEAR_TIE_SMOLLM2: f32 = 0.35;

fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/golden/llamacpp_{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file"))
        .expect("golden json")
}

fn fetched(name: &str) -> Arc<Model> {
    let path = triage_models::paths::fetched_gguf(name);
    assert!(
        path.exists(),
        "{} missing: run `triage models fetch {name}` (scripts/test does)",
        path.display()
    );
    Arc::new(Model::load(name, &path, &LoadOptions::default()).expect("load model"))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn first_logits(model: &Model, prompt_ids: &[u32]) -> Vec<f32> {
    let t = &model.transformer;
    let mut cache = PagedSequence::new(
        t.config(),
        prompt_ids.len(),
        default_kv_dtype(t.device()),
        t.device(),
    )
    .unwrap();
    let positions: Vec<u32> = (0..prompt_ids.len() as u32).collect();
    let logits = model
        .transformer
        .forward(prompt_ids, &positions, &[prompt_ids.len() - 1], &mut cache)
        .unwrap();
    logits.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Greedy tokens with each step's five most likely tokens.
fn greedy(model: &Arc<Model>, prompt_ids: &[u32]) -> Vec<triage::TokenOutput> {
    let request = GenerateRequest {
        prompt: Prompt::Tokens(prompt_ids.to_vec()),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(32),
            ignore_eos: true,
            logprobs: true,
            top_logprobs: 5,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    };
    generate(model, &request, |_, _| true).unwrap().tokens
}

fn check_model(name: &str, max_logit_diff: f32, strict_top5: bool, near_tie: f32) {
    let golden = golden(name);
    let model = fetched(name);
    let sampled = ids(&golden["sampled_ids"]);
    let (mut worst, mut identical, mut near_tie_splits) = (0f32, 0, 0);
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
            // Equal sets, or sets that differ only by a near-tie at the edge: each token in one
            // and not the other sits within NEAR_TIE of our fifth logit.
            let fifth = logits[order[4] as usize];
            for &id in top5.symmetric_difference(&top5_ref) {
                let gap = (logits[id as usize] - fifth).abs();
                assert!(
                    gap <= near_tie,
                    "{name}: top-5 of {prompt:?}: {top5:?} vs llama.cpp's {top5_ref:?} ({id} is {gap} from our 5th)"
                );
            }
        } else {
            let top10_ref: BTreeSet<u32> = reference[..10].iter().map(|p| p.0).collect();
            assert!(
                top5.is_subset(&top10_ref),
                "{name}: top-5 of {prompt:?} outside llama.cpp's top-10"
            );
        }

        let steps = greedy(&model, &prompt_ids);
        let tokens: Vec<u32> = steps.iter().map(|t| t.id).collect();
        let expected = ids(&case["generated_ids"]);
        let same = tokens
            .iter()
            .zip(&expected)
            .take_while(|(a, b)| a == b)
            .count();
        let gap = steps
            .get(same)
            .filter(|_| same < expected.len())
            .map(|step| {
                step.top_logprobs
                    .iter()
                    .find(|(id, _)| *id == expected[same])
                    .map_or(f32::INFINITY, |(_, lp)| step.logprob - lp)
            });
        eprintln!("{name}: {prompt:?}: logit diff {diff:.3}, greedy agrees on {same}/32, gap at the split {gap:?}");
        assert!(same >= 1, "{name}: first greedy token of {prompt:?}");
        identical += usize::from(same == expected.len());
        near_tie_splits += usize::from(gap.is_some_and(|g| g <= near_tie));
    }
    eprintln!(
        "{name}: max abs logit diff {worst:.3}; {identical}/{} greedy runs identical",
        cases.len()
    );
    assert!(worst < max_logit_diff, "{name}: max abs logit diff {worst}");
    // A continuation may leave llama.cpp's only at a near-tie, and at most three of five do.
    assert!(
        identical + near_tie_splits == cases.len() && identical + 3 >= cases.len(),
        "{name}: {identical} identical greedy runs, {near_tie_splits} split at a near-tie"
    );
}

#[test]
fn qwen_0_5b_matches_llama_cpp() {
    check_model("qwen2.5-coder-0.5b", 0.45, true, NEAR_TIE);
}

#[test]
fn smollm2_matches_llama_cpp() {
    // SmolLM2 is the more sensitive model (see the module docs): its 5th place may swap with 6th.
    check_model("smollm2-135m", 1.1, false, NEAR_TIE_SMOLLM2);
}
