//! Tensor parallelism's math on CPU, before any GPU runs it: the tiny Qwen2 model's forward
//! pass written out in plain tensor ops, once whole and once split over `tp` ranks the way
//! `ARCHITECTURE.md` ("Tensor parallelism") lays it out (vocabulary-parallel embedding and LM
//! head, column-parallel Q/K/V and gate/up by whole heads and slices of the MLP, row-parallel
//! output and down projections, one all-reduce after each), with the all-reduce as a sum of the
//! ranks' partial results. TP = 1 must give the loaded model's logits; TP = 2 must give TP = 1's.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, IndexOp, Tensor, D};
use triage_models::config::{Architecture, ModelConfig};
use triage_models::fixtures::{tiny_weights, write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::paged_kv_cache::PagedSequence;
use triage_models::transformer::LoadOptions;
use triage_testkit::max_abs_diff;

type Weights = std::collections::HashMap<String, Tensor>;

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    let mean_square = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    let x = x
        .broadcast_div(&(mean_square + eps).unwrap().sqrt().unwrap())
        .unwrap();
    x.broadcast_mul(w).unwrap()
}

/// `x @ w[rows]ᵀ (+ b[rows])`: the rows `rows` of a `[out, in]` weight (a column-parallel shard).
fn linear_rows(x: &Tensor, w: &Tensor, b: Option<&Tensor>, rows: (usize, usize)) -> Tensor {
    let w = w.narrow(0, rows.0, rows.1).unwrap();
    let y = x.matmul(&w.t().unwrap()).unwrap();
    match b {
        Some(b) => y
            .broadcast_add(&b.narrow(0, rows.0, rows.1).unwrap())
            .unwrap(),
        None => y,
    }
}

/// `x @ w[:, cols]ᵀ`, `x` holding only those input columns (a row-parallel shard).
fn linear_cols(x: &Tensor, w: &Tensor, cols: (usize, usize)) -> Tensor {
    let w = w.narrow(1, cols.0, cols.1).unwrap();
    x.matmul(&w.t().unwrap()).unwrap()
}

/// NeoX (rotate-half) rope over `[heads, n, d]` at positions 0..n.
fn rope(x: &Tensor, theta: f32) -> Tensor {
    let (_, n, d) = x.dims3().unwrap();
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f32 / d as f32))
        .collect();
    let angles: Vec<f32> = (0..n)
        .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
        .collect();
    let angles = Tensor::from_vec(angles, (n, d / 2), &Device::Cpu).unwrap();
    let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    let (x1, x2) = (
        x.narrow(2, 0, d / 2).unwrap(),
        x.narrow(2, d / 2, d / 2).unwrap(),
    );
    let r1 = (x1.broadcast_mul(&cos).unwrap() - x2.broadcast_mul(&sin).unwrap()).unwrap();
    let r2 = (x2.broadcast_mul(&cos).unwrap() + x1.broadcast_mul(&sin).unwrap()).unwrap();
    Tensor::cat(&[r1, r2], 2).unwrap()
}

/// Causal attention of rank `r`'s heads: `[n, heads_r * d]`.
fn attention_shard(
    x: &Tensor,
    w: &Weights,
    l: usize,
    cfg: &ModelConfig,
    tp: usize,
    r: usize,
) -> Tensor {
    let (n, d) = (x.dim(0).unwrap(), cfg.head_dim);
    let (heads, kv_heads) = (cfg.num_heads / tp, cfg.num_kv_heads / tp);
    let p = format!("blk.{l}");
    let get = |name: &str| w.get(&format!("{p}.{name}"));
    let proj = |name: &str, per_rank: usize| {
        let rows = (r * per_rank * d, per_rank * d);
        let y = linear_rows(
            x,
            get(&format!("{name}.weight")).unwrap(),
            get(&format!("{name}.bias")),
            rows,
        );
        y.reshape((n, per_rank, d))
            .unwrap()
            .transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
    };
    let q = rope(&proj("attn_q", heads), cfg.rope_theta);
    let k = rope(&proj("attn_k", kv_heads), cfg.rope_theta);
    let v = proj("attn_v", kv_heads);
    let group = cfg.num_heads / cfg.num_kv_heads;
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| (0..n).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    let mask = Tensor::from_vec(mask, (n, n), &Device::Cpu).unwrap();
    let outs: Vec<Tensor> = (0..heads)
        .map(|h| {
            // A rank's query heads share its own KV heads: whole groups never straddle ranks.
            let (qh, kv) = (q.i(h).unwrap(), h / group);
            let scores = (qh.matmul(&k.i(kv).unwrap().t().unwrap()).unwrap() / (d as f64).sqrt())
                .unwrap()
                .broadcast_add(&mask)
                .unwrap();
            let probs = candle_nn::ops::softmax_last_dim(&scores).unwrap();
            probs.matmul(&v.i(kv).unwrap()).unwrap()
        })
        .collect();
    Tensor::cat(&outs, 1).unwrap()
}

