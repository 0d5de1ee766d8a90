//! `add_rms_norm_<dtype>` against `triage_ops::rms_norm` (the CPU ops) on the same values: the
//! residual after the add bit for bit, the normalised rows within a rounding of the dtype.

use half::{bf16, f16};
use rand::{rngs::StdRng, SeedableRng};
use triage_kernel_sim::add_rms_norm;
use triage_ops::launch::{self, MIN_THREADS, RMS_NORM_THREADS};
use triage_ops::{add_rms_norm as cpu_add_rms_norm, rms_norm_to};

use crate::inputs::{close, convert, normal, tensor, Dtype};

/// The sums of squares run in another order (per-thread strides, then a tree): ~1e-6 relative
/// on the scale, then one rounding to the dtype.
fn rel_tolerance<T: Dtype>() -> f32 {
    match T::DTYPE {
        candle_core::DType::F32 => 1e-5,
        candle_core::DType::F16 => 1.5e-3,
        _ => 1e-2,
    }
}

fn run_case<T: Dtype>(
    rng: &mut StdRng,
    rows: usize,
    hidden: usize,
    threads: u32,
    with_delta: bool,
) {
    let start = normal(rng, rows * hidden, 2.0);
    let delta = convert::<T>(&normal(rng, rows * hidden, 1.0), 0);
    let weight = normal(rng, hidden, 1.0);
    let w = tensor(&weight, &[hidden]);
    let residual = tensor(&start, &[rows, hidden]);
    let want = match with_delta {
        true => cpu_add_rms_norm(&residual, &tensor(&delta, &[rows, hidden]), &w, 1e-6),
        false => rms_norm_to(&residual, &w, 1e-6, T::DTYPE),
    };
    let want = want
        .and_then(|t| Ok(t.flatten_all()?.to_vec1::<T>()?))
        .expect("cpu op");
    let want_residual = residual.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let g = launch::rms_norm(rows, threads).expect("geometry");
    let mut got_residual = start.clone();
    let mut got = vec![T::from_f32(f32::NAN); rows * hidden];
    let context = format!(
        "{:?} {rows} x {hidden} threads {threads} delta {with_delta}",
        T::DTYPE
    );
    let delta = with_delta.then_some(&delta[..]);
    add_rms_norm(&g, &mut got_residual, delta, &weight, &mut got, 1e-6)
        .unwrap_or_else(|e| panic!("{context}: {e}"));
    assert_eq!(got_residual, want_residual, "{context}: the residual");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.to_f32(), w.to_f32());
        assert!(
            close(g, w, 1e-6, rel_tolerance::<T>()),
            "{context}: element {i}: kernel {g}, cpu {w}"
        );
    }
}

fn every_case<T: Dtype>(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // A row of one, one under a warp, past a block, the 1.5B's 1,536.
    for (rows, hidden) in [(2, 1), (3, 31), (2, 300), (1, 1536)] {
        for threads in [MIN_THREADS, RMS_NORM_THREADS] {
            for with_delta in [true, false] {
                run_case::<T>(&mut rng, rows, hidden, threads, with_delta);
            }
        }
    }
}

#[test]
fn f32_add_rms_norm_matches_the_cpu_op() {
    every_case::<f32>(71);
}

#[test]
fn f16_add_rms_norm_matches_the_cpu_op() {
    every_case::<f16>(72);
}

#[test]
fn bf16_add_rms_norm_matches_the_cpu_op() {
    every_case::<bf16>(73);
}
