//! Tiny random-weight models through the real loaders: formats agree, incremental decode equals
//! a full forward pass, and corrupt files are errors.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Tensor};
use rand::{Rng, SeedableRng};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, write_tiny_safetensors, TinySpec, TINY_VOCAB};
use triage_models::model::{load_weights, Model};
use triage_models::paged_kv_cache::PagedSequence;
use triage_models::transformer::{LoadOptions, Transformer};
use triage_testkit::max_abs_diff;

const ARCHS: [Architecture; 3] = [
    Architecture::Qwen2,
    Architecture::Qwen3,
    Architecture::Llama,
];

fn max_abs(a: &Tensor) -> f32 {
    a.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// The rows' argmax agrees on at least 90 % of them.
fn assert_argmax_mostly_agrees(a: &Tensor, b: &Tensor) {
    let top_a = a.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    let top_b = b.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    let agree = top_a.iter().zip(&top_b).filter(|(x, y)| x == y).count();
    assert!(
        agree * 10 >= top_a.len() * 9,
        "argmax agrees on {agree}/{}",
        top_a.len()
    );
}

/// One sequence through the paged cache, with room for the tiny model's whole context.
fn sequence(model: &Transformer, dtype: DType) -> PagedSequence {
    PagedSequence::new(model.config(), 512, dtype, model.device()).unwrap()
}

fn all_logits(model: &Transformer, tokens: &[u32]) -> Tensor {
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let rows: Vec<usize> = (0..tokens.len()).collect();
    let mut cache = sequence(model, DType::F16);
    model
        .forward(tokens, &positions, &rows, &mut cache)
        .unwrap()
}

fn prompt(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.random_range(0..TINY_VOCAB as u32))
        .collect()
}

#[test]
fn gguf_f32_and_safetensors_give_the_same_logits() {
    // The Llama GGUF has llama.cpp's permuted Q/K rows and interleaved rope; the safetensors
    // folder has HF's layout and rotate-half rope: equal logits prove both paths right.
    for arch in ARCHS {
        let dir = tempfile::tempdir().unwrap();
        let spec = TinySpec::new(arch);
        let gguf = dir.path().join("m.gguf");
        write_tiny_gguf(&gguf, &spec, GgmlDType::F32).unwrap();
        write_tiny_safetensors(&dir.path().join("hf"), &spec, DType::F32).unwrap();
        let a = load_weights(&gguf, &LoadOptions::default())
            .unwrap()
            .transformer;
        let b = load_weights(&dir.path().join("hf"), &LoadOptions::default())
            .unwrap()
            .transformer;
        assert_eq!(
            a.config().rope_style != b.config().rope_style,
            arch == Architecture::Llama
        );
        let tokens = prompt(40, 1);
        let diff = max_abs_diff(&all_logits(&a, &tokens), &all_logits(&b, &tokens));
        assert!(diff < 1e-3, "{arch:?}: max abs diff {diff}");
    }
}

/// Logits of `tokens` at positions from `start` (where rope scaling changes the result).
fn logits_from(model: &Transformer, tokens: &[u32], start: u32) -> Tensor {
    let positions: Vec<u32> = (start..start + tokens.len() as u32).collect();
    let rows: Vec<usize> = (0..tokens.len()).collect();
    let mut cache = sequence(model, DType::F32);
    model
        .forward(tokens, &positions, &rows, &mut cache)
        .unwrap()
}

