//! The engine on a CUDA device against the same engine on the CPU: GGUF block types through
//! candle's CUDA quantized matmul, the paged engine's greedy tokens (f32 layout exact; the bf16
//! GPU layout runs clean), a prefix persisted from device blocks and loaded back into a fresh
//! engine, decode replayed from CUDA graphs against eager decode and the CPU, and the
//! entropy-window kernel against `EntropyMonitor`. Built only with the `cuda` feature and run by `scripts/device-check` on a GPU.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_engine::entropy_monitor::{Decision, EntropyEstimator, EntropyMonitor, EntropyUnit};
use triage_engine::{
    EngineConfig, EntropySettings, GenerateRequest, KvBudget, LlmEngine, PrefixSource, Prompt,
    SamplingParams, StreamEvent,
};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::paged_kv_cache::{default_kv_dtype, PagedSequence};
use triage_models::transformer::LoadOptions;
use triage_models::DeviceSpec;
use triage_ops::entropy_window::entropy_window_cuda;
use triage_ops::entropy_window::{
    EntropyWindowParams, DECISION_ACCEPT, DECISION_CONTINUE, DECISION_ESCALATE,
};
use triage_ops::{logits_reduce_packed, LogitsStats};
use triage_testkit::max_abs_diff;

fn gpu() -> Device {
    DeviceSpec::Cuda(0)
        .open()
        .expect("these tests need a CUDA device")
}

/// The tiny model (F32 GGUF) with `opts`, and the folder that holds it.
fn tiny(opts: &LoadOptions) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), GgmlDType::F32).unwrap();
    let model = Model::load("tiny", &path, opts).unwrap();
    (dir, Arc::new(model))
}

/// f32 matrices on the GPU: the same arithmetic as the CPU up to summation order.
fn f32_on_gpu() -> LoadOptions {
    LoadOptions {
        device: gpu(),
        dense_prefill: false,
        dense_dtype: DType::F32,
    }
}

fn request(i: usize, prefix: &[u32]) -> GenerateRequest {
    let mut ids = prefix.to_vec();
    ids.extend((0..3 + i as u32).map(|t| 20 + 7 * t));
    GenerateRequest {
        prompt: Prompt::Tokens(ids),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(12),
            ignore_eos: true,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    }
}

fn config(kv_dtype: Option<DType>) -> EngineConfig {
    EngineConfig {
        kv_budget: KvBudget::Blocks(96),
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        kv_dtype,
        ..EngineConfig::default()
    }
}

