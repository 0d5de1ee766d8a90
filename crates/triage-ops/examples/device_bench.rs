//! The device check's kernel microbenchmarks, ratios measured in one run: the fused logits
//! reduction against the device-to-device copy bandwidth and against candle's unfused chain,
//! paged-attention decode against the bytes of KV it must read, and prefill attention (the
//! tensor-core kernel) in causal TFLOP/s against the row kernel prefill ran before. Prints one
//! JSON object per case, then a table.
//!
//!   device_bench --device cuda            # the H200 sizes
//!   device_bench --device cpu --quick     # the dry run: small sizes, same code
//!   device_bench --device cuda --reduction-only   # one case, for a profiler (ncu)
//!
//! Times are means over back-to-back calls after a warm-up, with one `Device::synchronize` at
//! each end: on the first H200 run a synchronisation per call made a 19 MB copy look like
//! 266 GB/s, a sixteenth of the device's copy bandwidth. The bandwidth the ratios use is a copy
//! of 512 MiB (4 MiB in the quick run), large enough that launch costs vanish.

use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};
use triage_ops::logits_reduce_packed;
use triage_ops::{
    paged_attention_planned, paged_attention_rows, PagedAttentionMetadata, PagedAttentionPlan,
};

/// The Qwen2.5 1.5B attention shape (12 query heads over 2 KV heads of 128).
const HEADS: usize = 12;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 128;
const BLOCK_SIZE: usize = 16;
const VOCAB: usize = 151_936;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    device: Device,
    quick: bool,
    reduction_only: bool,
}

fn args() -> Result<Args> {
    let mut device = Device::Cpu;
    let mut quick = false;
    let mut reduction_only = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--device" => {
                device = match it.next().as_deref() {
                    Some("cpu") => Device::Cpu,
                    Some("cuda") => triage_ops::cuda::open_device(0)?,
                    other => return Err(format!("--device cpu|cuda, got {other:?}").into()),
                }
            }
            "--quick" => quick = true,
            "--reduction-only" => reduction_only = true,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(Args {
        device,
        quick,
        reduction_only,
    })
}

/// Mean seconds of `runs` back-to-back calls of `f`, after two warm-up calls.
fn time(device: &Device, runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..2 {
        f()?;
    }
    device.synchronize()?;
    let start = Instant::now();
    for _ in 0..runs {
        f()?;
    }
    device.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / runs as f64)
}

/// Device-to-device copy bandwidth (bytes read plus written per second) on a large buffer.
fn copy_bandwidth_gbps(a: &Args, runs: usize) -> Result<f64> {
    let elems = if a.quick { 1 << 21 } else { 1 << 28 }; // bf16: 4 MiB or 512 MiB
    let src = Tensor::zeros(elems, DType::BF16, &a.device)?;
    let secs = time(&a.device, runs, || {
        src.copy()?;
        Ok(())
    })?;
    Ok(2.0 * (elems * 2) as f64 / secs / 1e9)
}

/// Entropy the unfused way: softmax, log, multiply, sum, plus the max and argmax passes.
fn unfused_chain(logits: &Tensor) -> Result<Tensor> {
    let x = logits.to_dtype(DType::F32)?;
    let p = candle_nn::ops::softmax_last_dim(&x)?;
    let entropy = (p.log()? * &p)?.sum_keepdim(D::Minus1)?.neg()?;
    let max = x.max_keepdim(D::Minus1)?;
    let argmax = x.argmax_keepdim(D::Minus1)?.to_dtype(DType::F32)?;
    Ok(Tensor::cat(&[entropy, max, argmax], 1)?)
}