/// Llama 3's rope scaling as llama.cpp stores it (a `rope_freqs.weight` tensor of per-frequency
/// factors in the GGUF file) gives the logits of HF's `rope_scaling` of type `llama3`, and
/// differs from no scaling at all.
#[test]
fn gguf_rope_freqs_equal_hf_llama3_scaling() {
    use candle_core::quantized::{gguf_file, QTensor};
    use triage_models::config::RopeScaling;
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec::new(Architecture::Llama);
    let (plain, gguf, hf) = (
        dir.path().join("plain.gguf"),
        dir.path().join("scaled.gguf"),
        dir.path().join("hf"),
    );
    write_tiny_gguf(&plain, &spec, GgmlDType::F32).unwrap();
    write_tiny_safetensors(&hf, &spec, DType::F32).unwrap();
    // A scaling that bites at this tiny head (16 dims, θ = 10000, positions ~300).
    let scaling = serde_json::json!({
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64
    });
    let config_path = hf.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["rope_scaling"] = scaling;
    std::fs::write(&config_path, config.to_string()).unwrap();
    let hf_model = load_weights(&hf, &LoadOptions::default())
        .unwrap()
        .transformer;
    let head_dim = hf_model.config().head_dim;
    let mut scaled: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / head_dim as f32))
        .collect();
    let unscaled = scaled.clone();
    hf_model.config().rope_scaling.apply(&mut scaled).unwrap();
    let factors: Vec<f32> = unscaled.iter().zip(&scaled).map(|(u, s)| u / s).collect();
    assert!(
        factors.iter().any(|&f| f > 1.5),
        "the scaling changes nothing: {factors:?}"
    );
    // The plain GGUF again, with the factors added as llama.cpp's converter adds them.
    let mut file = std::fs::File::open(&plain).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| {
            (
                n.clone(),
                content
                    .tensor(&mut file, n, &candle_core::Device::Cpu)
                    .unwrap(),
            )
        })
        .collect();
    let freqs = Tensor::new(factors.as_slice(), &candle_core::Device::Cpu).unwrap();
    tensors.push((
        "rope_freqs.weight".into(),
        QTensor::quantize(&freqs, GgmlDType::F32).unwrap(),
    ));
    let md: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(&gguf).unwrap();
    gguf_file::write(&mut out, &md, &ts).unwrap();
    drop(out);
    let gguf_model = load_weights(&gguf, &LoadOptions::default())
        .unwrap()
        .transformer;
    assert_eq!(
        gguf_model.config().rope_scaling,
        RopeScaling::FreqFactors(factors)
    );
    let plain_model = load_weights(&plain, &LoadOptions::default())
        .unwrap()
        .transformer;
    let tokens = prompt(16, 5);
    let want = logits_from(&hf_model, &tokens, 300);
    let diff = max_abs_diff(&logits_from(&gguf_model, &tokens, 300), &want);
    assert!(
        diff < 1e-3,
        "rope_freqs against llama3 scaling: max abs diff {diff}"
    );
    let off = max_abs_diff(&logits_from(&plain_model, &tokens, 300), &want);
    assert!(off > 1e-2, "without rope_freqs the logits moved only {off}");
}

#[test]
fn incremental_decode_equals_full_forward() {
    // Same arithmetic on both sides (dense f32, or the batch-invariant Q8_0 and Q4_K int8
    // products for every row), so any difference is the cache or the positions going wrong.
    let quant_only = LoadOptions {
        dense_prefill: false,
        ..Default::default()
    };
    for arch in ARCHS {
        // K-quants need rows of 256 values: a wider tiny model (its Q, K, V and gate, up stack
        // into packed tiles; the LM head's rows end in a padded tile).
        let wide = TinySpec {
            hidden_size: 256,
            intermediate_size: 512,
            ..TinySpec::new(arch)
        };
        for (dtype, opts, spec) in [
            (GgmlDType::F32, LoadOptions::default(), TinySpec::new(arch)),
            (GgmlDType::Q8_0, quant_only.clone(), TinySpec::new(arch)),
            (GgmlDType::Q4K, quant_only.clone(), wide.clone()),
            (GgmlDType::Q6K, quant_only.clone(), wide),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("m.gguf");
            write_tiny_gguf(&path, &spec, dtype).unwrap();
            let model = load_weights(&path, &opts).unwrap().transformer;
            let tokens = prompt(300, 2); // crosses the 256-row attention chunk
            let full = all_logits(&model, &tokens);
            let mut cache = sequence(&model, DType::F16);
            let split = 290;
            let pos: Vec<u32> = (0..split as u32).collect();
            let first = model
                .forward(&tokens[..split], &pos, &[split - 1], &mut cache)
                .unwrap();
            let mut rows = vec![first];
            for (i, &t) in tokens.iter().enumerate().skip(split) {
                rows.push(model.forward(&[t], &[i as u32], &[0], &mut cache).unwrap());
            }
            let stepped = Tensor::cat(&rows, 0).unwrap();
            let reference = full.narrow(0, split - 1, tokens.len() - split + 1).unwrap();
            let diff = max_abs_diff(&stepped, &reference);
            assert!(diff < 1e-3, "{arch:?} {dtype:?}: max abs diff {diff}");
        }
    }
}

