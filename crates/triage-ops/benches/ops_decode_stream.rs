//! One decode step's mat-vecs of a whole model (every layer's weights and the LM head, random
//! values in the models' own types and shapes), so the weights stream from DRAM as in a real
//! decode step, against a plain read of as many bytes on as many threads in the same process:
//! the ratio is how close the kernels come to the host's memory bandwidth, the bound of decode.
//!
//! `cargo bench -p triage-ops --bench ops_decode_stream [-- 0.5b|1.5b]`

use std::hint::black_box;
use std::time::Instant;

use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_ops::{
    kquant_matmul_quantized, q8_matmul_quantized, KQuantKernel, KQuantMatrix, KQuantType,
    KernelChoice, Q8KRows, Q8Kernel, Q8Matrix, Q8Rows,
};

/// A weight of one decode step, with the width of its input.
enum Weight {
    Q8(Q8Matrix),
    KQuant(KQuantMatrix),
}

/// `(type, rows, cols)`; `None` is Q8_0. Q/K/V and gate/up are stacked as the model stacks them.
type Shape = (Option<KQuantType>, usize, usize);

/// One layer's weights, by layer index.
type LayerShapes = Box<dyn Fn(usize) -> Vec<Shape>>;

/// Qwen2.5-Coder 0.5B (Q8_0) and 1.5B (Q4_K_M): each layer's weights, and the LM head. Both
/// files keep `ffn_down` (and in the 1.5B `attn_v`) in Q6_K in about half the layers and in Q4_K
/// in the others; here even layers take Q6_K, odd ones Q4_K (with the 1.5B's V then stacked with
/// Q and K, all Q4_K, as the model stacks them).
fn model(name: &str) -> (usize, LayerShapes, Shape) {
    let q4k = Some(KQuantType::Q4K);
    let q6k = Some(KQuantType::Q6K);
    let down = move |layer: usize| if layer.is_multiple_of(2) { q6k } else { q4k };
    match name {
        "0.5b" => (
            24,
            Box::new(move |layer| {
                vec![
                    (None, 896 + 128 + 128, 896),
                    (None, 896, 896),
                    (None, 2 * 4864, 896),
                    (down(layer), 896, 4864),
                ]
            }),
            (None, 151_936, 896),
        ),
        _ => (
            28,
            Box::new(move |layer| {
                let attention = if layer.is_multiple_of(2) {
                    vec![(q4k, 1536 + 256, 1536), (q6k, 256, 1536)]
                } else {
                    vec![(q4k, 1536 + 2 * 256, 1536)]
                };
                let ffn = [
                    (q4k, 1536, 1536),
                    (q4k, 2 * 8960, 1536),
                    (down(layer), 1536, 8960),
                ];
                attention.into_iter().chain(ffn).collect()
            }),
            (q6k, 151_936, 1536),
        ),
    }
}

/// Random weights of `shape`: Q8_0 quantized from random values, K-quant blocks of random bytes
/// with sane f16 scales.
fn weight((ty, rows, cols): Shape, rng: &mut StdRng) -> Weight {
    match ty {
        None => {
            let values: Vec<f32> = (0..rows * cols)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            Weight::Q8(Q8Matrix::quantize(rows, cols, &values).expect("q8"))
        }
        Some(ty) => {
            let block = ty.block_bytes();
            let mut bytes = vec![0u8; rows * cols / 256 * block];
            rng.fill(&mut bytes[..]);
            let scale = half::f16::from_f32(0.01).to_le_bytes();
            for b in bytes.chunks_exact_mut(block) {
                match ty {
                    KQuantType::Q4K => {
                        b[0..2].copy_from_slice(&scale);
                        b[2..4].copy_from_slice(&scale);
                    }
                    KQuantType::Q6K => b[208..210].copy_from_slice(&scale),
                }
            }
            Weight::KQuant(KQuantMatrix::from_ggml_bytes(ty, rows, cols, &bytes).expect("blocks"))
        }
    }
}

/// Bytes the file stores for `shape`.
fn file_bytes((ty, rows, cols): Shape) -> usize {
    match ty {
        None => rows * cols / 32 * 34,
        Some(ty) => rows * cols / 256 * ty.block_bytes(),
    }
}