fn reduction(a: &Args, runs: usize, copy_gbps: f64) -> Result<serde_json::Value> {
    let rows = if a.quick { 4 } else { 64 };
    let dtype = DType::BF16;
    let logits = Tensor::randn(0f32, 3.0, (rows, VOCAB), &a.device)?.to_dtype(dtype)?;
    let bytes = (rows * VOCAB * dtype.size_in_bytes()) as f64;
    let copy = time(&a.device, runs, || {
        logits.copy()?;
        Ok(())
    })?;
    let fused = time(&a.device, runs, || {
        logits_reduce_packed(&logits, 20)?;
        Ok(())
    })?;
    let unfused = time(&a.device, runs, || {
        unfused_chain(&logits)?;
        Ok(())
    })?;
    // A copy reads and writes every byte; the reduction only reads them.
    let same_size_copy_gbps = 2.0 * bytes / copy / 1e9;
    let fused_gbps = bytes / fused / 1e9;
    Ok(serde_json::json!({
        "case": format!("logits_reduce [{rows}, {VOCAB}] bf16, k=20"),
        "fused_ms": fused * 1e3,
        "unfused_ms": unfused * 1e3,
        "copy_ms": copy * 1e3,
        "fused_gbps": fused_gbps,
        "copy_gbps": copy_gbps,
        "same_size_copy_gbps": same_size_copy_gbps,
        "fraction_of_copy_bandwidth": fused_gbps / copy_gbps,
        "speedup_over_unfused": unfused / fused,
    }))
}

fn decode_case(a: &Args, seq_len: usize, runs: usize, copy_gbps: f64) -> Result<serde_json::Value> {
    let num_seqs = 16;
    let dtype = if a.device.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    };
    let blocks_per_seq = seq_len.div_ceil(BLOCK_SIZE);
    let num_blocks = num_seqs * blocks_per_seq + 1;
    let shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM);
    let k = Tensor::randn(0f32, 1.0, shape, &a.device)?.to_dtype(dtype)?;
    let v = Tensor::randn(0f32, 1.0, shape, &a.device)?.to_dtype(dtype)?;
    let q = Tensor::randn(0f32, 1.0, (num_seqs, HEADS, HEAD_DIM), &a.device)?.to_dtype(dtype)?;
    let meta = PagedAttentionMetadata {
        block_size: BLOCK_SIZE,
        block_tables: (0..num_seqs)
            .map(|s| {
                (0..blocks_per_seq)
                    .map(|b| (1 + s * blocks_per_seq + b) as u32)
                    .collect()
            })
            .collect(),
        seq_lens: vec![seq_len; num_seqs],
        query_lens: vec![1; num_seqs],
    };
    let plan = PagedAttentionPlan::new(meta, num_blocks, &a.device)?;
    let secs = time(&a.device, runs, || {
        paged_attention_planned(&q, &k, &v, &plan)?;
        Ok(())
    })?;
    let kv_bytes = (2 * num_seqs * seq_len * KV_HEADS * HEAD_DIM * dtype.size_in_bytes()) as f64;
    let gbps = kv_bytes / secs / 1e9;
    Ok(serde_json::json!({
        "case": format!("paged_attention decode 16 x {seq_len} tokens {dtype:?}"),
        "ms": secs * 1e3,
        "kv_gbps": gbps,
        "fraction_of_copy_bandwidth": gbps / copy_gbps,
    }))
}

/// The attention shapes prefill is measured on: (name, query heads, KV heads, head dim).
const PREFILL_SHAPES: [(&str, usize, usize, usize); 2] =
    [("0.5B", 14, 2, 64), ("1.5B", 12, 2, 128)];

