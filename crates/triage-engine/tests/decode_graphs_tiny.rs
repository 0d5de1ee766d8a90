//! Decode replayed from captured steps (`EngineConfig::cuda_graphs`) on a tiny model, through the
//! CPU form of a step graph (the captured closure run again, its arguments frozen as a CUDA
//! graph's are): the tokens, logprobs and entropies are the eager engine's, batched, padded up
//! to a bucket, and alone, and every replay reads its own step's inputs.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use triage_engine::{
    EngineConfig, EntropySettings, GenerateRequest, KvBudget, LlmEngine, Prompt, SamplingParams,
    StreamEvent, TokenOutput,
};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;

fn tiny(dtype: GgmlDType) -> (tempfile::TempDir, Arc<Model>) {
    tiny_with(dtype, &LoadOptions::default())
}

fn tiny_with(dtype: GgmlDType, opts: &LoadOptions) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), dtype).unwrap();
    let model = Model::load("tiny", &path, opts).unwrap();
    (dir, Arc::new(model))
}

fn request(i: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Text(format!("a tide of {} comes in", "salt ".repeat(i))),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(4 + 2 * i),
            ignore_eos: true,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    }
}

fn config(cuda_graphs: bool) -> EngineConfig {
    EngineConfig {
        kv_budget: KvBudget::Blocks(128),
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 16,
        prefix_caching: false,
        cuda_graphs,
        ..EngineConfig::default()
    }
}

/// [`config`] with the KV cache in `kv_dtype`.
fn config_kv(cuda_graphs: bool, kv_dtype: candle_core::DType) -> EngineConfig {
    EngineConfig {
        kv_dtype: Some(kv_dtype),
        ..config(cuda_graphs)
    }
}

/// Every request's tokens, run concurrently; and the buckets the engine captured.
fn run(
    model: &Arc<Model>,
    cuda_graphs: bool,
    requests: &[GenerateRequest],
) -> (Vec<Vec<TokenOutput>>, usize) {
    run_with(model, config(cuda_graphs), requests)
}

fn run_with(
    model: &Arc<Model>,
    config: EngineConfig,
    requests: &[GenerateRequest],
) -> (Vec<Vec<TokenOutput>>, usize) {
    let mut engine = LlmEngine::new(model.clone(), config).unwrap();
    let rxs: Vec<_> = requests
        .iter()
        .map(|r| engine.add_request(r).unwrap().1)
        .collect();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let tokens = rxs
        .into_iter()
        .map(|rx| {
            rx.try_iter()
                .filter_map(|e| match e {
                    StreamEvent::Token(t, _) => Some(t),
                    _ => None,
                })
                .collect()
        })
        .collect();
    (tokens, engine.num_captured_graphs())
}

fn assert_same(graphed: &[Vec<TokenOutput>], eager: &[Vec<TokenOutput>]) {
    for (i, (g, e)) in graphed.iter().zip(eager).enumerate() {
        let ids = |t: &[TokenOutput]| t.iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(ids(g), ids(e), "request {i}");
        for (a, b) in g.iter().zip(e) {
            // A padded batch multiplies more rows; each row's sums are its own, so the values
            // agree to rounding.
            assert!(
                (a.logprob - b.logprob).abs() < 1e-4,
                "request {i}: {a:?} {b:?}"
            );
            assert!(
                (a.entropy - b.entropy).abs() < 1e-4,
                "request {i}: {a:?} {b:?}"
            );
        }
    }
}

#[test]
fn graphed_decode_gives_the_eager_tokens_padded_batched_and_alone() {
    for dtype in [GgmlDType::F32, GgmlDType::Q8_0] {
        let (_dir, model) = tiny(dtype);
        // Nine requests of different lengths: the batch shrinks from 9 rows (padded to 16)
        // through every bucket down to one as they finish.
        let requests: Vec<_> = (0..9).map(request).collect();
        let (eager, none) = run(&model, false, &requests);
        assert_eq!(none, 0);
        let (graphed, captured) = run(&model, true, &requests);
        assert_same(&graphed, &eager);
        assert!(captured >= 6, "{captured} buckets captured");
        for (r, expected) in requests.iter().zip(&eager).take(3) {
            let (alone, captured) = run(&model, true, std::slice::from_ref(r));
            assert_eq!(captured, 1);
            assert_same(&alone, std::slice::from_ref(expected));
        }
    }
}