/// Seconds to read `bytes` once, split over `threads`, 64 bytes at a time (best of 5).
fn read_time(bytes: &[u64], threads: usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        std::thread::scope(|s| {
            for part in bytes.chunks(bytes.len().div_ceil(threads)) {
                s.spawn(move || {
                    let mut acc = [0u64; 8];
                    for line in part.chunks_exact(8) {
                        for (a, v) in acc.iter_mut().zip(line) {
                            *a = a.wrapping_add(*v);
                        }
                    }
                    black_box(acc)
                });
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let which: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a == "0.5b" || a == "1.5b")
        .collect();
    let which = if which.is_empty() {
        vec!["0.5b".to_string(), "1.5b".to_string()]
    } else {
        which
    };
    let threads = candle_core::utils::get_num_threads();
    let mut rng = StdRng::seed_from_u64(11);
    for name in which {
        let (layers, per_layer, head) = model(&name);
        let mut shapes: Vec<Shape> = (0..layers).flat_map(&per_layer).collect();
        shapes.push(head);
        let weights: Vec<Weight> = shapes.iter().map(|&s| weight(s, &mut rng)).collect();
        let total: usize = shapes.iter().map(|&s| file_bytes(s)).sum();
        // K-quant rows need whole super-blocks: none for 896.
        let inputs: Vec<(Q8Rows, Option<Q8KRows>)> = [896usize, 1536, 4864, 8960]
            .iter()
            .map(|&k| {
                let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                (
                    Q8Rows::quantize(1, k, &x).expect("q8"),
                    Q8KRows::quantize(1, k, &x).ok(),
                )
            })
            .collect();
        let input = |cols: usize| {
            let at = [896usize, 1536, 4864, 8960]
                .iter()
                .position(|&k| k == cols)
                .expect("a model width");
            &inputs[at]
        };
        let step = || {
            for w in &weights {
                match w {
                    Weight::Q8(m) => {
                        black_box(
                            q8_matmul_quantized(&input(m.cols()).0, m, Q8Kernel::best())
                                .expect("shapes"),
                        );
                    }
                    Weight::KQuant(m) => {
                        black_box(
                            kquant_matmul_quantized(
                                input(m.cols()).1.as_ref().expect("super-blocks"),
                                m,
                                KQuantKernel::best(),
                            )
                            .expect("shapes"),
                        );
                    }
                }
            }
        };
        step();
        let mut times: Vec<f64> = (0..7)
            .map(|_| {
                let start = Instant::now();
                step();
                start.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let ours = times[times.len() / 2];
        // Each weight type alone, for where the time goes.
        for kind in ["Q8_0", "Q4_K", "Q6_K"] {
            let of_kind = |s: &Shape| match s.0 {
                None => kind == "Q8_0",
                Some(KQuantType::Q4K) => kind == "Q4_K",
                Some(KQuantType::Q6K) => kind == "Q6_K",
            };
            let bytes: usize = shapes
                .iter()
                .filter(|s| of_kind(s))
                .map(|&s| file_bytes(s))
                .sum();
            if bytes == 0 {
                continue;
            }
            let run = || {
                for (w, s) in weights.iter().zip(&shapes) {
                    if of_kind(s) {
                        match w {
                            Weight::Q8(m) => drop(black_box(q8_matmul_quantized(
                                &input(m.cols()).0,
                                m,
                                Q8Kernel::best(),
                            ))),
                            Weight::KQuant(m) => drop(black_box(kquant_matmul_quantized(
                                input(m.cols()).1.as_ref().expect("super-blocks"),
                                m,
                                KQuantKernel::best(),
                            ))),
                        }
                    }
                }
            };
            run();
            let mut t: Vec<f64> = (0..5)
                .map(|_| {
                    let start = Instant::now();
                    run();
                    start.elapsed().as_secs_f64()
                })
                .collect();
            t.sort_by(f64::total_cmp);
            let t = t[2];
            println!(
                "  {kind}: {:.0} MB in {:.1} ms ({:.1} GB/s)",
                bytes as f64 / 1e6,
                t * 1e3,
                bytes as f64 / 1e9 / t
            );
        }
        let plain = vec![1u64; total / 8];
        let read = read_time(&plain, threads);
        let gb = total as f64 / 1e9;
        println!(
            "{name}: {:.0} MB of weights, {threads} threads: decode mat-vecs {:.1} ms ({:.1} GB/s, \
             median of 7), plain read {:.1} ms ({:.1} GB/s, best of 5), read / ours {:.2}",
            gb * 1e3,
            ours * 1e3,
            gb / ours,
            read * 1e3,
            gb / read,
            read / ours
        );
    }
}
