//! `silu_mul_<dtype>` against `triage_ops::silu_mul` (the CPU op) on the same values.

use half::{bf16, f16};
use rand::{rngs::StdRng, SeedableRng};
use triage_kernel_sim::silu_mul;
use triage_ops::launch::{self, MIN_THREADS, SILU_MUL_THREADS};

use crate::inputs::{close, convert, normal, tensor, Dtype};

/// Both compute `g / (1 + exp(-g)) · u` in f32; exp may differ by an ulp between the simulator's
/// libm and Rust's, which can move the rounded result by one unit of the dtype.
fn rel_tolerance<T: Dtype>() -> f32 {
    match T::DTYPE {
        candle_core::DType::F32 => 1e-6,
        candle_core::DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

fn run_case<T: Dtype>(rng: &mut StdRng, rows: usize, inter: usize, threads: u32) {
    let gate_up = convert::<T>(&normal(rng, rows * 2 * inter, 3.0), 0);
    let want = triage_ops::silu_mul(&tensor(&gate_up, &[rows, 2 * inter]))
        .and_then(|t| Ok(t.flatten_all()?.to_vec1::<T>()?))
        .expect("cpu op");
    let g = launch::silu_mul(rows, inter, threads).expect("geometry");
    let mut got = vec![T::from_f32(f32::NAN); rows * inter];
    let context = format!("{:?} {rows} x {inter} threads {threads}", T::DTYPE);
    silu_mul(&g, &gate_up, &mut got, inter).unwrap_or_else(|e| panic!("{context}: {e}"));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.to_f32(), w.to_f32());
        assert!(
            close(g, w, 1e-30, rel_tolerance::<T>()),
            "{context}: element {i}: kernel {g}, cpu {w}"
        );
    }
}

fn every_case<T: Dtype>(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // One column, a partial block, several blocks with a partial last one, the 1.5B's 8,960.
    for (rows, inter) in [(1, 1), (3, 33), (2, 300), (1, 8960)] {
        for threads in [MIN_THREADS, SILU_MUL_THREADS] {
            run_case::<T>(&mut rng, rows, inter, threads);
        }
    }
}

#[test]
fn f32_silu_mul_matches_the_cpu_op() {
    every_case::<f32>(61);
}

#[test]
fn f16_silu_mul_matches_the_cpu_op() {
    every_case::<f16>(62);
}

#[test]
fn bf16_silu_mul_matches_the_cpu_op() {
    every_case::<bf16>(63);
}
