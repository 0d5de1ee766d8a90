//! `kquant_matmul` (CPU) against its peers on the 1.5B's shapes: `ffn_up` (1,536 → 8,960, Q4_K)
//! and `ffn_down` (8,960 → 1,536, Q6_K). Peers: candle's quantized matmul on the same blocks,
//! and an f32 GEMM over the dequantized copy (what prefill used before, at 4 bytes per weight).
//! Rows 1 (decode), 16 (batched decode), 128 and 512 (prefill chunks). Then each kernel this CPU
//! runs on already quantized rows. Prints the same-process ratios peer/ours last.
//!
//! `cargo bench -p triage-ops --bench ops_kquant_matmul` (`-- --quick` skips criterion's runs).

use std::hint::black_box;
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::Criterion;
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_ops::{
    kquant_matmul, kquant_matmul_quantized, KQuantKernel, KQuantMatrix, KQuantType, KernelChoice,
    Q8KRows,
};

const ROWS: [usize; 4] = [1, 16, 128, 512];
/// (name, type, in, out).
const SHAPES: [(&str, KQuantType, usize, usize); 2] = [
    ("ffn_up Q4_K", KQuantType::Q4K, 1536, 8960),
    ("ffn_down Q6_K", KQuantType::Q6K, 8960, 1536),
];

fn random(rows: usize, cols: usize, rng: &mut StdRng) -> Tensor {
    let v: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu).expect("shape")
}

/// Mean seconds per call over at least 5 calls and half a second.
fn time(f: &dyn Fn()) -> f64 {
    f();
    let start = Instant::now();
    let mut runs = 0;
    while runs < 5 || start.elapsed().as_secs_f64() < 0.5 {
        f();
        runs += 1;
    }
    start.elapsed().as_secs_f64() / runs as f64
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let mut rng = StdRng::seed_from_u64(7);
    let mut lines = Vec::new();
    for (name, ty, k, n) in SHAPES {
        let ggml = match ty {
            KQuantType::Q4K => GgmlDType::Q4K,
            KQuantType::Q6K => GgmlDType::Q6K,
        };
        let q = QTensor::quantize(&random(n, k, &mut rng), ggml).expect("quantize");
        let ours =
            KQuantMatrix::from_ggml_bytes(ty, n, k, &q.data().expect("bytes")).expect("blocks");
        let dense = q.dequantize(&Device::Cpu).expect("dequantize");
        let candle = QMatMul::from_qtensor(q).expect("qmatmul");
        let inputs: Vec<Tensor> = ROWS.iter().map(|&m| random(m, k, &mut rng)).collect();
        if !quick {
            let mut c = Criterion::default().configure_from_args();
            let mut group = c.benchmark_group(format!("kquant_matmul_cpu/{name}"));
            group.sample_size(10);
            for (m, x) in ROWS.iter().zip(&inputs) {
                group.bench_function(format!("ours/{m}x{k}x{n}"), |b| {
                    b.iter(|| kquant_matmul(black_box(x), &ours).expect("valid"))
                });
                group.bench_function(format!("candle/{m}x{k}x{n}"), |b| {
                    b.iter(|| candle.forward(black_box(x)).expect("valid"))
                });
                group.bench_function(format!("f32_gemm/{m}x{k}x{n}"), |b| {
                    b.iter(|| black_box(x).matmul(&dense.t().expect("t")).expect("valid"))
                });
            }
            group.finish();
        }
        for (m, x) in ROWS.iter().zip(&inputs) {
            let t_ours = time(&|| drop(kquant_matmul(x, &ours).expect("valid")));
            let t_candle = time(&|| drop(candle.forward(x).expect("valid")));
            let t_f32 = time(&|| drop(x.matmul(&dense.t().expect("t")).expect("valid")));
            let gmac = (m * k * n) as f64 / 1e9;
            lines.push(format!(
                "{name}, rows {m:>3}: ours {:.2} ms ({:.1} GMAC/s), candle {:.2} ms ({:.2}x ours), f32 GEMM {:.2} ms ({:.2}x ours)",
                t_ours * 1e3,
                gmac / t_ours,
                t_candle * 1e3,
                t_candle / t_ours,
                t_f32 * 1e3,
                t_f32 / t_ours
            ));
        }
        for m in [1, 16, 128] {
            let values: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let a = Q8KRows::quantize(m, k, &values).expect("q8k");
            let gmac = (m * k * n) as f64 / 1e9;
            let mut line = format!("{name}, kernels, rows {m:>3}:");
            for &kernel in KQuantKernel::available() {
                let t = time(&|| drop(black_box(kquant_matmul_quantized(&a, &ours, kernel))));
                line += &format!("  {kernel:?} {:.2} ms ({:.1} GMAC/s)", t * 1e3, gmac / t);
            }
            lines.push(line);
        }
    }
    for line in lines {
        println!("{line}");
    }
}