/// The hazard a content-keyed upload cache poses: a replay that read the capture's token or
/// position would repeat the first decode step's output. One request captures bucket 1 on its
/// first decode step and replays it for every later one; each of those tokens must be the eager
/// engine's, and its positions must advance (the entropies differ from step to step).
#[test]
fn every_replay_reads_its_own_steps_inputs() {
    let (_dir, model) = tiny(GgmlDType::F32);
    let mut long = request(1);
    long.params.max_tokens = Some(24);
    let requests = [long];
    let (eager, _) = run(&model, false, &requests);
    let (graphed, captured) = run(&model, true, &requests);
    assert_eq!(captured, 1, "one capture, then replays");
    assert_same(&graphed, &eager);
    let mut entropies: Vec<u32> = graphed[0].iter().map(|t| t.entropy.to_bits()).collect();
    entropies.dedup();
    assert!(
        entropies.len() > 12,
        "replays differ step to step: {entropies:?}"
    );
}

/// Steps that want hidden states, and prefill, run eagerly beside graphed decode.
#[test]
fn hidden_state_requests_run_eagerly_beside_graphed_ones() {
    let (_dir, model) = tiny(GgmlDType::F32);
    let mut wants_hidden = request(2);
    wants_hidden.params.hidden_layers = vec![0];
    wants_hidden.params.hidden_steps = 2;
    let requests = [request(0), wants_hidden, request(3)];
    let (eager, _) = run(&model, false, &requests);
    let (graphed, captured) = run(&model, true, &requests);
    assert_same(&graphed, &eager);
    assert!(captured >= 1);
    assert_eq!(graphed[1][0].hidden, eager[1][0].hidden);
}

/// The GPU's layout on the CPU: dense bf16 matrices, so the LM head writes bf16 logits and the
/// reduction reads them as they are. Greedy tokens are the argmax of those logits (the first
/// one checked against the model's own forward pass), graphed or eager, and a drawing sampler
/// widens its row to f32 on the way to the host.
#[test]
fn a_bf16_lm_head_keeps_its_logits_bf16_graphed_or_eager() {
    let opts = LoadOptions {
        dense_dtype: candle_core::DType::BF16,
        ..LoadOptions::default()
    };
    let (_dir, model) = tiny_with(GgmlDType::F32, &opts);
    assert_eq!(model.transformer.logits_dtype(), candle_core::DType::BF16);
    let requests: Vec<_> = (0..3).map(request).collect();
    let (eager, _) = run(&model, false, &requests);
    let (graphed, captured) = run(&model, true, &requests);
    assert!(captured >= 1);
    assert_same(&graphed, &eager);
    let prompt = model
        .tokenizer
        .encode("a tide of  comes in", false, false)
        .unwrap();
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut cache = triage_models::paged_kv_cache::PagedSequence::new(
        model.transformer.config(),
        prompt.len(),
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let logits = model
        .transformer
        .forward(&prompt, &positions, &[prompt.len() - 1], &mut cache)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let first = eager[0][0].id as usize;
    assert!(
        logits.iter().all(|&x| x <= logits[first]),
        "token {first} is not the argmax"
    );
    // A bf16 cache takes the fused bias/rope/cache-write kernel's CPU form, eager or graphed,
    // and tracks the f16 cache's split ops to the caches' rounding.
    let bf16_kv = candle_core::DType::BF16;
    let (fused, _) = run_with(&model, config_kv(false, bf16_kv), &requests);
    let (fused_graphed, _) = run_with(&model, config_kv(true, bf16_kv), &requests);
    assert_same(&fused_graphed, &fused);
    for (f, e) in fused.iter().zip(&eager) {
        assert_eq!(
            f[0].id, e[0].id,
            "the first token comes before any cache read"
        );
        assert!((f[0].logprob - e[0].logprob).abs() < 0.05);
    }
    let mut drawn = request(1);
    drawn.params.temperature = 0.8;
    drawn.params.seed = Some(7);
    let (tokens, _) = run(&model, false, &[drawn]);
    assert_eq!(tokens[0].len(), 6);
}
