//! `q8_matmul` (CPU) against its peers on the 0.5B's `ffn_up` shape (896 → 4,864): candle's
//! quantized matmul on the same Q8_0 weights, and an f32 GEMM over the dequantized copy (what
//! prefill used before). Rows 1 (decode), 16 (batched decode), 128 and 512 (prefill chunks).
//! Then the LM head's shape (896 → 151,936: 130 MiB of Q8_0, beyond the caches, so the products
//! read DRAM as a real decode step does) at 1 and 16 rows. Then each int8 kernel this CPU runs
//! (portable, AVX2, VNNI) on already quantized rows. Then GGML's Q5_0 and Q4_1 kept at their
//! width (`narrow`) against the same weights rewritten as Q8_0 (what `triage models fetch` did
//! before) and against candle's matmul of the type. Prints the peer/ours time ratios of the same
//! process last.

use std::hint::black_box;
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::Criterion;
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_ops::{
    q8_matmul, q8_matmul_quantized, GgmlBlockType, KernelChoice, Q8Kernel, Q8Matrix, Q8Rows,
};

const K: usize = 896;
const N: usize = 4864;
const ROWS: [usize; 4] = [1, 16, 128, 512];

fn random(rows: usize, cols: usize, rng: &mut StdRng) -> Tensor {
    let v: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu).expect("shape")
}

fn main() {
    let mut rng = StdRng::seed_from_u64(7);
    let w = random(N, K, &mut rng);
    let q = QTensor::quantize(&w, GgmlDType::Q8_0).expect("quantize");
    let ours = Q8Matrix::from_ggml_bytes(N, K, &q.data().expect("bytes")).expect("q8");
    let dense = q.dequantize(&Device::Cpu).expect("dequantize");
    let candle = QMatMul::from_qtensor(q).expect("qmatmul");
    let inputs: Vec<Tensor> = ROWS.iter().map(|&m| random(m, K, &mut rng)).collect();

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("q8_matmul_cpu");
    group.sample_size(10);
    for (m, x) in ROWS.iter().zip(&inputs) {
        group.bench_function(format!("ours_cpu/{m}x{K}x{N}"), |b| {
            b.iter(|| q8_matmul(black_box(x), &ours).expect("valid"))
        });
        group.bench_function(format!("candle_q8_0_cpu/{m}x{K}x{N}"), |b| {
            b.iter(|| candle.forward(black_box(x)).expect("valid"))
        });
        group.bench_function(format!("f32_gemm_cpu/{m}x{K}x{N}"), |b| {
            b.iter(|| black_box(x).matmul(&dense.t().expect("t")).expect("valid"))
        });
    }
    group.finish();

    for (m, x) in ROWS.iter().zip(&inputs) {
        let t_ours = time(&|| drop(q8_matmul(x, &ours).expect("valid")));
        let t_candle = time(&|| drop(candle.forward(x).expect("valid")));
        let t_f32 = time(&|| drop(x.matmul(&dense.t().expect("t")).expect("valid")));
        let gmac = (m * K * N) as f64 / 1e9;
        println!(
            "rows {m:>3}: ours {:.2} ms ({:.1} GMAC/s), candle Q8_0 {:.2} ms ({:.2}x ours), f32 GEMM {:.2} ms ({:.2}x ours)",
            t_ours * 1e3,
            gmac / t_ours,
            t_candle * 1e3,
            t_candle / t_ours,
            t_f32 * 1e3,
            t_f32 / t_ours
        );
    }

    const VOCAB: usize = 151_936;
    let w = random(VOCAB, K, &mut rng);
    let q = QTensor::quantize(&w, GgmlDType::Q8_0).expect("quantize");
    drop(w);
    let ours = Q8Matrix::from_ggml_bytes(VOCAB, K, &q.data().expect("bytes")).expect("q8");
    let candle = QMatMul::from_qtensor(q).expect("qmatmul");
    for m in [1, 16] {
        let x = random(m, K, &mut rng);
        let t_ours = time(&|| drop(q8_matmul(&x, &ours).expect("valid")));
        let t_candle = time(&|| drop(candle.forward(&x).expect("valid")));
        let gib = (VOCAB * K) as f64 * 34.0 / 32.0 / (1u64 << 30) as f64;
        println!(
            "lm head, rows {m:>2}: ours {:.1} ms ({:.1} GiB/s of weights), candle Q8_0 {:.1} ms ({:.2}x ours)",
            t_ours * 1e3,
            gib / t_ours,
            t_candle * 1e3,
            t_candle / t_ours
        );
    }

    kernels(&mut rng);
    narrow(&mut rng);
}

