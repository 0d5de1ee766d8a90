//! `kquant_matmul` against its slow reference, candle's own K-quant code, and itself across
//! kernels and batch sizes.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::*;

const TYPES: [(KQuantType, GgmlDType); 2] = [
    (KQuantType::Q4K, GgmlDType::Q4K),
    (KQuantType::Q6K, GgmlDType::Q6K),
];

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503);
            let h = h ^ (h >> 15);
            h.wrapping_mul(2_246_822_519) as f32 / u32::MAX as f32 - 0.5
        })
        .collect()
}

fn tensor(rows: usize, cols: usize, seed: u32) -> Tensor {
    Tensor::from_vec(values(rows * cols, seed), (rows, cols), &Device::Cpu).unwrap()
}

/// Random weights quantized by candle (GGML's quantizer), as a GGUF file would hold them.
fn weights(ty: GgmlDType, rows: usize, cols: usize, seed: u32) -> (QTensor, KQuantMatrix) {
    let q = QTensor::quantize(&tensor(rows, cols, seed), ty).unwrap();
    let ours_ty = TYPES.iter().find(|(_, g)| *g == ty).unwrap().0;
    let m = KQuantMatrix::from_ggml_bytes(ours_ty, rows, cols, &q.data().unwrap()).unwrap();
    (q, m)
}

fn acts(rows: usize, cols: usize, seed: u32) -> Q8KRows {
    Q8KRows::quantize(rows, cols, &values(rows * cols, seed)).unwrap()
}

#[test]
fn dequantize_reads_the_blocks_as_candle_does() {
    for (_, ty) in TYPES {
        let (q, ours) = weights(ty, 5, 512, 1);
        let theirs = q.dequantize(&Device::Cpu).unwrap();
        let theirs = theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(theirs.iter().any(|v| v.abs() > 0.1), "{ty:?}: non-trivial");
        assert_eq!(ours.dequantize(), theirs, "{ty:?}");
    }
}

#[test]
fn every_kernel_gives_the_portable_loops_bits() {
    // 3, 5, 6 and 7 activation rows exercise every tile width of every kernel (AVX-512 VNNI
    // takes 4 rows at a time, AVX2 3, and each ends on the shorter widths).
    for (_, ty) in TYPES {
        for num_a in [3, 5, 6, 7] {
            // 37 rows: two full 16-row tiles and a padded one.
            let (_, w) = weights(ty, 37, 768, 2);
            let a = acts(num_a, 768, 3);
            let run = |kernel| kquant_matmul_quantized(&a, &w, kernel).unwrap();
            let portable = run(KQuantKernel::Portable);
            assert!(portable.iter().any(|v| v.abs() > 1e-2), "non-trivial");
            for &kernel in KQuantKernel::available() {
                assert_eq!(run(kernel), portable, "{ty:?} {kernel:?}, {num_a} rows");
            }
        }
    }
}