#[test]
fn dense_prefill_copy_matches_quantized_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), GgmlDType::Q8_0).unwrap();
    let with_copies = LoadOptions {
        dense_prefill: true,
        ..Default::default()
    };
    let dense = load_weights(&path, &with_copies).unwrap().transformer;
    let quant = load_weights(&path, &LoadOptions::default())
        .unwrap()
        .transformer;
    let tokens = prompt(24, 3);
    let (a, b) = (all_logits(&dense, &tokens), all_logits(&quant, &tokens));
    let diff = max_abs_diff(&a, &b);
    let scale = max_abs(&a);
    // Only activation quantization differs (Q8_0 mat-vec quantizes its input rows): a few per cent
    // on this random, badly conditioned network; a wrong layout would be off by the full scale.
    assert!(
        diff < 0.06 * scale,
        "max abs diff {diff} at logit scale {scale}"
    );
    assert_argmax_mostly_agrees(&a, &b);
}

/// The GPU layout (dense matrices in bf16, activations cast at each product, residual stream
/// in f32) tracks the f32 layout on the same bf16 weights: only the activations' rounding
/// differs.
#[test]
fn bf16_dense_layout_tracks_f32() {
    for arch in ARCHS {
        bf16_dense_layout_tracks_f32_for(arch);
    }
}

fn bf16_dense_layout_tracks_f32_for(arch: Architecture) {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    write_tiny_safetensors(&hf, &TinySpec::new(arch), DType::BF16).unwrap();
    let f32_layout = load_weights(&hf, &LoadOptions::default())
        .unwrap()
        .transformer;
    let gpu_layout = LoadOptions {
        dense_prefill: false,
        dense_dtype: DType::BF16,
        ..Default::default()
    };
    let bf16 = load_weights(&hf, &gpu_layout).unwrap().transformer;
    let tokens = prompt(24, 4);
    let (a, b) = (all_logits(&f32_layout, &tokens), all_logits(&bf16, &tokens));
    assert_eq!(b.dtype(), DType::F32);
    let (diff, scale) = (max_abs_diff(&a, &b), max_abs(&a));
    // bf16 keeps 8 mantissa bits (relative rounding 2^-9 per product input); through two layers
    // of this random network that stays within a few per cent of the logit scale.
    assert!(
        diff < 0.05 * scale,
        "{arch:?}: max abs diff {diff} at logit scale {scale}"
    );
    assert!(diff > 0.0, "the bf16 layout ran in f32");
    assert_argmax_mostly_agrees(&a, &b);
    // It runs fused (stacked GEMMs, norms with the residual add, silu_mul), and token by token
    // through the cache it gives its own full pass's logits to bf16 rounding, with the hidden
    // states of its layers beside them.
    assert_eq!(
        (f32_layout.activations(), bf16.activations()),
        (None, Some(DType::BF16))
    );
    let mut cache = sequence(&bf16, DType::BF16);
    let mut stepped = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        let (logits, hidden) = bf16
            .forward_with_hidden(&[t], &[i as u32], &[0], &[0, 1], &mut cache)
            .unwrap();
        assert_eq!(hidden.len(), 2);
        assert_eq!(hidden[1].dims(), [1, bf16.config().hidden_size]);
        stepped.push(logits);
    }
    let stepped = Tensor::cat(&stepped, 0).unwrap();
    let step_diff = max_abs_diff(&stepped, &b);
    assert!(
        step_diff < 0.02 * scale,
        "{arch:?}: stepped vs full: {step_diff} at scale {scale}"
    );
    assert_argmax_mostly_agrees(&stepped, &b);
}

