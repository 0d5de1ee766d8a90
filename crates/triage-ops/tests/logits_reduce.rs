//! Fused logits reduction against its naive f32 reference and against closed forms.

use candle_core::{DType, Device, Tensor};
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_ops::{
    logits_reduce, logits_reduce_packed, logits_reduce_slow, packed_width, LogitsStats, OpsError,
    Result, MAX_TOP_K,
};

/// Qwen2's vocabulary: 9.27 chunks of the kernel's 16,384 columns, 593.5 blocks of 256.
const VOCAB: usize = 151_936;

/// Fused vs reference, by input dtype: `|fused - slow| <= abs + rel·|slow|`.
///
/// Both sides compute in f32 from the same converted logits (f16/bf16 → f32 is exact), so the gap
/// is summation order plus the fused op's polynomial `exp` (≤ 2 ulp). The reference sums 151,936
/// terms sequentially in f32, the fused op in 8 lanes per 256-logit block and in f64 across
/// blocks, so nearly all of the gap is the reference's (see [`F64_TOLERANCE`]). Measured worst
/// cases: lse and logprobs 1.2e-5; entropy 1e-5 on f32 normal rows, but 2.5e-4 (2.3e-5 relative,
/// near 11 nats) on rows of a few repeated values, common in f16/bf16, where the reference's
/// rounding errors all go the same way. The bounds leave about 4× margin; the relative lse/logprob
/// part only matters for logits near ±3e38. `max` and `argmax` must match exactly.
const TOLERANCES: [Tolerance; 3] = [
    //             dtype        lse/logprob  entropy
    Tolerance::new(DType::F32, 5e-5, 1e-6, 5e-5, 1e-4),
    Tolerance::new(DType::F16, 5e-5, 1e-6, 5e-5, 1e-4),
    Tolerance::new(DType::BF16, 5e-5, 1e-6, 5e-5, 1e-4),
];

/// Fused vs the same statistics in f64 on the host (any dtype, as the f32 inputs are identical):
/// measured worst case 1e-6 (one f32 ulp at 12 nats); the bound is about 4× that.
const F64_TOLERANCE: Tolerance = Tolerance::new(DType::F64, 4e-6, 1e-7, 4e-6, 4e-7);

#[derive(Debug, Clone, Copy)]
struct Tolerance {
    dtype: DType,
    /// For lse and logprobs.
    abs: f32,
    rel: f32,
    entropy_abs: f32,
    entropy_rel: f32,
}

impl Tolerance {
    const fn new(dtype: DType, abs: f32, rel: f32, entropy_abs: f32, entropy_rel: f32) -> Self {
        Self {
            dtype,
            abs,
            rel,
            entropy_abs,
            entropy_rel,
        }
    }
}

fn tolerance(dtype: DType) -> Tolerance {
    *TOLERANCES
        .iter()
        .find(|t| t.dtype == dtype)
        .expect("dtype in the table")
}

/// Written once for every device: the CPU and, with the `cuda` feature, GPU 0.
fn devices() -> Vec<Device> {
    let devices = vec![Device::Cpu];
    #[cfg(feature = "cuda")]
    let devices = {
        let mut devices = devices;
        devices.push(Device::new_cuda(0).expect("the cuda feature's tests need a CUDA device"));
        devices
    };
    devices
}

fn close(got: f32, want: f32, abs: f32, rel: f32) -> bool {
    got == want || (got - want).abs() <= abs + rel * want.abs()
}

/// Standard normal samples (Box–Muller), scaled and shifted.
fn normal(rng: &mut StdRng, n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.random_range(f32::EPSILON..1.0), rng.random());
            offset + scale * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect()
}

/// Realistic logits: each row a normal with its own spread and offset.
fn random_logits(rng: &mut StdRng, num_rows: usize, vocab: usize) -> Vec<f32> {
    (0..num_rows)
        .flat_map(|_| {
            let (scale, offset) = (rng.random_range(0.5..4.0), rng.random_range(-10.0..10.0));
            normal(rng, vocab, scale, offset)
        })
        .collect()
}

fn tensor(data: Vec<f32>, num_rows: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let vocab = data.len() / num_rows;
    Ok(Tensor::from_vec(data, (num_rows, vocab), device)?.to_dtype(dtype)?)
}