/// Causal prefill attention of one `n`-token sequence whose K/V are cached: the plan's kernel
/// (`prefill_attention` on a GPU, `flash_attention` on the CPU) in TFLOP/s (4 · head_dim FLOPs
/// per head and (query, key ≤ query) pair), and for `n` up to 8k the row kernel on the same
/// inputs, with the largest difference between the two.
fn prefill_case(
    a: &Args,
    (name, heads, kv_heads, head_dim): (&str, usize, usize, usize),
    n: usize,
    runs: usize,
) -> Result<serde_json::Value> {
    let dtype = if a.device.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    };
    let num_blocks = n.div_ceil(BLOCK_SIZE) + 1;
    let shape = (num_blocks, BLOCK_SIZE, kv_heads, head_dim);
    let k = Tensor::randn(0f32, 1.0, shape, &a.device)?.to_dtype(dtype)?;
    let v = Tensor::randn(0f32, 1.0, shape, &a.device)?.to_dtype(dtype)?;
    let q = Tensor::randn(0f32, 1.0, (n, heads, head_dim), &a.device)?.to_dtype(dtype)?;
    let meta = PagedAttentionMetadata {
        block_size: BLOCK_SIZE,
        block_tables: vec![(1..num_blocks as u32).collect()],
        seq_lens: vec![n],
        query_lens: vec![n],
    };
    let plan = PagedAttentionPlan::new(meta, num_blocks, &a.device)?;
    let secs = time(&a.device, runs, || {
        paged_attention_planned(&q, &k, &v, &plan)?;
        Ok(())
    })?;
    let flops = 4.0 * (head_dim * heads) as f64 * (n * (n + 1) / 2) as f64;
    let mut row = serde_json::json!({
        "case": format!("prefill attention {name} shape ({heads}/{kv_heads} heads, d {head_dim}) {n} tokens {dtype:?}"),
        "shape": name,
        "tokens": n,
        "ms": secs * 1e3,
        "tflops": flops / secs / 1e12,
    });
    if let (Some(rows), true) = (plan.device_rows(), n <= 8192) {
        let row_secs = time(&a.device, runs.min(3), || {
            paged_attention_rows(&q, &k, &v, rows)?;
            Ok(())
        })?;
        let fast = paged_attention_planned(&q, &k, &v, &plan)?;
        let slow = paged_attention_rows(&q, &k, &v, rows)?;
        let diff = (fast - slow)?.abs()?.flatten_all()?.max(D::Minus1)?;
        row["row_kernel_ms"] = (row_secs * 1e3).into();
        row["speedup_over_row_kernel"] = (row_secs / secs).into();
        row["max_abs_diff_vs_row_kernel"] = diff.to_scalar::<f32>()?.into();
    }
    Ok(row)
}

fn main() -> Result<()> {
    let a = args()?;
    let runs = if a.quick { 3 } else { 20 };
    let copy_gbps = copy_bandwidth_gbps(&a, runs)?;
    let reduce = reduction(&a, runs, copy_gbps)?;
    println!("{reduce}");
    if a.reduction_only {
        return Ok(());
    }
    let lens: &[usize] = if a.quick {
        &[1024]
    } else {
        &[1024, 8192, 32768]
    };
    let mut rows = vec![reduce];
    for &len in lens {
        let row = decode_case(&a, len, runs, copy_gbps)?;
        println!("{row}");
        rows.push(row);
    }
    let prefill_lens: &[usize] = if a.quick { &[64] } else { &[2048, 8192, 32768] };
    let mut prefill_rows = Vec::new();
    for shape in PREFILL_SHAPES {
        for &n in prefill_lens {
            let row = prefill_case(&a, shape, n, runs)?;
            println!("{row}");
            prefill_rows.push(row);
        }
    }
    println!("\n| case | time (ms) | GB/s | of copy bandwidth | other |");
    println!("|---|---|---|---|---|");
    let r = &rows[0];
    println!(
        "| {} | {:.3} | {:.1} | {:.1} % | {:.1}x over unfused ({:.3} ms); copy {:.0} GB/s |",
        r["case"].as_str().unwrap_or(""),
        r["fused_ms"].as_f64().unwrap_or(f64::NAN),
        r["fused_gbps"].as_f64().unwrap_or(f64::NAN),
        100.0 * r["fraction_of_copy_bandwidth"].as_f64().unwrap_or(f64::NAN),
        r["speedup_over_unfused"].as_f64().unwrap_or(f64::NAN),
        r["unfused_ms"].as_f64().unwrap_or(f64::NAN),
        copy_gbps,
    );
    for r in &rows[1..] {
        println!(
            "| {} | {:.3} | {:.1} | {:.1} % | |",
            r["case"].as_str().unwrap_or(""),
            r["ms"].as_f64().unwrap_or(f64::NAN),
            r["kv_gbps"].as_f64().unwrap_or(f64::NAN),
            100.0 * r["fraction_of_copy_bandwidth"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!("\n| case | time (ms) | TFLOP/s | row kernel (ms) | speedup | max diff |");
    println!("|---|---|---|---|---|---|");
    for r in &prefill_rows {
        let f = |key: &str| r[key].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {} | {:.3} | {:.1} | {:.3} | {:.1}x | {:.2e} |",
            r["case"].as_str().unwrap_or(""),
            f("ms"),
            f("tflops"),
            f("row_kernel_ms"),
            f("speedup_over_row_kernel"),
            f("max_abs_diff_vs_row_kernel"),
        );
    }
    Ok(())
}
