//! CPU flash attention against its plain reference (`paged_attention_slow`: candle matrix products
//! per head over K/V gathered through the block table), at the 1.5B's heads (12 query heads over
//! 2 KV heads of 128): a decode step at 2k, 8k and 16k cached tokens and a 512-token prefill chunk
//! after 7,680, with f32 and f16 caches and each kernel this CPU runs. Prints reference/kernel per
//! case last.
//! `cargo bench -p triage-ops --bench ops_flash_attention` (`-- --quick` skips criterion's runs).

use std::hint::black_box;
use std::time::Instant;

use candle_core::{Device, Tensor};
use criterion::Criterion;
use half::f16;
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_ops::KernelChoice;
use triage_ops::{flash_attention_with, AttentionKernel, AttentionShape, KvRows, SeqKeys};
use triage_ops::{paged_attention_slow, PagedAttentionMetadata};

const SHAPE: AttentionShape = AttentionShape {
    num_heads: 12,
    kv_heads: 2,
    head_dim: 128,
};

struct Case {
    name: String,
    seq_len: usize,
    query_len: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    k16: Vec<f16>,
    v16: Vec<f16>,
    /// The reference's inputs: q `[n, heads, d]`, the cache as one block `[1, len, kv, d]` twice.
    reference: (Tensor, Tensor, Tensor),
}

fn case(seq_len: usize, query_len: usize) -> Case {
    let mut rng = StdRng::seed_from_u64(1);
    let mut random =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let (h, kv, d) = (SHAPE.num_heads, SHAPE.kv_heads, SHAPE.head_dim);
    let (q, k, v) = (
        random(query_len * h * d),
        random(seq_len * kv * d),
        random(seq_len * kv * d),
    );
    let cpu = &Device::Cpu;
    let tensor = |x: &[f32], shape: (usize, usize, usize)| {
        Tensor::from_vec(x.to_vec(), shape, cpu).expect("shape")
    };
    let reference = (
        tensor(&q, (query_len, h, d)),
        tensor(&k, (seq_len, kv, d)).reshape((1, seq_len, kv, d)),
        tensor(&v, (seq_len, kv, d)).reshape((1, seq_len, kv, d)),
    );
    let name = if query_len == 1 {
        format!("decode@{seq_len}")
    } else {
        format!("prefill{query_len}@{seq_len}")
    };
    Case {
        name,
        seq_len,
        query_len,
        k16: k.iter().map(|&x| f16::from_f32(x)).collect(),
        v16: v.iter().map(|&x| f16::from_f32(x)).collect(),
        q,
        k,
        v,
        reference: (
            reference.0,
            reference.1.expect("k"),
            reference.2.expect("v"),
        ),
    }
}

fn flash(case: &Case, kernel: AttentionKernel, half: bool) -> Vec<f32> {
    let table = [0u32];
    let seqs = [SeqKeys {
        block_table: &table,
        block_size: case.seq_len,
        seq_len: case.seq_len,
        query_len: case.query_len,
    }];
    let (k, v) = if half {
        (KvRows::F16(&case.k16), KvRows::F16(&case.v16))
    } else {
        (KvRows::F32(&case.k), KvRows::F32(&case.v))
    };
    flash_attention_with(kernel, black_box(&case.q), SHAPE, k, v, &seqs).expect("valid")
}

fn reference(case: &Case) -> Tensor {
    let (q, k, v) = &case.reference;
    let meta = PagedAttentionMetadata {
        block_size: case.seq_len,
        block_tables: vec![vec![0]],
        seq_lens: vec![case.seq_len],
        query_lens: vec![case.query_len],
    };
    paged_attention_slow(black_box(q), k, v, &meta).expect("valid")
}

/// Mean seconds per call over at least 3 calls and half a second, after one warm-up call.
fn seconds(f: &dyn Fn()) -> f64 {
    f();
    let (start, mut runs) = (Instant::now(), 0);
    while runs < 3 || start.elapsed().as_secs_f64() < 0.5 {
        f();
        runs += 1;
    }
    start.elapsed().as_secs_f64() / runs as f64
}

/// Every kernel this CPU runs, or only the one `TRIAGE_ATTENTION_KERNEL` names (the portable
/// loop takes minutes here on x86, where it has no vector FMA).
fn kernels() -> Vec<AttentionKernel> {
    match std::env::var("TRIAGE_ATTENTION_KERNEL") {
        Ok(_) => vec![AttentionKernel::best()],
        Err(_) => AttentionKernel::available().to_vec(),
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let cases = [
        case(2048, 1),
        case(8192, 1),
        case(16384, 1),
        case(8192, 512),
    ];
    let best = AttentionKernel::best();
    if !quick {
        let mut c = Criterion::default().configure_from_args();
        let mut group = c.benchmark_group("flash_attention_cpu");
        group.sample_size(10);
        for case in &cases {
            group.bench_function(format!("reference/{}", case.name), |b| {
                b.iter(|| reference(case))
            });
            group.bench_function(format!("flash_f32/{}", case.name), |b| {
                b.iter(|| flash(case, best, false))
            });
            group.bench_function(format!("flash_f16/{}", case.name), |b| {
                b.iter(|| flash(case, best, true))
            });
        }
        group.finish();
    }
    // In quick mode a further argument picks the cases whose name holds it (for a profiler).
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    for case in &cases {
        if quick
            && only
                .as_ref()
                .is_some_and(|o| !case.name.contains(o.as_str()))
        {
            continue;
        }
        let reference_s = seconds(&|| drop(reference(case)));
        let mut line = format!("{}: reference {:.2} ms", case.name, reference_s * 1e3);
        for kernel in kernels() {
            for half in [false, true] {
                let s = seconds(&|| drop(flash(case, kernel, half)));
                let dtype = if half { "f16" } else { "f32" };
                line += &format!(
                    ", {} {dtype} {:.2} ms ({:.2}x)",
                    kernel.name(),
                    s * 1e3,
                    reference_s / s
                );
            }
        }
        println!("{line}");
    }
}
