//! `q8_matmul` against its `*_slow` reference on random inputs, its batch invariance (a row gives
//! the same bits alone as in any batch), and GGML byte compatibility with candle (Q8_0, and the
//! 4- and 5-bit blocks held without loss).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Module, Tensor};
use triage_ops::{q8_matmul, q8_matmul_slow, GgmlBlockType, Q8Matrix};
use triage_testkit::max_abs_diff;

fn random(rows: usize, cols: usize, seed: u64) -> Tensor {
    // A fixed LCG: reproducible, no zeros, a spread of magnitudes per block.
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            u * (1.0 + (state >> 60) as f32)
        })
        .collect();
    Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap()
}

fn weights(rows: usize, cols: usize, seed: u64) -> Q8Matrix {
    let t = random(rows, cols, seed);
    Q8Matrix::quantize(rows, cols, &t.flatten_all().unwrap().to_vec1().unwrap()).unwrap()
}

/// Tolerance: only the summation order differs from the reference, so the error grows with the
/// number of terms (k) times f32 epsilon times their size (inputs are at most 16 in magnitude).
fn tolerance(k: usize) -> f32 {
    k as f32 * 256.0 * f32::EPSILON * 4.0
}

#[test]
fn matches_the_reference_on_random_shapes() {
    for (m, n, k) in [
        (1, 4, 32),
        (1, 37, 96),
        (2, 7, 64),
        (3, 5, 128),
        (5, 9, 896),
        (16, 130, 896),
        (67, 33, 160),
    ] {
        let x = random(m, k, (m * 31 + n * 7 + k) as u64);
        let w = weights(n, k, (n + k) as u64);
        let got = q8_matmul(&x, &w).unwrap();
        let want = q8_matmul_slow(&x, &w).unwrap();
        assert_eq!(got.dims(), &[m, n]);
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff <= tolerance(k),
            "({m}, {n}, {k}): {diff} > {}",
            tolerance(k)
        );
    }
}

#[test]
fn stays_close_to_the_unquantized_product() {
    let (m, n, k) = (4, 64, 896);
    let x = random(m, k, 3);
    let w = weights(n, k, 4);
    let wf = Tensor::from_vec(w.dequantize(), (n, k), &Device::Cpu).unwrap();
    let exact = x.matmul(&wf.t().unwrap()).unwrap();
    let got = q8_matmul(&x, &w).unwrap();
    // Activation rounding is at most half a step of max|x|/127 per value: about 0.5 % relative.
    let rel = max_abs_diff(&got, &exact)
        / exact
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
    assert!(rel < 0.02, "relative error {rel}");
}

#[test]
fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
    let (m, n, k) = (17, 45, 224);
    let x = random(m, k, 11);
    let w = weights(n, k, 12);
    let batch = q8_matmul(&x, &w).unwrap().to_vec2::<f32>().unwrap();
    for (i, row) in batch.iter().enumerate() {
        let alone = q8_matmul(&x.narrow(0, i, 1).unwrap(), &w)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(&alone[0], row, "row {i}");
    }
    let part = q8_matmul(&x.narrow(0, 5, 7).unwrap(), &w)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(part, batch[5..12].to_vec());
}

#[test]
fn reads_ggml_q8_0_bytes_like_candle() {
    let (n, k) = (6, 128);
    let t = random(n, k, 21);
    let q = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
    let ours = Q8Matrix::from_ggml_bytes(n, k, &q.data().unwrap()).unwrap();
    let theirs = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(ours.dequantize(), theirs);
    assert!(Q8Matrix::from_ggml_bytes(n, k, &q.data().unwrap()[1..]).is_err());
}

#[test]
fn reads_ggml_4_and_5_bit_blocks_like_candle_and_multiplies_them_as_its_reference() {
    // candle writes each type's blocks; ours dequantize to its values bit for bit, and the
    // product agrees with the `*_slow` reference and with candle's own quantized matmul.
    let (n, k, m) = (20, 256, 5);
    let (t, x) = (random(n, k, 41), random(m, k, 42));
    for (ty, theirs) in [
        (GgmlBlockType::Q4_0, GgmlDType::Q4_0),
        (GgmlBlockType::Q4_1, GgmlDType::Q4_1),
        (GgmlBlockType::Q5_0, GgmlDType::Q5_0),
        (GgmlBlockType::Q5_1, GgmlDType::Q5_1),
    ] {
        let q = QTensor::quantize(&t, theirs).unwrap();
        let bytes = q.data().unwrap();
        let ours = Q8Matrix::from_ggml_blocks(ty, n, k, &bytes).unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap();
        let want: Vec<f32> = dense.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(ours.dequantize(), want, "{ty:?}");
        assert!(Q8Matrix::from_ggml_blocks(ty, n, k, &bytes[1..]).is_err());

        let got = q8_matmul(&x, &ours).unwrap();
        let reference = q8_matmul_slow(&x, &ours).unwrap();
        let candle = candle_core::quantized::QMatMul::from_qtensor(q)
            .unwrap()
            .forward(&x)
            .unwrap();
        let scale = max_abs_diff(&reference, &reference.zeros_like().unwrap());
        assert!(max_abs_diff(&got, &reference) <= tolerance(k), "{ty:?}");
        // candle's int8 path quantizes the activations as GGML does and sums in its own order
        // (2.4e-4 apart here); for the types with mins it rounds each activation block's sum
        // and scale to f16 apart and multiplies them in f16, where GGML (and triage) round
        // their product once: 0.38 apart of 3,343 (2026-12-05).
        let candle_tolerance = if ty.has_mins() { 2e-4 } else { 1e-6 };
        assert!(
            max_abs_diff(&got, &candle) <= candle_tolerance * scale,
            "{ty:?} vs candle"
        );
    }
}

#[test]
fn bad_shapes_are_errors() {
    assert!(
        Q8Matrix::quantize(2, 30, &[0.5; 60]).is_err(),
        "columns not a multiple of 32"
    );
    assert!(
        Q8Matrix::quantize(2, 32, &[0.5; 63]).is_err(),
        "value count"
    );
    let w = weights(4, 64, 1);
    assert!(
        q8_matmul(&random(2, 32, 1), &w).is_err(),
        "inner dimensions differ"
    );
}
