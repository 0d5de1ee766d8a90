//! Continuous batching on a tiny model: batched, prefix-cached and preempted runs give the same
//! greedy tokens as `generate` alone, and every block is free once requests end.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use triage_engine::generate::{generate, EntropySettings, FinishReason, GenerateRequest, Prompt};
use triage_engine::llm_engine::{EngineConfig, LlmEngine, StreamEvent, Usage};
use triage_engine::sampler::SamplingParams;
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;

fn tiny() -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    // F32 weights: batched decode (GEMM) and single decode then do the same arithmetic.
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), GgmlDType::F32).unwrap();
    (
        dir,
        Arc::new(Model::load("tiny", &path, &LoadOptions::default()).unwrap()),
    )
}

fn request(i: usize) -> GenerateRequest {
    let shared = "the heat of the sun on the sea ";
    GenerateRequest {
        prompt: Prompt::Text(format!("{shared}{}", "x".repeat(i * 3))),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(6 + i),
            ignore_eos: true,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    }
}

/// Run all requests concurrently; returns each one's token ids, text and final usage.
fn run_batched(
    model: &Arc<Model>,
    config: EngineConfig,
    requests: &[GenerateRequest],
) -> (Vec<(Vec<u32>, String, Usage)>, usize) {
    let mut engine = LlmEngine::new(model.clone(), config).unwrap();
    let rxs: Vec<_> = requests
        .iter()
        .map(|r| engine.add_request(r).unwrap().1)
        .collect();
    while engine.has_unfinished() {
        assert!(engine.step().unwrap() > 0);
        let pool = engine.scheduler().kv().pool();
        assert_eq!(pool.num_free() + pool.num_used(), pool.num_total());
    }
    let preempted = engine.num_preemptions();
    assert_eq!(
        engine.scheduler().kv().pool().num_used(),
        0,
        "all blocks free at the end"
    );
    let results = rxs
        .into_iter()
        .map(|rx| {
            let (mut ids, mut text, mut usage) = (Vec::new(), String::new(), None);
            for ev in rx.try_iter() {
                match ev {
                    StreamEvent::Token(t, piece) => {
                        ids.push(t.id);
                        text.push_str(&piece);
                    }
                    StreamEvent::Text(piece) => text.push_str(&piece),
                    StreamEvent::Finished { usage: u, .. } => usage = Some(u),
                }
            }
            (ids, text, usage.expect("finished event"))
        })
        .collect();
    (results, preempted)
}

fn alone(model: &Model, r: &GenerateRequest) -> (Vec<u32>, String) {
    let out = generate(model, r, |_, _| true).unwrap();
    (out.tokens.iter().map(|t| t.id).collect(), out.text)
}

#[test]
fn eight_concurrent_requests_equal_each_alone_with_and_without_prefix_cache() {
    let (_dir, model) = tiny();
    let requests: Vec<_> = (0..8).map(request).collect();
    let expected: Vec<_> = requests.iter().map(|r| alone(&model, r)).collect();
    for prefix_caching in [true, false] {
        let config = EngineConfig {
            num_blocks: 128,
            block_size: 4,
            max_num_batched_tokens: 64,
            max_num_seqs: 8,
            prefix_caching,
        };
        let (got, _) = run_batched(&model, config, &requests);
        for (i, ((ids, text, usage), (e_ids, e_text))) in got.iter().zip(&expected).enumerate() {
            assert_eq!(ids, e_ids, "request {i}, prefix caching {prefix_caching}");
            assert_eq!(text, e_text);
            assert_eq!(usage.completion_tokens, 6 + i);
        }
        let cached: usize = got.iter().map(|g| g.2.cached_tokens).sum();
        assert_eq!(
            cached > 0,
            prefix_caching,
            "shared prompt prefix is reused only with caching on"
        );
    }
}

#[test]
fn a_pool_too_small_forces_preemption_and_outputs_stay_identical() {
    let (_dir, model) = tiny();
    let requests: Vec<_> = (0..4).map(request).collect();
    let expected: Vec<_> = requests.iter().map(|r| alone(&model, r)).collect();
    // Each request needs up to 13 blocks of 4 tokens by its end; 24 blocks cannot hold 4 at once.
    let config = EngineConfig {
        num_blocks: 25,
        block_size: 4,
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        prefix_caching: false,
    };
    let (got, preempted) = run_batched(&model, config, &requests);
    assert!(preempted > 0, "the pool was meant to force preemption");
    for ((ids, text, _), (e_ids, e_text)) in got.iter().zip(&expected) {
        assert_eq!(ids, e_ids);
        assert_eq!(text, e_text);
    }
}

#[test]
fn cancelling_mid_prefill_and_mid_decode_frees_blocks() {
    let (_dir, model) = tiny();
    let config = EngineConfig {
        num_blocks: 64,
        block_size: 4,
        max_num_batched_tokens: 8,
        max_num_seqs: 8,
        prefix_caching: true,
    };
    let mut engine = LlmEngine::new(model, config).unwrap();
    let (a, rx_a) = engine.add_request(&request(5)).unwrap(); // 46-token prompt: several chunks
    let (b, rx_b) = engine.add_request(&request(0)).unwrap();
    engine.step().unwrap();
    engine.cancel(a);
    for _ in 0..12 {
        engine.step().unwrap();
    }
    assert!(
        rx_b.try_iter().any(|e| matches!(e, StreamEvent::Token(..))),
        "b is decoding"
    );
    engine.cancel(b);
    assert!(!engine.has_unfinished());
    assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
    let last = rx_a.try_iter().last().unwrap();
    assert!(matches!(
        last,
        StreamEvent::Finished {
            reason: FinishReason::Cancelled,
            ..
        }
    ));
}

#[test]
fn oversized_requests_are_refused_up_front() {
    let (_dir, model) = tiny();
    let config = EngineConfig {
        num_blocks: 8,
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        prefix_caching: true,
    };
    let mut engine = LlmEngine::new(model, config).unwrap();
    assert!(engine.add_request(&request(7)).is_err());
    assert!(!engine.has_unfinished());
}