#[test]
fn loads_tokenizer_and_chat_template_from_both_formats() {
    for arch in ARCHS {
        let dir = tempfile::tempdir().unwrap();
        let spec = TinySpec::new(arch);
        write_tiny_gguf(&dir.path().join("m.gguf"), &spec, GgmlDType::Q8_0).unwrap();
        write_tiny_safetensors(&dir.path().join("hf"), &spec, DType::BF16).unwrap();
        for path in [dir.path().join("m.gguf"), dir.path().join("hf")] {
            let model = Model::load("tiny", &path, &LoadOptions::default()).unwrap();
            let ids = model.tokenizer.encode("the heat", false, false).unwrap();
            assert_eq!(model.tokenizer.decode(&ids, false).unwrap(), "the heat");
            assert!(ids.len() < "the heat".len(), "merges apply: {ids:?}");
            let messages = [triage_models::chat_template::ChatMessage::user("hi")];
            let text = model.chat_template.render(&messages, true).unwrap();
            assert_eq!(
                text,
                "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
            );
            assert!(model.tokenizer.is_eos(triage_models::fixtures::TINY_IM_END));
        }
    }
}

#[test]
fn truncated_gguf_is_an_error_at_every_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), GgmlDType::Q8_0).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(50);
    let mut offsets: Vec<usize> = (0..46).map(|_| rng.random_range(0..bytes.len())).collect();
    offsets.extend([0, 3, 8, bytes.len() - 1]); // empty, mid-magic, header only, one byte short
    let cut = dir.path().join("cut.gguf");
    for offset in offsets {
        std::fs::write(&cut, &bytes[..offset]).unwrap();
        let result = Model::load("cut", &cut, &LoadOptions::default());
        assert!(
            result.is_err(),
            "truncated at {offset} of {} loaded",
            bytes.len()
        );
    }
    assert!(Model::load(
        "missing",
        &dir.path().join("nope.gguf"),
        &LoadOptions::default()
    )
    .is_err());
}

#[test]
fn unknown_architecture_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec::new(Architecture::Qwen2);
    write_tiny_safetensors(&dir.path().join("hf"), &spec, DType::F32).unwrap();
    let config = dir.path().join("hf/config.json");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("qwen2", "mamba");
    std::fs::write(&config, text).unwrap();
    let err = Model::load("x", &dir.path().join("hf"), &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("mamba"), "{err}");
}

mod paged {
    use super::*;
    use triage_models::paged_kv_cache::{PagedKvCache, PagedStep, SeqStep};