/// Runs both forms and compares every field; returns the fused stats for extra checks.
fn assert_matches_slow(logits: &Tensor, k: usize, what: &str) -> Result<Vec<LogitsStats>> {
    let tol = tolerance(logits.dtype());
    let (fused, slow) = (logits_reduce(logits, k)?, logits_reduce_slow(logits, k)?);
    let rows = logits
        .to_dtype(DType::F32)?
        .reshape((fused.len(), ()))?
        .to_vec2::<f32>()?;
    assert_eq!(fused.len(), slow.len(), "{what}: batch");
    for (row_idx, ((f, s), row)) in fused.iter().zip(&slow).zip(&rows).enumerate() {
        let at = format!("{what}, row {row_idx}");
        assert_eq!(f.max, s.max, "{at}: max");
        assert_eq!(f.argmax, s.argmax, "{at}: argmax");
        assert!(
            close(f.log_sum_exp, s.log_sum_exp, tol.abs, tol.rel),
            "{at}: lse {f:?} vs {s:?}"
        );
        assert!(
            close(f.entropy, s.entropy, tol.entropy_abs, tol.entropy_rel),
            "{at}: entropy {} vs {}",
            f.entropy,
            s.entropy
        );
        assert_top_k_matches(&f.top_k, &s.top_k, row, tol, &at);
        let (lse, entropy) = f64_lse_and_entropy(row);
        let tol = F64_TOLERANCE;
        assert!(
            close(f.log_sum_exp, lse, tol.abs, tol.rel),
            "{at}: lse {} vs f64 {lse}",
            f.log_sum_exp
        );
        assert!(
            close(f.entropy, entropy, tol.entropy_abs, tol.entropy_rel),
            "{at}: entropy {} vs f64 {entropy}",
            f.entropy
        );
    }
    Ok(fused)
}

/// `(lse, entropy)` of one row, accumulated in f64.
fn f64_lse_and_entropy(row: &[f32]) -> (f32, f32) {
    let max = f64::from(row.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    let shifted = || {
        row.iter()
            .map(|&x| f64::from(x) - max)
            .filter(|d| d.is_finite())
    };
    let sum: f64 = shifted().map(f64::exp).sum();
    let sum_shifted: f64 = shifted().map(|d| d.exp() * d).sum();
    (
        (max + sum.ln()) as f32,
        (sum.ln() - sum_shifted / sum) as f32,
    )
}

/// Ids must be identical except where two logprobs tie within tolerance (then the fused id's own
/// logprob must match the reference's at that rank).
fn assert_top_k_matches(
    fused: &[(u32, f32)],
    slow: &[(u32, f32)],
    row: &[f32],
    tol: Tolerance,
    at: &str,
) {
    assert_eq!(fused.len(), slow.len(), "{at}: top-k length");
    for (rank, (&(id_f, lp_f), &(id_s, lp_s))) in fused.iter().zip(slow).enumerate() {
        assert!(
            close(lp_f, lp_s, tol.abs, tol.rel),
            "{at}: logprob at rank {rank}: {lp_f} vs {lp_s}"
        );
        if id_f != id_s {
            let lp_of_fused_id = lp_s + (row[id_f as usize] - row[id_s as usize]);
            assert!(
                close(lp_of_fused_id, lp_s, tol.abs, tol.rel),
                "{at}: rank {rank} id {id_f} vs {id_s} without a tie"
            );
        }
    }
    let mut ids: Vec<u32> = fused.iter().map(|&(id, _)| id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), fused.len(), "{at}: repeated top-k ids");
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[test]
fn random_logits_match_slow() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(1);
    for device in devices() {
        for dtype in DTYPES {
            for num_rows in [1, 3, 16] {
                let logits = tensor(
                    random_logits(&mut rng, num_rows, VOCAB),
                    num_rows,
                    dtype,
                    &device,
                )?;
                assert_matches_slow(
                    &logits,
                    MAX_TOP_K,
                    &format!("{dtype:?} [{num_rows}, {VOCAB}]"),
                )?;
            }
        }
    }
    Ok(())
}

