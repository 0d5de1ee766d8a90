//! `logits_reduce_<dtype>` against `triage_ops::logits_reduce_packed` (the CPU op).

use half::{bf16, f16};
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_kernel_sim::{logits_reduce, OUTPUT_POISON};
use triage_ops::launch::{self, LOGITS_REDUCE_THREADS, MIN_THREADS};
use triage_ops::{logits_reduce_packed, packed_width, MAX_TOP_K};

use crate::inputs::{close, convert, normal, tensor, Dtype};

/// Qwen2's vocabulary (19 chunks merged), one just past a chunk (two, the second 16-byte phase
/// kept), and sizes around the vector widths (4 f32 or 8 f16/bf16 per 16 bytes) and the block
/// sizes.
const VOCABS: [usize; 11] = [1, 2, 3, 7, 8, 9, 33, 1000, 4099, 8193, 151_936];
const KS: [usize; 4] = [0, 1, 5, MAX_TOP_K];

/// Kernel vs CPU op, both computing in f32 from the same converted logits. The CPU op's
/// tolerance table against its f32 reference (triage-ops' tests) bounds lse and logprobs by
/// 5e-5 + 1e-6·|x| and entropy by 5e-5 + 1e-4·|x|; the kernel's summation order differs from
/// the CPU op's as the reference's does, so the same table applies. Max, argmax and ids: exact.
const ABS: f32 = 5e-5;
const REL: f32 = 1e-6;
const ENTROPY_ABS: f32 = 5e-5;
const ENTROPY_REL: f32 = 1e-4;

/// The kinds of rows every launch holds, one row each. `spike` is the dtype's largest round
/// magnitude: a row with ±spike among ordinary logits makes the maximum jump by ~1e38 (f32,
/// bf16), where f32 sums of `s·(m - m')` overflow.
fn rows(rng: &mut StdRng, vocab: usize, spike: f32) -> Vec<Vec<f32>> {
    let scale = rng.random_range(0.5..6.0);
    let normal_row = normal(rng, vocab, scale);
    // Few distinct values: ties in max, argmax and top-k everywhere.
    let ties: Vec<f32> = (0..vocab)
        .map(|_| rng.random_range(0..6) as f32 * 0.75)
        .collect();
    let masked: Vec<f32> = normal(rng, vocab, scale)
        .into_iter()
        .map(|x| {
            if rng.random_bool(0.6) {
                f32::NEG_INFINITY
            } else {
                x
            }
        })
        .collect();
    let with_nan: Vec<f32> = normal(rng, vocab, scale)
        .into_iter()
        .map(|x| if rng.random_bool(0.05) { f32::NAN } else { x })
        .collect();
    let all_masked = vec![f32::NEG_INFINITY; vocab];
    let mut huge: Vec<f32> = normal(rng, vocab, 1e4)
        .into_iter()
        .map(|x| x.clamp(-6e4, 6e4))
        .collect();
    for _ in 0..vocab.div_ceil(100) {
        let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
        huge[rng.random_range(0..vocab)] = sign * spike;
    }
    vec![normal_row, ties, masked, with_nan, all_masked, huge]
}

fn check_rows(got: &[f32], want: &[f32], k: usize, context: &str) {
    let width = packed_width(k);
    for (r, (g, w)) in got.chunks(width).zip(want.chunks(width)).enumerate() {
        let at = |what: &str| format!("{context}, row {r}: {what}: kernel {g:?}, cpu {w:?}");
        assert!(
            g[0] == w[0] || g[0].is_nan() && w[0].is_nan(),
            "{}",
            at("max")
        );
        assert!(close(g[1], w[1], ABS, REL), "{}", at("lse"));
        assert!(
            close(g[2], w[2], ENTROPY_ABS, ENTROPY_REL),
            "{}",
            at("entropy")
        );
        assert_eq!(g[3], w[3], "{}", at("argmax"));
        assert_eq!(g[4..4 + k], w[4..4 + k], "{}", at("top-k ids"));
        for n in 0..k {
            assert!(
                close(g[4 + k + n], w[4 + k + n], ABS, REL),
                "{}",
                at("logprob")
            );
        }
    }
}