/// Logits of `tokens` (`[n, vocab]`) with the model split over `tp` ranks.
fn forward(w: &Weights, cfg: &ModelConfig, tokens: &[u32], tp: usize) -> Tensor {
    let ids = Tensor::new(tokens, &Device::Cpu).unwrap();
    let embd = &w["token_embd.weight"];
    // Vocabulary-parallel: rank r holds rows [r·⌈V/tp⌉, (r+1)·⌈V/tp⌉) of the embedding and LM
    // head, the last rank fewer (a real vocabulary is padded to a multiple of tp instead).
    let per_rank = cfg.vocab_size.div_ceil(tp);
    let vocab_rows = |r: usize| {
        let start = (r * per_rank).min(cfg.vocab_size);
        (start, ((r + 1) * per_rank).min(cfg.vocab_size) - start)
    };
    // Vocabulary-parallel embedding: each rank looks up the ids in its rows, zero elsewhere.
    let all_reduce =
        |parts: Vec<Tensor>| parts.into_iter().reduce(|a, b| (a + b).unwrap()).unwrap();
    let mut x = all_reduce(
        (0..tp)
            .map(|r| {
                let (start, len) = vocab_rows(r);
                let rows = embd.narrow(0, start, len).unwrap();
                let (local, mask): (Vec<u32>, Vec<f32>) = tokens
                    .iter()
                    .map(|&t| {
                        let t = t as usize;
                        if (start..start + len).contains(&t) {
                            ((t - start) as u32, 1.0)
                        } else {
                            (0, 0.0)
                        }
                    })
                    .unzip();
                let local = Tensor::new(local, &Device::Cpu).unwrap();
                let mask = Tensor::new(mask, &Device::Cpu)
                    .unwrap()
                    .unsqueeze(1)
                    .unwrap();
                rows.index_select(&local, 0)
                    .unwrap()
                    .broadcast_mul(&mask)
                    .unwrap()
            })
            .collect(),
    );
    assert_eq!(x.dims(), [ids.dim(0).unwrap(), cfg.hidden_size]);
    let d = cfg.head_dim;
    let inter = cfg.intermediate_size / tp;
    for l in 0..cfg.num_layers {
        let p = format!("blk.{l}");
        let h = rms_norm(&x, &w[&format!("{p}.attn_norm.weight")], cfg.rms_norm_eps);
        let heads = cfg.num_heads / tp;
        let attn = all_reduce(
            (0..tp)
                .map(|r| {
                    let a = attention_shard(&h, w, l, cfg, tp, r);
                    linear_cols(
                        &a,
                        &w[&format!("{p}.attn_output.weight")],
                        (r * heads * d, heads * d),
                    )
                })
                .collect(),
        );
        x = (x + attn).unwrap();
        let h = rms_norm(&x, &w[&format!("{p}.ffn_norm.weight")], cfg.rms_norm_eps);
        let mlp = all_reduce(
            (0..tp)
                .map(|r| {
                    let rows = (r * inter, inter);
                    let gate = linear_rows(&h, &w[&format!("{p}.ffn_gate.weight")], None, rows);
                    let up = linear_rows(&h, &w[&format!("{p}.ffn_up.weight")], None, rows);
                    let act = (candle_nn::ops::silu(&gate).unwrap() * up).unwrap();
                    linear_cols(&act, &w[&format!("{p}.ffn_down.weight")], rows)
                })
                .collect(),
        );
        x = (x + mlp).unwrap();
    }
    let x = rms_norm(&x, &w["output_norm.weight"], cfg.rms_norm_eps);
    let head = w.get("output.weight").unwrap_or(embd);
    // Vocabulary-parallel LM head: each rank's logits for its rows, gathered in rank order.
    let parts: Vec<Tensor> = (0..tp)
        .map(|r| linear_rows(&x, head, None, vocab_rows(r)))
        .collect();
    Tensor::cat(&parts, 1).unwrap()
}

#[test]
fn tensor_parallel_math_gives_the_models_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let spec = TinySpec::new(Architecture::Qwen2);
    write_tiny_gguf(&path, &spec, GgmlDType::F32).unwrap();
    let model = Model::load("tiny", &path, &LoadOptions::default()).unwrap();
    let cfg = model.transformer.config().clone();
    // Heads split whole, KV groups too; the vocabulary (261) splits unevenly, as real ones may.
    assert!(cfg.num_kv_heads.is_multiple_of(2) && cfg.intermediate_size.is_multiple_of(2));
    assert!(cfg.qkv_bias);
    assert!(!cfg.vocab_size.is_multiple_of(2));
    let weights: Weights = tiny_weights(&spec).unwrap().into_iter().collect();
    // Random token ids over the whole vocabulary, so both halves of the embedding are read.
    let mut state = 0x5eed_u64;
    let tokens: Vec<u32> = (0..24)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % cfg.vocab_size as u64) as u32
        })
        .collect();
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let rows: Vec<usize> = (0..tokens.len()).collect();
    let mut cache =
        PagedSequence::new(&cfg, tokens.len(), DType::F32, model.transformer.device()).unwrap();
    let engine = model
        .transformer
        .forward(&tokens, &positions, &rows, &mut cache)
        .unwrap();

    let whole = forward(&weights, &cfg, &tokens, 1);
    let split = forward(&weights, &cfg, &tokens, 2);
    assert_eq!(whole.dims(), engine.dims());
    let scale = whole
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(scale > 1.0, "logits of a real spread, not zeros: {scale}");
    // The written-out math is the model's (the engine's kernels reorder sums; 4e-5 measured).
    let engine_diff = max_abs_diff(&whole, &engine);
    assert!(
        engine_diff < 1e-4 * scale,
        "TP=1 vs the engine: {engine_diff} (scale {scale})"
    );
    // Splitting changes only the order of the sums the all-reduce adds: f32 rounding (2e-5
    // measured; scaling the residual by 1.0001 on two ranks gives 2e-3).
    let tp_diff = max_abs_diff(&split, &whole);
    assert!(
        tp_diff < 1e-5 * scale,
        "TP=2 vs TP=1: {tp_diff} (scale {scale})"
    );
    assert_eq!(
        split.argmax(1).unwrap().to_vec1::<u32>().unwrap(),
        whole.argmax(1).unwrap().to_vec1::<u32>().unwrap()
    );
}