#[test]
fn neg_inf_entries_match_slow() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(2);
    for device in devices() {
        for dtype in DTYPES {
            let mut data = random_logits(&mut rng, 3, VOCAB);
            for x in data.iter_mut() {
                if rng.random_bool(0.3) {
                    *x = f32::NEG_INFINITY; // masked tokens, as a grammar or a banned-token list sets
                }
            }
            // Whole chunks and the first column masked in row 0.
            data[..40_000].fill(f32::NEG_INFINITY);
            data[VOCAB - 1] = f32::NEG_INFINITY;
            assert_matches_slow(
                &tensor(data, 3, dtype, &device)?,
                MAX_TOP_K,
                &format!("{dtype:?} -inf"),
            )?;
        }
    }
    Ok(())
}

#[test]
fn one_finite_logit_per_row() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(3);
    let positions = [0, 16_383, 16_384, rng.random_range(0..VOCAB), VOCAB - 1];
    let values: Vec<f32> = (0..positions.len())
        .map(|_| rng.random_range(-20.0..20.0))
        .collect();
    for device in devices() {
        for dtype in DTYPES {
            let mut data = vec![f32::NEG_INFINITY; positions.len() * VOCAB];
            for (row_idx, (&pos, &value)) in positions.iter().zip(&values).enumerate() {
                data[row_idx * VOCAB + pos] = value;
            }
            let logits = tensor(data, positions.len(), dtype, &device)?;
            let stats = assert_matches_slow(&logits, MAX_TOP_K, &format!("{dtype:?} one-hot"))?;
            for (s, &pos) in stats.iter().zip(&positions) {
                assert_eq!(
                    (s.entropy, s.argmax, s.log_sum_exp),
                    (0.0, pos as u32, s.max)
                );
                assert_eq!(s.top_k[0], (pos as u32, 0.0));
                // The rest tie at -inf and come in id order.
                let rest: Vec<u32> = (0..VOCAB as u32)
                    .filter(|&id| id != pos as u32)
                    .take(MAX_TOP_K - 1)
                    .collect();
                assert_eq!(
                    s.top_k[1..].iter().map(|&(id, _)| id).collect::<Vec<_>>(),
                    rest
                );
                assert!(s.top_k[1..].iter().all(|&(_, lp)| lp == f32::NEG_INFINITY));
            }
        }
    }
    Ok(())
}

/// Scale 1e4 leaves one token with nearly all the mass. Spikes of ±3e38 (±6e4 in f16, whose
/// largest finite value is 65504) share the mass among the +3e38 spikes (entropy ≈ ln 25). The
/// reference stays finite and accurate there because it works on `x - max`, which is never
/// positive: its `exp` can only underflow (to 0, masked out of `p·log p`, and `-3e38 - 3e38`
/// overflows only to `-inf`), and its logprobs are `(x - max) - ln(sum)` rather than `x - lse`,
/// whose ulp near 3e38 is ~1e31. Only `lse = max + ln(sum)` itself rounds to `max` there, which
/// is its correctly rounded value.
#[test]
fn huge_magnitudes_match_slow() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(4);
    for device in devices() {
        for dtype in DTYPES {
            let spike = if dtype == DType::F16 { 6e4 } else { 3e38 };
            let mut data = normal(&mut rng, 3 * VOCAB, 1e4, 0.0);
            data.iter_mut().for_each(|x| *x = x.clamp(-6e4, 6e4));
            for row_idx in 1..3 {
                for _ in 0..50 {
                    let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                    data[row_idx * VOCAB + rng.random_range(0..VOCAB)] = sign * spike;
                }
            }
            data[2 * VOCAB + 7] = -spike; // row 2 also spans the whole range from its first block
            assert_matches_slow(
                &tensor(data, 3, dtype, &device)?,
                MAX_TOP_K,
                &format!("{dtype:?} huge"),
            )?;
        }
    }
    Ok(())
}