/// Every request's token ids, run concurrently to the end; all blocks are free afterwards.
fn run(engine: &mut LlmEngine, requests: &[GenerateRequest]) -> Vec<Vec<u32>> {
    let rxs: Vec<_> = requests
        .iter()
        .map(|r| engine.add_request(r).unwrap().1)
        .collect();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let pool = engine.scheduler().kv().pool();
    assert_eq!(pool.num_free() + pool.num_used(), pool.num_total());
    rxs.into_iter()
        .map(|rx| {
            rx.try_iter()
                .filter_map(|ev| match ev {
                    StreamEvent::Token(t, _) => Some(t.id),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

/// Logits of every row of `tokens` through one paged sequence (in the device's default KV dtype:
/// f16 on the CPU, bf16 on a GPU).
fn all_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    logits_through(model, tokens, default_kv_dtype(model.transformer.device()))
}

/// Logits of every row of `tokens` through an f32 cache.
fn f32_kv_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    logits_through(model, tokens, DType::F32)
}

fn logits_through(model: &Model, tokens: &[u32], kv_dtype: DType) -> Vec<Vec<f32>> {
    let t = &model.transformer;
    let mut cache = PagedSequence::new(t.config(), tokens.len(), kv_dtype, t.device()).unwrap();
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let rows: Vec<usize> = (0..tokens.len()).collect();
    t.forward(tokens, &positions, &rows, &mut cache)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

/// Largest magnitude among the logits: the scale the tolerances are relative to.
fn scale_of(logits: &[Vec<f32>]) -> f32 {
    logits.iter().flatten().fold(0f32, |m, x| m.max(x.abs()))
}

/// Largest absolute difference between two sets of logits.
fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

/// Rows whose argmax agrees.
fn argmax_agreement(a: &[Vec<f32>], b: &[Vec<f32>]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| argmax(x) == argmax(y))
        .count()
}

#[test]
fn gguf_block_types_run_through_the_gpus_quantized_matmul() {
    // Inner dimensions of 256 so that the K-quants apply. Both devices are measured against the
    // same weights unquantized (an F32 GGUF on the CPU): the GPU quantizes activations its own way
    // (q8_1, bf16 dense tensors) where the CPU uses q8_0/q8_K in f32, so each has its own error;
    // the GPU's must stay within 6 % of the logits' scale or twice the CPU's, whichever is larger.
    let spec = TinySpec {
        hidden_size: 256,
        intermediate_size: 512,
        ..TinySpec::new(Architecture::Qwen2)
    };
    let tokens: Vec<u32> = (0..24).map(|t| (t * 37 % 250) as u32).collect();
    let cpu_opts = LoadOptions {
        dense_prefill: false,
        ..LoadOptions::default()
    };
    let load = |dtype: GgmlDType, opts: &LoadOptions| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        write_tiny_gguf(&path, &spec, dtype).unwrap();
        all_logits(&Model::load("m", &path, opts).unwrap(), &tokens)
    };
    let exact = load(GgmlDType::F32, &cpu_opts);
    let scale = scale_of(&exact);
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K] {
        let cpu = load(dtype, &cpu_opts);
        let gpu = load(
            dtype,
            &LoadOptions::for_device(DeviceSpec::Cuda(0)).unwrap(),
        );
        let (cpu_err, gpu_err) = (max_abs_diff(&cpu, &exact), max_abs_diff(&gpu, &exact));
        let agree = argmax_agreement(&gpu, &cpu);
        println!(
            "{dtype:?}: logits scale {scale:.2}; max abs error vs unquantized: CPU {cpu_err:.4}, \
             GPU {gpu_err:.4}; argmax agrees on {agree}/24"
        );
        assert!(
            gpu_err <= (0.06 * scale).max(2.0 * cpu_err),
            "{dtype:?}: GPU error {gpu_err} vs CPU error {cpu_err} at scale {scale}"
        );
        assert!(
            agree * 10 >= tokens.len() * 9,
            "{dtype:?}: argmax agrees on {agree}/24"
        );
    }
}

#[test]
fn the_0_5b_shape_in_f32_gives_the_cpu_logits_and_bf16_stays_within_its_precision() {
    // Random weights of Qwen2.5-0.5B's shape (24 layers, 896 wide, 14 heads over 2 KV heads),
    // f32 weights and an f32 KV cache on both devices: they differ only in summation order. On
    // the first H200 run (benches/RESULTS.md) the GPU's logits were 1.1e-3 from transformers' f64
    // (7e-6 of their scale, as transformers' own f32 on the GPU), while the CPU with its default
    // f16 KV cache was 0.40 off; hence an f32 cache here, and 1e-4 of the scale.
    // bf16 rounds weights and activations to 8 significant bits: transformers' own bf16 was 8.7 %
    // of the scale from f64 on the same weights, ours 7.0 %; the bound is 10 %. Greedy tokens of
    // a random model, whose top logits are close, part early in bf16 (the device check's row).
    // With TRIAGE_DEVICE_DUMP=DIR the model and the three sets of logits stay in DIR for
    // scripts/device_check/hf_logits.py, which measures each against transformers in f64.
    let spec = TinySpec::real_shape("qwen2.5-0.5b").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dump = std::env::var_os("TRIAGE_DEVICE_DUMP").map(std::path::PathBuf::from);
    let dir = dump.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    triage_models::fixtures::write_tiny_safetensors(&dir, &spec, DType::F32).unwrap();
    let tokens: Vec<u32> = (0..16).map(|t| 100 + 97 * t).collect();
    let load = |opts: &LoadOptions| Model::load("q05", &dir, opts).unwrap();
    let cpu = f32_kv_logits(&load(&LoadOptions::default()), &tokens);
    let scale = scale_of(&cpu);
    let gpu_f32 = f32_kv_logits(&load(&f32_on_gpu()), &tokens);
    let f32_err = max_abs_diff(&gpu_f32, &cpu);
    let bf16 = all_logits(
        &load(&LoadOptions::for_device(DeviceSpec::Cuda(0)).unwrap()),
        &tokens,
    );
    let bf16_err = max_abs_diff(&bf16, &cpu);
    if let Some(dump) = &dump {
        let write = |name: &str, rows: &[Vec<f32>]| {
            let bytes: Vec<u8> = rows
                .iter()
                .flatten()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            std::fs::write(dump.join(name), bytes).unwrap();
        };
        write("logits_cpu_f32.bin", &cpu);
        write("logits_gpu_f32.bin", &gpu_f32);
        write("logits_gpu_bf16.bin", &bf16);
        std::fs::write(dump.join("tokens.json"), format!("{tokens:?}")).unwrap();
    }
    let agree = argmax_agreement(&bf16, &cpu);
    println!(
        "0.5B shape: logits scale {scale:.3}; max abs diff vs CPU f32: GPU f32 {f32_err:.2e}, \
         GPU bf16 {bf16_err:.2e}; bf16 argmax agrees on {agree}/16"
    );
    assert!(f32_err <= 1e-4 * scale, "f32: {f32_err} at scale {scale}");
    assert!(bf16_err <= 0.1 * scale, "bf16: {bf16_err} at scale {scale}");
}

#[test]
fn the_paged_engine_on_the_gpu_gives_the_cpu_tokens() {
    let requests: Vec<_> = (0..5)
        .map(|i| request(i, &[1, 2, 3, 4, 5, 6, 7, 8]))
        .collect();
    let (_d, cpu_model) = tiny(&LoadOptions::default());
    let expected = run(
        &mut LlmEngine::new(cpu_model, config(None)).unwrap(),
        &requests,
    );
    let (_d, gpu_model) = tiny(&f32_on_gpu());
    let got = run(
        &mut LlmEngine::new(gpu_model, config(Some(DType::F32))).unwrap(),
        &requests,
    );
    assert_eq!(got, expected, "f32 weights and an f32 KV cache on the GPU");
    // The GPU's own layout (bf16 matrices, bf16 KV): every request runs to its length.
    let (_d, bf16_model) = tiny(&LoadOptions::for_device(DeviceSpec::Cuda(0)).unwrap());
    let got = run(
        &mut LlmEngine::new(bf16_model, config(None)).unwrap(),
        &requests,
    );
    assert!(got.iter().all(|ids| ids.len() == 12), "{got:?}");
}

/// Decode replayed from CUDA graphs gives the eager engine's tokens on the same GPU (bf16 layout,
/// 48 tokens a request, batches padded up to buckets 8, 4, 2 and 1 as requests end) and, with
/// f32 weights and cache, the CPU's. Every bucket's graph holds launches.
#[test]
fn graphed_decode_on_the_gpu_gives_the_eager_and_the_cpu_tokens() {
    let requests: Vec<_> = (0..6)
        .map(|i| {
            let mut r = request(i, &[1, 2, 3, 4, 5, 6, 7, 8]);
            r.params.max_tokens = Some(40 + 2 * i);
            r
        })
        .collect();
    // Room for every request at once (no preemption), graphs on or off.
    let sized = |kv: Option<DType>, cuda_graphs: bool| EngineConfig {
        kv_budget: KvBudget::Blocks(160),
        cuda_graphs,
        ..config(kv)
    };
    let (_d, bf16_model) = tiny(&LoadOptions::for_device(DeviceSpec::Cuda(0)).unwrap());
    let eager = run(
        &mut LlmEngine::new(bf16_model.clone(), sized(None, false)).unwrap(),
        &requests,
    );
    let mut engine = LlmEngine::new(bf16_model, sized(None, true)).unwrap();
    assert_eq!(run(&mut engine, &requests), eager, "bf16: graphed vs eager");
    assert!(engine.num_captured_graphs() >= 3);
    let nodes = engine.graph_nodes().unwrap();
    assert!(nodes.iter().all(|&[_, n]| n > 0), "{nodes:?}");
    eprintln!("graph nodes per bucket (tiny model, 2 layers): {nodes:?}");
    let (_d, cpu_model) = tiny(&LoadOptions::default());
    let expected = run(
        &mut LlmEngine::new(cpu_model, sized(None, false)).unwrap(),
        &requests,
    );
    let (_d, f32_model) = tiny(&f32_on_gpu());
    let got = run(
        &mut LlmEngine::new(f32_model, sized(Some(DType::F32), true)).unwrap(),
        &requests,
    );
    assert_eq!(got, expected, "f32 graphed on the GPU vs the CPU");
}

#[test]
fn a_prefix_persisted_from_the_gpu_loads_back_into_a_fresh_engine() {
    let prefix: Vec<u32> = (0..24).map(|t| 30 + 3 * t).collect();
    let dir = tempfile::tempdir().unwrap();
    let (_d, model) = tiny(&f32_on_gpu());
    let mut first = LlmEngine::new(model.clone(), config(Some(DType::F32))).unwrap();
    let (_, source) = first.pin_persisted_prefix(&prefix, dir.path()).unwrap();
    assert!(matches!(source, PrefixSource::Computed { .. }));
    let mut second = LlmEngine::new(model, config(Some(DType::F32))).unwrap();
    let (_, source) = second.pin_persisted_prefix(&prefix, dir.path()).unwrap();
    assert_eq!(source, PrefixSource::Disk);
    let requests: Vec<_> = (0..3).map(|i| request(i, &prefix)).collect();
    let (_d, cpu_model) = tiny(&LoadOptions::default());
    let expected = run(
        &mut LlmEngine::new(cpu_model, config(None)).unwrap(),
        &requests,
    );
    assert_eq!(run(&mut second, &requests), expected);
}

#[test]
fn the_entropy_window_on_the_gpu_decides_as_the_monitor() {
    let dev = gpu();
    let mut rng = StdRng::seed_from_u64(5);
    let (n, vocab, k, window) = (19, 300, 4, 6);
    for (estimator, code) in [
        (EntropyEstimator::FullSoftmax, 0),
        (EntropyEstimator::SampledNll, 3),
    ] {
        for (unit, unit_code) in [(EntropyUnit::Nats, 0), (EntropyUnit::Bits, 1)] {
            let tau = rng.random_range(0.5..3.0f32);
            let params = EntropyWindowParams {
                tau,
                window,
                estimator: code,
                unit: unit_code,
            };
            let scales: Vec<f32> = (0..n).map(|_| rng.random_range(0.3..6.0)).collect();
            let mut monitors: Vec<_> = (0..n)
                .map(|_| EntropyMonitor::new(tau, window, estimator, unit).unwrap())
                .collect();
            let mut decisions = vec![Decision::Continue; n];
            let mut state = Tensor::zeros((n, 4), DType::F64, &dev).unwrap();
            for _step in 0..window + 2 {
                let logits: Vec<f32> = scales
                    .iter()
                    .flat_map(|&s| (0..vocab).map(move |_| s).collect::<Vec<_>>())
                    .map(|s| s * rng.random_range(-1.0f32..1.0))
                    .collect();
                let logits = Tensor::from_vec(logits, (n, vocab), &dev).unwrap();
                let packed = logits_reduce_packed(&logits, k).unwrap();
                let stats = LogitsStats::from_packed_rows(&packed, k).unwrap();
                let host = logits.to_vec2::<f32>().unwrap();
                let sampled: Vec<f32> = (0..n)
                    .map(|s| host[s][rng.random_range(0..vocab)] - stats[s].log_sum_exp)
                    .collect();
                let observe = vec![1u32; n];
                state = entropy_window_cuda(
                    &packed,
                    &Tensor::new(sampled.as_slice(), &dev).unwrap(),
                    &Tensor::new(observe.as_slice(), &dev).unwrap(),
                    &state,
                    &params,
                )
                .unwrap();
                for s in 0..n {
                    if decisions[s] == Decision::Continue {
                        decisions[s] = monitors[s].observe_step(&stats[s], sampled[s]).unwrap();
                    }
                }
                let rows = state.to_vec2::<f64>().unwrap();
                for s in 0..n {
                    let expected = match decisions[s] {
                        Decision::Continue => DECISION_CONTINUE,
                        Decision::Accept => DECISION_ACCEPT,
                        Decision::Escalate { .. } => DECISION_ESCALATE,
                    };
                    assert_eq!(
                        rows[s][2], expected,
                        "{estimator:?} {unit:?} seq {s}: {:?}",
                        rows[s]
                    );
                    assert_eq!(rows[s][1], monitors[s].num_steps() as f64);
                }
            }
        }
    }
}