fn run_case<T: Dtype>(rng: &mut StdRng, vocab: usize, k: usize, threads: u32, offset: usize) {
    let spike = if T::DTYPE == candle_core::DType::F16 {
        6e4
    } else {
        3e38
    };
    let rows = rows(rng, vocab, spike);
    let flat: Vec<f32> = rows.concat();
    let logits = convert::<T>(&flat, offset);
    let logits = &logits[offset..];
    let want = logits_reduce_packed(&tensor(logits, &[rows.len(), vocab]), k)
        .and_then(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
        .expect("cpu op");
    let g = launch::logits_reduce(rows.len(), vocab, k, threads).expect("geometry");
    let mut got = vec![OUTPUT_POISON; rows.len() * packed_width(k)];
    let context = format!(
        "{:?} vocab {vocab} k {k} threads {threads} offset {offset}",
        T::DTYPE
    );
    logits_reduce(&g, logits, &mut got, vocab, k).unwrap_or_else(|e| panic!("{context}: {e}"));
    check_rows(&got, &want, k, &context);
}

fn every_case<T: Dtype>(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for vocab in VOCABS {
        for k in KS.into_iter().filter(|&k| k <= vocab) {
            for threads in [MIN_THREADS, LOGITS_REDUCE_THREADS] {
                // Offset 1 starts every row off a 16-byte boundary (the kernel's scalar head).
                for offset in [0, 1] {
                    run_case::<T>(&mut rng, vocab, k, threads, offset);
                }
            }
        }
    }
}

#[test]
fn f32_rows_match_the_cpu_op() {
    every_case::<f32>(1);
}

#[test]
fn f16_rows_match_the_cpu_op() {
    every_case::<f16>(2);
}

#[test]
fn bf16_rows_match_the_cpu_op() {
    every_case::<bf16>(3);
}

/// Decode batches: 1 and 16 rows of Qwen2's vocabulary, 64 rows of an odd one.
#[test]
fn batches_match_the_cpu_op() {
    let mut rng = StdRng::seed_from_u64(4);
    for (num_rows, vocab) in [(1, 151_936), (16, 151_936), (64, 4099)] {
        let scale = rng.random_range(1.0..4.0);
        let flat = normal(&mut rng, num_rows * vocab, scale);
        let logits = convert::<bf16>(&flat, 0);
        let want = logits_reduce_packed(&tensor(&logits, &[num_rows, vocab]), MAX_TOP_K)
            .and_then(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
            .expect("cpu op");
        let g = launch::logits_reduce(num_rows, vocab, MAX_TOP_K, LOGITS_REDUCE_THREADS)
            .expect("geometry");
        let mut got = vec![OUTPUT_POISON; num_rows * packed_width(MAX_TOP_K)];
        logits_reduce(&g, &logits, &mut got, vocab, MAX_TOP_K).expect("launch");
        check_rows(
            &got,
            &want,
            MAX_TOP_K,
            &format!("batch {num_rows} x {vocab}"),
        );
    }
}

/// A launch with 32 bytes less dynamic shared memory than its top-k lists need is stopped by the
/// simulator (the last thread's ids land in the guard zone), not silently wrong. Under ASan the
/// same write aborts the process (ASan poisons the guards), so the plain builds run this.
#[cfg(not(sim_sanitize))]
#[test]
fn too_little_shared_memory_is_reported() {
    let mut rng = StdRng::seed_from_u64(5);
    let logits = normal(&mut rng, 1000, 2.0);
    let mut g = launch::logits_reduce(1, 1000, 5, LOGITS_REDUCE_THREADS).expect("geometry");
    g.shared_mem_bytes -= 32;
    let mut out = vec![OUTPUT_POISON; packed_width(5)];
    assert!(logits_reduce(&g, &logits, &mut out, 1000, 5).is_err());
}