    fn model(arch: Architecture) -> (tempfile::TempDir, Transformer) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        write_tiny_gguf(&path, &TinySpec::new(arch), GgmlDType::F32).unwrap();
        let t = load_weights(&path, &LoadOptions::default())
            .unwrap()
            .transformer;
        (dir, t)
    }

    /// Run sequences through one paged step and return each sampling row's logits.
    fn step(model: &Transformer, cache: &PagedKvCache, seqs: &[(SeqStep, &[u32])]) -> Tensor {
        let steps: Vec<SeqStep> = seqs.iter().map(|(s, _)| s.clone()).collect();
        let mut backend = PagedStep::new(cache, &steps).unwrap();
        let ids: Vec<u32> = seqs
            .iter()
            .flat_map(|(s, t)| {
                t[s.num_computed_tokens..s.num_computed_tokens + s.num_new_tokens].to_vec()
            })
            .collect();
        let mut rows = Vec::new();
        let mut end = 0;
        for (s, _) in seqs {
            end += s.num_new_tokens;
            rows.push(end - 1);
        }
        let positions = backend.positions();
        model
            .forward(&ids, &positions, &rows, &mut backend)
            .unwrap()
    }

    #[test]
    fn batched_with_interleaved_blocks_equals_each_sequence_alone() {
        for arch in ARCHS {
            let (_dir, model) = model(arch);
            let cfg = model.config().clone();
            let seqs: Vec<Vec<u32>> = vec![prompt(21, 10), prompt(7, 11), prompt(33, 12)];
            // Reference: each sequence alone in blocks of its own, last-row logits after
            // a prefill of all but the last 2 tokens, then 2 single-token decodes.
            let reference: Vec<Vec<Tensor>> = seqs
                .iter()
                .map(|t| {
                    let mut cache = sequence(&model, DType::F32);
                    let n = t.len() - 2;
                    let pos: Vec<u32> = (0..n as u32).collect();
                    let mut out = vec![model.forward(&t[..n], &pos, &[n - 1], &mut cache).unwrap()];
                    for i in n..t.len() {
                        out.push(
                            model
                                .forward(&t[i..=i], &[i as u32], &[0], &mut cache)
                                .unwrap(),
                        );
                    }
                    out
                })
                .collect();
            // All three sequences batched, blocks interleaved, unused slots NaN. Both caches hold
            // f32: rounding to f16 would turn the dense matmul's batch-dependent last bits
            // into f16 steps, which this test is not about.
            let cache =
                PagedKvCache::new(&cfg, 40, 4, f32::NAN, DType::F32, &candle_core::Device::Cpu)
                    .unwrap();
            let tables: Vec<Vec<u32>> = (0..3u32)
                .map(|s| (0..9u32).map(|b| 1 + b * 3 + s).collect())
                .collect();
            #[allow(clippy::needless_range_loop)] // phase indexes both the plan and the reference
            for phase in 0..3 {
                let batch: Vec<(SeqStep, &[u32])> = seqs
                    .iter()
                    .zip(&tables)
                    .map(|(t, table)| {
                        let n = t.len() - 2;
                        let (done, new) = if phase == 0 {
                            (0, n)
                        } else {
                            (n + phase - 1, 1)
                        };
                        (
                            SeqStep {
                                block_table: table.clone(),
                                num_computed_tokens: done,
                                num_new_tokens: new,
                            },
                            t.as_slice(),
                        )
                    })
                    .collect();
                let logits = step(&model, &cache, &batch);
                for s in 0..3 {
                    let diff = max_abs_diff(
                        &logits.get(s).unwrap().unsqueeze(0).unwrap(),
                        &reference[s][phase],
                    );
                    assert!(
                        diff < 1e-3,
                        "{arch:?} seq {s} phase {phase}: max abs diff {diff}"
                    );
                }
            }
        }
    }
}

#[test]
fn hidden_states_come_from_the_same_pass_and_do_not_depend_on_the_other_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), GgmlDType::F32).unwrap();
    let model = load_weights(&path, &LoadOptions::default())
        .unwrap()
        .transformer;
    let layers = model.config().num_layers;
    let tokens = prompt(24, 5);
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let run = |rows: &[usize], hidden: &[usize]| {
        let mut cache = sequence(&model, DType::F16);
        model
            .forward_with_hidden(&tokens, &positions, rows, hidden, &mut cache)
            .unwrap()
    };
    // Asking for hidden states leaves the logits as they are, bit for bit.
    let mut cache = sequence(&model, DType::F16);
    let plain = model
        .forward(&tokens, &positions, &[23], &mut cache)
        .unwrap();
    let (logits, hidden) = run(&[23], &[layers - 1, 0]);
    assert_eq!(max_abs_diff(&plain, &logits), 0.0);
    assert_eq!(hidden.len(), 2);
    let width = model.config().hidden_size;
    assert_eq!(hidden[0].dims(), &[1, width]);
    // The last prompt token's state is the same asked alone or among every row, and the
    // layers asked are distinct (in the order asked).
    let (_, all) = run(&(0..24).collect::<Vec<_>>(), &[layers - 1, 0]);
    for (one, every) in hidden.iter().zip(&all) {
        assert_eq!(max_abs_diff(one, &every.narrow(0, 23, 1).unwrap()), 0.0);
    }
    assert!(max_abs_diff(&hidden[0], &hidden[1]) > 1e-3);
    assert!(max_abs(&hidden[0]) > 0.0);
    // A layer the model does not have is an error, not a panic.
    let mut cache = sequence(&model, DType::F16);
    let err = model
        .forward_with_hidden(&tokens, &positions, &[23], &[layers], &mut cache)
        .unwrap_err();
    assert!(err.to_string().contains("layers"), "{err}");
}