#[test]
fn ties_resolve_to_lowest_index() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(5);
    for device in devices() {
        for dtype in DTYPES {
            // Row 0: few distinct values, so every rank is a tie.
            let mut data: Vec<f32> = (0..2 * VOCAB)
                .map(|_| rng.random_range(0..5) as f32 - 2.5)
                .collect();
            // Row 1: the maximum only at three columns, in different chunks, lowest not first seen.
            let row1 = &mut data[VOCAB..];
            row1.iter_mut().for_each(|x| *x = x.min(1.5));
            for pos in [151_935, 16_384, 40_000] {
                row1[pos] = 9.0;
            }
            let stats =
                assert_matches_slow(&tensor(data.clone(), 2, dtype, &device)?, MAX_TOP_K, "ties")?;
            let first_max: Vec<u32> = (0..VOCAB as u32)
                .filter(|&i| data[i as usize] == 1.5)
                .take(MAX_TOP_K)
                .collect();
            assert_eq!(stats[0].argmax, first_max[0]);
            assert_eq!(
                stats[0].top_k.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
                first_max
            );
            assert_eq!(stats[1].argmax, 16_384);
            let top3: Vec<u32> = stats[1].top_k[..3].iter().map(|&(id, _)| id).collect();
            assert_eq!(top3, [16_384, 40_000, 151_935]);
        }
    }
    Ok(())
}

#[test]
fn k_zero_and_k_max() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(6);
    for device in devices() {
        let logits = tensor(random_logits(&mut rng, 3, VOCAB), 3, DType::F32, &device)?;
        let packed = logits_reduce_packed(&logits, 0)?;
        assert_eq!(packed.dims(), [3, packed_width(0)]);
        let none = assert_matches_slow(&logits, 0, "k = 0")?;
        let all = assert_matches_slow(&logits, MAX_TOP_K, "k = 20")?;
        for (a, b) in none.iter().zip(&all) {
            assert!(a.top_k.is_empty());
            assert_eq!(b.top_k.len(), MAX_TOP_K);
            assert_eq!(
                (a.max, a.log_sum_exp, a.entropy, a.argmax),
                (b.max, b.log_sum_exp, b.entropy, b.argmax)
            );
        }
    }
    Ok(())
}

/// The kernel splits rows into chunks of 16,384 columns and those into blocks of 256 read in
/// lanes of 8; these sizes hit every partial chunk, block and lane, and a row shorter than k.
#[test]
fn vocab_sizes_around_chunks_and_blocks() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(7);
    for device in devices() {
        for dtype in [DType::F32, DType::BF16] {
            for vocab in [1, 7, 20, 255, 257, 16_383, 16_384, 16_385, 3 * 16_384 + 37] {
                let logits = tensor(random_logits(&mut rng, 2, vocab), 2, dtype, &device)?;
                let k = vocab.min(MAX_TOP_K);
                assert_matches_slow(&logits, k, &format!("{dtype:?} vocab {vocab}"))?;
            }
        }
    }
    Ok(())
}

#[test]
fn one_dimensional_input_is_batch_one() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(8);
    for device in devices() {
        let data = random_logits(&mut rng, 1, VOCAB);
        let flat = Tensor::from_vec(data.clone(), VOCAB, &device)?;
        let stats = assert_matches_slow(&flat, 5, "1-D")?;
        assert_eq!(
            stats,
            logits_reduce(&tensor(data, 1, DType::F32, &device)?, 5)?
        );
        assert_eq!(logits_reduce_packed(&flat, 5)?.dims(), [1, packed_width(5)]);
    }
    Ok(())
}

#[test]
fn non_contiguous_input_matches_contiguous() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(9);
    for device in devices() {
        let data = random_logits(&mut rng, 1, 4 * 20_000);
        let transposed = Tensor::from_vec(data, (20_000, 4), &device)?.t()?;
        assert!(!transposed.is_contiguous());
        let stats = assert_matches_slow(&transposed, MAX_TOP_K, "transposed")?;
        assert_eq!(stats, logits_reduce(&transposed.contiguous()?, MAX_TOP_K)?);
    }
    Ok(())
}

#[test]
fn packed_layout_round_trips() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(10);
    for device in devices() {
        let logits = tensor(random_logits(&mut rng, 3, 1000), 3, DType::BF16, &device)?;
        let packed = logits_reduce_packed(&logits, 4)?;
        assert_eq!((packed.dims(), packed.dtype()), (&[3, 12][..], DType::F32));
        let stats = logits_reduce(&logits, 4)?;
        assert_eq!(LogitsStats::from_packed_rows(&packed, 4)?, stats);
        for (row, s) in packed.to_vec2::<f32>()?.iter().zip(&stats) {
            assert_eq!(row[..4], [s.max, s.log_sum_exp, s.entropy, s.argmax as f32]);
            assert_eq!(row[4] as u32, s.top_k[0].0);
            assert_eq!(row[8], s.top_k[0].1);
        }
    }
    Ok(())
}