/// Q5_0 and Q4_1 weights of the `ffn_up` shape held narrow, against the Q8_0 rewrite of the same
/// values (int8: fewer instructions, more bytes) and candle's own matmul of the type.
fn narrow(rng: &mut StdRng) {
    let w = random(N, K, rng);
    for (ty, dtype) in [
        (GgmlBlockType::Q5_0, GgmlDType::Q5_0),
        (GgmlBlockType::Q4_1, GgmlDType::Q4_1),
    ] {
        let q = QTensor::quantize(&w, dtype).expect("quantize");
        let ours = Q8Matrix::from_ggml_blocks(ty, N, K, &q.data().expect("bytes")).expect("narrow");
        let dense = q.dequantize(&Device::Cpu).expect("dequantize");
        let rewrite = QTensor::quantize(&dense, GgmlDType::Q8_0).expect("quantize");
        let int8 = Q8Matrix::from_ggml_bytes(N, K, &rewrite.data().expect("bytes")).expect("q8");
        let candle = QMatMul::from_qtensor(q).expect("qmatmul");
        for m in ROWS {
            let x = random(m, K, rng);
            let t_ours = time(&|| drop(q8_matmul(&x, &ours).expect("valid")));
            let t_int8 = time(&|| drop(q8_matmul(&x, &int8).expect("valid")));
            let t_candle = time(&|| drop(candle.forward(&x).expect("valid")));
            println!(
                "{ty:?} narrow, rows {m:>3}: ours {:.2} ms, as Q8_0 {:.2} ms ({:.2}x ours), candle {ty:?} {:.2} ms ({:.2}x ours)",
                t_ours * 1e3,
                t_int8 * 1e3,
                t_int8 / t_ours,
                t_candle * 1e3,
                t_candle / t_ours
            );
        }
    }
}

/// Mean seconds of `f` over 5 runs after a warm-up.
fn time(f: &dyn Fn()) -> f64 {
    f();
    let start = Instant::now();
    for _ in 0..5 {
        f();
    }
    start.elapsed().as_secs_f64() / 5.0
}

/// Each kernel on the `ffn_up` shape, activations quantized beforehand, against the AVX2 one.
fn kernels(rng: &mut StdRng) {
    let values = |rows: usize, cols: usize, rng: &mut StdRng| -> Vec<f32> {
        (0..rows * cols)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect()
    };
    let w = Q8Matrix::quantize(N, K, &values(N, K, rng)).expect("q8");
    for m in [1, 16, 64] {
        let a = Q8Rows::quantize(m, K, &values(m, K, rng)).expect("q8");
        let gmac = (m * K * N) as f64 / 1e9;
        let mut line = format!("kernels, rows {m:>2}:");
        let mut avx2 = None;
        for &kernel in Q8Kernel::available() {
            let start = Instant::now();
            let mut runs = 0;
            while runs < 5 || start.elapsed().as_secs_f64() < 0.5 {
                black_box(q8_matmul_quantized(&a, &w, kernel).expect("valid"));
                runs += 1;
            }
            let t = start.elapsed().as_secs_f64() / runs as f64;
            if kernel == Q8Kernel::Avx2 {
                avx2 = Some(t);
            }
            let ratio = avx2.map_or(String::new(), |a| format!(", {:.2}x AVX2's speed", a / t));
            line += &format!(
                "  {kernel:?} {:.2} ms ({:.1} GMAC/s{ratio})",
                t * 1e3,
                gmac / t
            );
        }
        println!("{line}");
    }
}