#[test]
fn products_match_the_slow_reference_and_candles_quantized_matmul() {
    for (_, ty) in TYPES {
        let (q, w) = weights(ty, 37, 512, 4);
        let x = tensor(9, 512, 5);
        let ours = kquant_matmul(&x, &w).unwrap();
        let slow = kquant_matmul_slow(&x, &w).unwrap();
        let candle = QMatMul::from_qtensor(q).unwrap().forward(&x).unwrap();
        let ours = ours.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let slow = slow.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let candle = candle.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // Same quantized operands, f32 sums in another order: relative 1e-4 of the magnitude
        // of the terms (512 products of |x| ≤ 0.5 by |w| ≤ 0.5). candle quantizes the
        // activations the same way but sums in its own order.
        let scale = 512.0 * 0.25;
        for ((o, s), c) in ours.iter().zip(&slow).zip(&candle) {
            assert!(
                (o - s).abs() <= 1e-4 * scale,
                "{ty:?}: ours {o} vs slow {s}"
            );
            assert!(
                (o - c).abs() <= 1e-4 * scale,
                "{ty:?}: ours {o} vs candle {c}"
            );
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_alone_as_in_a_batch_with_every_kernel() {
    // 70 rows span two row chunks (64 + 6); 37 weight rows span three tasks with a tail.
    for (_, ty) in TYPES {
        let (_, w) = weights(ty, 37, 512, 6);
        let a = acts(70, 512, 7);
        for &kernel in KQuantKernel::available() {
            let batch = kquant_matmul_quantized(&a, &w, kernel).unwrap();
            for row in [0, 1, 63, 64, 69] {
                let alone = kquant_matmul_quantized(&a.row(row), &w, kernel).unwrap();
                assert_eq!(
                    alone,
                    batch[row * 37..(row + 1) * 37],
                    "{kernel:?}, row {row}"
                );
            }
        }
    }
}

#[test]
fn a_stacked_product_is_its_parts_side_by_side() {
    // A part before the last must fill its 16-row tiles.
    for (ty, top_rows) in [(GgmlDType::Q4K, 16), (GgmlDType::Q6K, 32)] {
        let (_, top) = weights(ty, top_rows, 256, 8);
        let (_, bottom) = weights(ty, 3, 256, 9);
        let a = acts(6, 256, 10);
        let stacked = KQuantMatrix::stack_rows(&[&top, &bottom]).unwrap();
        let kernel = KQuantKernel::best();
        let t = kquant_matmul_quantized(&a, &top, kernel).unwrap();
        let b = kquant_matmul_quantized(&a, &bottom, kernel).unwrap();
        let both = kquant_matmul_quantized(&a, &stacked, kernel).unwrap();
        let n = top_rows + 3;
        for row in 0..6 {
            assert_eq!(
                both[row * n..row * n + top_rows],
                t[row * top_rows..(row + 1) * top_rows]
            );
            assert_eq!(
                both[row * n + top_rows..(row + 1) * n],
                b[row * 3..row * 3 + 3]
            );
        }
        assert_eq!(stacked.dequantize()[..top_rows * 256], top.dequantize()[..]);
    }
    let (_, q4) = weights(GgmlDType::Q4K, 5, 256, 8);
    let (_, q6) = weights(GgmlDType::Q6K, 2, 256, 11);
    assert!(
        KQuantMatrix::stack_rows(&[&q4, &q4]).is_err(),
        "5 rows do not fill a tile"
    );
    assert!(KQuantMatrix::stack_rows(&[&q6, &q4]).is_err());
    assert!(KQuantMatrix::stack_rows(&[]).is_err());
}

#[test]
fn extreme_blocks_do_not_saturate_any_kernel() {
    // Every weight at its largest magnitude (Q4_K 15 with scale and min 63; Q6_K −32 and 31 with
    // scales −128 and 127) against activations at ±127 (all +127, all −127, then mixed): the
    // largest int16 pair sums and int32 lanes the kernels form, with the rows in a batch (tiles
    // of several rows) and alone (the one-row decode kernels).
    let mut q4 = vec![0u8; blocks::Q4K_BYTES];
    q4[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
    q4[2..4].copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
    q4[4..16].fill(0xFF);
    q4[16..].fill(0xFF);
    let mut q6 = vec![0u8; blocks::Q6K_BYTES];
    for (i, b) in q6[..Q6K_SCALES_AT].iter_mut().enumerate() {
        *b = if i % 3 == 0 { 0xFF } else { 0x00 };
    }
    for (i, s) in q6[Q6K_SCALES_AT..Q6K_SCALES_AT + 16].iter_mut().enumerate() {
        *s = if i % 2 == 0 { 0x80 } else { 0x7F };
    }
    q6[208..].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
    let x: Vec<f32> = (0..3 * QK_K)
        .map(|i| match i / QK_K {
            0 => 1.0,
            1 => -1.0,
            _ if i % 5 < 2 => 1.0,
            _ => -1.0,
        })
        .collect();
    let a = Q8KRows::quantize(3, QK_K, &x).unwrap();
    for (ty, block) in [(KQuantType::Q4K, q4), (KQuantType::Q6K, q6)] {
        let w = KQuantMatrix::from_ggml_bytes(ty, 1, QK_K, &block).unwrap();
        let (wf, af) = (w.dequantize(), a.dequantize());
        for &kernel in KQuantKernel::available() {
            let batch = kquant_matmul_quantized(&a, &w, kernel).unwrap();
            for row in 0..a.rows() {
                let alone = kquant_matmul_quantized(&a.row(row), &w, kernel).unwrap();
                let exact: f64 = (0..QK_K)
                    .map(|k| wf[k] as f64 * af[row * QK_K + k] as f64)
                    .sum();
                for got in [batch[row], alone[0]] {
                    assert!(
                        (exact - got as f64).abs() <= 1e-4 * (1.0 + exact.abs()),
                        "{ty:?} {kernel:?} row {row}: {exact} vs {got}"
                    );
                }
            }
        }
    }
}

const Q6K_SCALES_AT: usize = blocks::Q6K_SCALES;

#[test]
fn bad_shapes_are_errors() {
    assert!(KQuantMatrix::from_ggml_bytes(KQuantType::Q4K, 1, 100, &[0; 144]).is_err());
    assert!(KQuantMatrix::from_ggml_bytes(KQuantType::Q4K, 1, 256, &[0; 143]).is_err());
    let (_, w) = weights(GgmlDType::Q6K, 2, 512, 12);
    assert!(kquant_matmul(&tensor(2, 256, 1), &w).is_err());
    assert!(Q8KRows::quantize(1, 256, &[0.0; 255]).is_err());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_amx_kernel_body_gives_the_portable_loops_bits_on_a_model_of_the_tiles() {
    // AMX hosts run the bodies (Q4_K's and Q6_K's) on their tiles through
    // `kquant_matmul_quantized` above; this runs them on `cpu::amx`'s software model of the
    // instructions wherever AVX-512 BW is: row
    // tiles of 16 and a padded one (37 weight rows), 3 super-blocks, 1 to 16 activation rows
    // from the first and from a later row.
    let isa = crate::cpu::Isa::get();
    if !(isa.avx512f && isa.avx512bw && isa.f16c && isa.fma) {
        eprintln!("no AVX-512 here: the AMX body is not run");
        return;
    }
    let a = acts(21, 768, 7);
    let act = Acts {
        nb: 3,
        d: &a.d,
        quants: &a.quants,
        bsums: &a.bsums,
    };
    for (_, ty) in TYPES {
        let (_, w) = weights(ty, 37, 768, 6);
        let portable = kquant_matmul_quantized(&a, &w, KQuantKernel::Portable).unwrap();
        for (c0, rows) in [(0, 1), (0, 5), (0, 16), (5, 16), (20, 1)] {
            for t in 0..3 {
                let mut out = [[f32::NAN; tiles::TILE_ROWS]; AMX_ROWS];
                let mut model = crate::cpu::amx::Model::new();
                // SAFETY: the features were detected above and the model needs no AMX; tile `t`
                // exists and `act` holds rows `c0..c0 + rows`.
                #[allow(unsafe_code)]
                unsafe {
                    match &w.data {
                        KQuantData::PackedQ4K(p) => {
                            amx::tile_amx(&mut model, p, t, &act, c0, rows, &mut out)
                        }
                        KQuantData::PackedQ6K(p) => {
                            amx::tile_amx(&mut model, p, t, &act, c0, rows, &mut out)
                        }
                    }
                };
                for c in 0..rows {
                    for r in 0..16.min(37 - 16 * t) {
                        let want = portable[(c0 + c) * 37 + 16 * t + r];
                        let at = format!("{ty:?}, rows {c0}+{c}, weight row {}", 16 * t + r);
                        assert_eq!(out[c][r], want, "{at}");
                    }
                }
            }
        }
    }
}