/// Uniform over n tokens: entropy ln n, lse c + ln n, every logprob -ln n, ids in order.
#[test]
fn uniform_entropy_is_ln_n() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(11);
    for device in devices() {
        for n in [1usize, 2, 3, 1000, VOCAB] {
            let c: f32 = rng.random_range(-30.0..30.0);
            let ln_n = (n as f32).ln();
            let k = n.min(MAX_TOP_K);
            for dtype in DTYPES {
                let logits = Tensor::full(c, n, &device)?.to_dtype(dtype)?;
                let c = logits.to_dtype(DType::F32)?.to_vec1::<f32>()?[0];
                let s = &logits_reduce(&logits, k)?[0];
                assert!(
                    close(s.entropy, ln_n, 1e-5, 1e-5),
                    "n {n}: entropy {}",
                    s.entropy
                );
                assert!(
                    close(s.log_sum_exp, c + ln_n, 1e-5, 1e-6),
                    "n {n}: lse {}",
                    s.log_sum_exp
                );
                assert_eq!(s.argmax, 0);
                for (rank, &(id, lp)) in s.top_k.iter().enumerate() {
                    assert_eq!(id, rank as u32);
                    assert!(close(lp, -ln_n, 1e-5, 1e-5), "n {n}: logprob {lp}");
                }
            }
        }
    }
    Ok(())
}

/// Logits `c + ln [1, 2, 3, 4]` give p = [0.1, 0.2, 0.3, 0.4].
#[test]
fn entropy_of_hand_example() -> Result<()> {
    let c: f32 = StdRng::seed_from_u64(12).random_range(-5.0..5.0);
    let logits: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|w| c + w.ln()).collect();
    let expected: f64 = [0.1f64, 0.2, 0.3, 0.4].iter().map(|p| -p * p.ln()).sum();
    for device in devices() {
        let s = &logits_reduce(&Tensor::new(logits.as_slice(), &device)?, 4)?[0];
        assert!(
            close(s.entropy, expected as f32, 1e-6, 1e-6),
            "entropy {} vs {expected}",
            s.entropy
        );
        assert_eq!(s.argmax, 3);
        assert_eq!(
            s.top_k.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
            [3, 2, 1, 0]
        );
        assert!(close(s.top_k[3].1, 0.1f32.ln(), 1e-6, 1e-6));
    }
    Ok(())
}

/// A row without a finite logit has no distribution: documented as lse = -inf, entropy NaN.
#[test]
fn all_neg_inf_row_is_flagged() -> Result<()> {
    for device in devices() {
        let logits = Tensor::full(f32::NEG_INFINITY, (2, 300), &device)?;
        for s in logits_reduce(&logits, 3)? {
            assert_eq!(
                (s.max, s.log_sum_exp, s.argmax),
                (f32::NEG_INFINITY, f32::NEG_INFINITY, 0)
            );
            assert!(s.entropy.is_nan());
            assert_eq!(
                s.top_k.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
                [0, 1, 2]
            );
        }
    }
    Ok(())
}

#[test]
fn invalid_arguments_are_rejected() -> Result<()> {
    let is_invalid = |r: Result<Vec<LogitsStats>>| matches!(r, Err(OpsError::InvalidArgument(_)));
    for device in devices() {
        let logits = Tensor::ones((2, 30), DType::F32, &device)?;
        let cases = [
            (logits.clone(), MAX_TOP_K + 1, "k > 20"),
            (logits.narrow(1, 0, 5)?, 6, "k > vocab"),
            (logits.reshape((2, 3, 10))?, 1, "3-D"),
            (Tensor::new(1f32, &device)?, 0, "scalar"),
            (
                Tensor::zeros((2, 0), DType::F32, &device)?,
                0,
                "empty vocab",
            ),
            (logits.to_dtype(DType::F64)?, 1, "f64"),
            (logits.to_dtype(DType::U32)?, 1, "u32"),
        ];
        for (t, k, what) in cases {
            assert!(is_invalid(logits_reduce(&t, k)), "fused: {what}");
            assert!(is_invalid(logits_reduce_slow(&t, k)), "slow: {what}");
        }
        let packed = logits_reduce_packed(&logits, 2)?;
        assert!(is_invalid(LogitsStats::from_packed_rows(&packed, 3)));
    }
    Ok(())
}
