//! CPU kernel of the fused logits reduction: a mergeable online (max, Σexp, Σexp·x, top-k) state.
//!
//! Each chunk of a row is read once. Within a chunk the logits go through L1-sized blocks: the
//! block's maximum rescales the running sums (at most once per block), then the exponentials of
//! the block are summed in vector lanes. Chunks of one row run in parallel and their states are
//! merged in column order, so the result does not depend on the number of threads. On x86-64
//! the same code is also compiled for AVX2 and picked at run time (2–3× faster than SSE2).

use half::{bf16, f16};

use super::MAX_TOP_K;

/// Logits reduced together; 1 KiB of f32, so the block stays in L1 between its passes.
const BLOCK: usize = 256;
/// Accumulator lanes: eight f32 fill an AVX register, and LLVM splits them in two on SSE2.
const LANES: usize = 8;
/// Columns per parallel task. A 151,936-token vocabulary gives 10 tasks per row, enough to keep
/// every core busy at batch 1 (decode) while the merge cost stays negligible.
const CHUNK: usize = 16 * 1024;
/// Shifted logits `x - max` are clamped here before `exp`. `exp` of anything below about -87 is
/// flushed to zero anyway, and the clamp turns `-inf` into a finite value, so that the entropy
/// term `exp(d)·d` is `0·(-104) = 0` rather than `0·(-inf) = NaN`.
const MIN_SHIFTED: f32 = -104.0;

/// A logit element type the kernel reads directly, converting one block at a time.
pub(crate) trait Logit: Copy + Send + Sync {
    /// The block as f32: borrowed for f32, converted into `buf` otherwise.
    fn block_as_f32<'a>(xs: &'a [Self], buf: &'a mut [f32; BLOCK]) -> &'a [f32];
}

impl Logit for f32 {
    #[inline(always)]
    fn block_as_f32<'a>(xs: &'a [Self], _buf: &'a mut [f32; BLOCK]) -> &'a [f32] {
        xs
    }
}

impl Logit for f16 {
    #[inline(always)]
    fn block_as_f32<'a>(xs: &'a [Self], buf: &'a mut [f32; BLOCK]) -> &'a [f32] {
        for (dst, x) in buf.iter_mut().zip(xs) {
            *dst = x.to_f32();
        }
        &buf[..xs.len()]
    }
}

impl Logit for bf16 {
    #[inline(always)]
    fn block_as_f32<'a>(xs: &'a [Self], buf: &'a mut [f32; BLOCK]) -> &'a [f32] {
        for (dst, x) in buf.iter_mut().zip(xs) {
            *dst = x.to_f32();
        }
        &buf[..xs.len()]
    }
}

/// Reduces a contiguous `[num_rows, vocab]` buffer into the packed layout
/// `[num_rows, 4 + 2k]` (see [`super::FusedLogitsReduce`]). The caller has checked `vocab >= 1`,
/// `k <= min(vocab, MAX_TOP_K)` and `vocab <= 2^24`.
pub(crate) fn reduce_rows<T: Logit>(data: &[T], vocab: usize, k: usize) -> Vec<f32> {
    let width = super::packed_width(k);
    let num_rows = data.len() / vocab;
    let chunks_per_row = vocab.div_ceil(CHUNK);
    // One task per (row, chunk): batch 1 splits its row over the cores, larger batches spread
    // their rows; `map` keeps index order, which makes the merge deterministic.
    let states: Vec<OnlineState> = crate::cpu::pool::map(num_rows * chunks_per_row, |task_idx| {
        let (row_idx, chunk_idx) = (task_idx / chunks_per_row, task_idx % chunks_per_row);
        let start = chunk_idx * CHUNK;
        let end = vocab.min(start + CHUNK);
        let row = &data[row_idx * vocab..(row_idx + 1) * vocab];
        reduce_chunk(&row[start..end], start as u32, k)
    });
    let mut packed = vec![0f32; num_rows * width];
    for (dst, row_states) in packed.chunks_mut(width).zip(states.chunks(chunks_per_row)) {
        let mut state = row_states[0]; // `vocab >= 1`, so every row has at least one chunk
        for other in &row_states[1..] {
            state.merge(other);
        }
        state.write_packed(dst);
    }
    packed
}

/// The online state of one chunk of a row, starting at column `first_id`.
fn reduce_chunk<T: Logit>(xs: &[T], first_id: u32, k: usize) -> OnlineState {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::Isa::get().avx2 {
        #[allow(unsafe_code)]
        // SAFETY: `reduce_chunk_avx2` only requires the AVX2 target feature, detected just above.
        return unsafe { reduce_chunk_avx2(xs, first_id, k) };
    }
    reduce_chunk_portable(xs, first_id, k)
}

/// The same code compiled for 8-wide AVX2 lanes (the default x86-64 target has only SSE2). No FMA
/// is enabled and the lane layout is the same, so the results are bit-identical to SSE2's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn reduce_chunk_avx2<T: Logit>(xs: &[T], first_id: u32, k: usize) -> OnlineState {
    reduce_chunk_portable(xs, first_id, k)
}

/// Inlined into both the baseline and the AVX2 entry points, so each gets its own codegen.
#[inline(always)]
fn reduce_chunk_portable<T: Logit>(xs: &[T], first_id: u32, k: usize) -> OnlineState {
    let mut state = OnlineState::new(first_id, k);
    let mut buf = [0f32; BLOCK];
    for (block_idx, block) in xs.chunks(BLOCK).enumerate() {
        let block = T::block_as_f32(block, &mut buf);
        state.update_block(block, first_id + (block_idx * BLOCK) as u32);
    }
    state
}

/// Running statistics of the logits seen so far, relative to their running maximum `m`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OnlineState {
    /// Running maximum `m` (`-inf` until a finite logit has been seen).
    max: f32,
    /// Column of the first occurrence of `max`.
    argmax: u32,
    /// `s = Σ exp(x - m)`; f64 because it gathers one f32 partial sum per block.
    sum_exp: f64,
    /// `t = Σ exp(x - m)·(x - m)`, so that the entropy is `ln s - t/s`.
    sum_exp_shifted: f64,
    top: TopK,
}

impl OnlineState {
    fn new(first_id: u32, k: usize) -> Self {
        Self {
            max: f32::NEG_INFINITY,
            argmax: first_id,
            sum_exp: 0.0,
            sum_exp_shifted: 0.0,
            top: TopK::new(k),
        }
    }

    #[inline(always)]
    fn update_block(&mut self, xs: &[f32], first_id: u32) {
        let block_max = max_of(xs);
        if block_max > self.max {
            // `block_max` is one of `xs` (unless every entry is NaN, which `>` rules out here).
            let pos = xs.iter().position(|&x| x == block_max).unwrap_or(0);
            self.argmax = first_id + pos as u32;
            self.rescale_to(block_max);
        }
        if self.top.accepts(block_max) {
            self.top.offer_block(xs, first_id);
        }
        if block_max == f32::NEG_INFINITY {
            return; // exp(-inf) = 0: nothing to add, and `x - m` could be `-inf - -inf`.
        }
        let (s, t) = exp_sums(xs, self.max);
        self.sum_exp += f64::from(s);
        self.sum_exp_shifted += f64::from(t);
    }

    /// Moves the reference point from `m` to `m' >= m`: with `r = exp(m - m')`,
    /// `s' = r·s` and `t' = r·(t + s·(m - m'))`.
    fn rescale_to(&mut self, new_max: f32) {
        // An empty state has `m = -inf`; skipping it avoids `0·(-inf)`. A non-empty one has a
        // finite `m`, and the f64 difference of two finite f32 never overflows.
        if self.sum_exp > 0.0 {
            let shift = f64::from(self.max) - f64::from(new_max);
            let ratio = shift.exp();
            self.sum_exp_shifted = ratio * (self.sum_exp_shifted + self.sum_exp * shift);
            self.sum_exp *= ratio;
        }
        self.max = new_max;
    }

    /// Folds in the state of the chunk that follows this one in the row.
    pub(crate) fn merge(&mut self, later: &Self) {
        if later.max > self.max {
            self.argmax = later.argmax; // on ties the earlier chunk keeps the lower index
        }
        let new_max = self.max.max(later.max);
        let mut later_rescaled = *later;
        later_rescaled.rescale_to(new_max);
        self.rescale_to(new_max);
        self.sum_exp += later_rescaled.sum_exp;
        self.sum_exp_shifted += later_rescaled.sum_exp_shifted;
        self.top = self.top.merged(&later.top);
    }

    /// `[max, lse, entropy, argmax, ids.., logprobs..]`. A row without a finite logit gives
    /// `lse = -inf` and NaN entropy and logprobs.
    fn write_packed(&self, dst: &mut [f32]) {
        let log_sum = self.sum_exp.ln();
        let lse = f64::from(self.max) + log_sum;
        // `ln s - t/s` is >= 0 mathematically; a one-hot row can round a hair below.
        let entropy = (log_sum - self.sum_exp_shifted / self.sum_exp).max(0.0);
        let k = self.top.k;
        dst[0] = self.max;
        dst[1] = lse as f32;
        dst[2] = if self.sum_exp > 0.0 {
            entropy as f32
        } else {
            f32::NAN
        };
        dst[3] = self.argmax as f32;
        for i in 0..k {
            dst[4 + i] = self.top.ids[i] as f32;
            // `(x - m) - ln s`, not `x - lse`: near ±3e38 one ulp of lse is ~1e31.
            let shifted = f64::from(self.top.vals[i]) - f64::from(self.max);
            dst[4 + k + i] = (shifted - log_sum) as f32;
        }
    }
}

/// The `k` largest logits seen so far, in (value descending, id ascending) order.
#[derive(Debug, Clone, Copy)]
struct TopK {
    k: usize,
    len: usize,
    vals: [f32; MAX_TOP_K],
    ids: [u32; MAX_TOP_K],
}

impl TopK {
    fn new(k: usize) -> Self {
        Self {
            k,
            len: 0,
            vals: [f32::NEG_INFINITY; MAX_TOP_K],
            ids: [0; MAX_TOP_K],
        }
    }

    /// Ids arrive in increasing order, so an equal value never displaces an earlier entry.
    #[inline(always)]
    fn accepts(&self, x: f32) -> bool {
        self.len < self.k || (self.k > 0 && x > self.vals[self.k - 1])
    }

    /// Offers consecutive ids from `first_id`. A fresh buffer (one per chunk) keeps accepting for
    /// a while: about k·ln(n/k) inserts over n logits, spread over most blocks. So each group of
    /// lanes is first tested with one vector compare, and only a hit is scanned one by one.
    #[inline(always)]
    fn offer_block(&mut self, xs: &[f32], first_id: u32) {
        let mut groups = xs.chunks_exact(LANES);
        let mut group_first = first_id;
        for group in &mut groups {
            // `len == k` with `k == 0` never reaches here: `accepts` is false for every block then.
            if self.len < self.k || any_above(group, self.vals[self.k - 1]) {
                self.offer(group, group_first);
            }
            group_first += LANES as u32;
        }
        self.offer(groups.remainder(), group_first);
    }

    /// A NaN logit counts as `-inf` here as everywhere else in the op (and in the CUDA kernel).
    #[inline(always)]
    fn offer(&mut self, xs: &[f32], first_id: u32) {
        for (i, &x) in xs.iter().enumerate() {
            let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
            if self.accepts(x) {
                self.insert(x, first_id + i as u32);
            }
        }
    }

    /// Inserts after every entry `>= x`; the caller has checked [`Self::accepts`].
    #[inline(always)]
    fn insert(&mut self, x: f32, id: u32) {
        let mut pos = self.len.min(self.k - 1);
        while pos > 0 && self.vals[pos - 1] < x {
            self.vals[pos] = self.vals[pos - 1];
            self.ids[pos] = self.ids[pos - 1];
            pos -= 1;
        }
        self.vals[pos] = x;
        self.ids[pos] = id;
        self.len = (self.len + 1).min(self.k);
    }

    /// The top `k` of both lists; `later`'s ids are all greater than `self`'s.
    fn merged(&self, later: &Self) -> Self {
        let mut out = Self::new(self.k);
        let (mut a, mut b) = (0, 0);
        while out.len < self.k && (a < self.len || b < later.len) {
            let take_self = b == later.len || (a < self.len && self.vals[a] >= later.vals[b]);
            let (val, id) = if take_self {
                a += 1;
                (self.vals[a - 1], self.ids[a - 1])
            } else {
                b += 1;
                (later.vals[b - 1], later.ids[b - 1])
            };
            out.vals[out.len] = val;
            out.ids[out.len] = id;
            out.len += 1;
        }
        out
    }
}

/// Whether any of the first `LANES` values exceeds `threshold` (one vector compare).
#[inline(always)]
fn any_above(group: &[f32], threshold: f32) -> bool {
    let group = &group[..LANES];
    let mut any = false;
    for &x in group {
        any |= x > threshold;
    }
    any
}

/// Maximum of a block, in lanes so that it vectorises (NaN entries are ignored).
#[inline(always)]
fn max_of(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = if x > *lane { x } else { *lane };
        }
    }
    let tail = chunks.remainder().iter();
    lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// `(Σ exp(x - max), Σ exp(x - max)·(x - max))` over a block, in vector lanes.
#[inline(always)]
fn exp_sums(xs: &[f32], max: f32) -> (f32, f32) {
    let mut sums = [0f32; LANES];
    let mut shifted_sums = [0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for j in 0..LANES {
            let d = clamp_shifted(chunk[j] - max);
            let e = exp_nonpositive(d);
            sums[j] += e;
            shifted_sums[j] += e * d;
        }
    }
    for &x in chunks.remainder() {
        let d = clamp_shifted(x - max);
        let e = exp_nonpositive(d);
        sums[0] += e;
        shifted_sums[0] += e * d;
    }
    (sums.iter().sum(), shifted_sums.iter().sum())
}

#[inline(always)]
fn clamp_shifted(d: f32) -> f32 {
    if d > MIN_SHIFTED {
        d
    } else {
        MIN_SHIFTED
    }
}

/// `exp(d)` for `d` in `[MIN_SHIFTED, 0]`, within 2 ulp; results below about 2^-126.5 (that is
/// `d < -87.7`) are flushed to zero.
///
/// Cephes `expf` without its branches, so the loop in [`exp_sums`] vectorises; libm's `expf` is a
/// scalar call per logit and would dominate the reduction.
#[inline(always)]
pub(crate) fn exp_nonpositive(d: f32) -> f32 {
    // Adding 1.5·2^23 rounds to an integer that then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let z = d * std::f32::consts::LOG2_E + ROUND;
    let n = z - ROUND;
    let r = d - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let poly = p * r * r + r + 1.0;
    let n_int = (z.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    // 2^n as an f32 bit pattern. Below n = -126 the biased exponent is clamped to 0, which makes
    // 2^n (and so the result) +0.0: an integer max, where an `if` would become a branch per lane.
    let biased_exponent = n_int.wrapping_add(127).max(0);
    poly * f32::from_bits((biased_exponent << 23) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    #[test]
    fn exp_nonpositive_matches_libm() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..100_000 {
            let d: f32 = rng.random_range(-87.3..=0.0);
            let (fast, exact) = (exp_nonpositive(d), f64::from(d).exp());
            let rel = (f64::from(fast) - exact).abs() / exact;
            assert!(rel < 3e-7, "exp({d}) = {fast}, want {exact} (rel {rel})");
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-87.8), 0.0);
        assert_eq!(exp_nonpositive(MIN_SHIFTED), 0.0);
        assert_eq!(exp_nonpositive(clamp_shifted(f32::NEG_INFINITY)), 0.0);
    }

    #[test]
    fn merged_chunks_equal_one_pass() {
        let mut rng = StdRng::seed_from_u64(11);
        let xs: Vec<f32> = (0..3000)
            .map(|_| (rng.random_range(-8i32..8) as f32) * 0.5 + 0.25)
            .collect();
        let k = MAX_TOP_K;
        let whole = reduce_chunk(&xs, 0, k);
        for split in [1, 255, 256, 1000, 2999] {
            let mut state = reduce_chunk(&xs[..split], 0, k);
            state.merge(&reduce_chunk(&xs[split..], split as u32, k));
            assert_eq!(state.max, whole.max);
            assert_eq!(state.argmax, whole.argmax);
            assert_eq!(state.top.ids, whole.top.ids, "split at {split}");
            assert_eq!(state.top.vals, whole.top.vals);
            let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
            assert!(rel(state.sum_exp, whole.sum_exp) < 1e-6);
            assert!(rel(state.sum_exp_shifted, whole.sum_exp_shifted) < 1e-5);
        }
    }

    /// On an AVX2 machine `reduce_chunk` takes the AVX2 path; the portable one is compiled for
    /// the baseline target here. Both must agree to the bit.
    #[test]
    fn portable_and_dispatched_paths_agree_bitwise() {
        let mut rng = StdRng::seed_from_u64(13);
        let xs: Vec<f32> = (0..CHUNK + 77)
            .map(|_| {
                let x: f32 = rng.random_range(-30.0..30.0);
                if rng.random_bool(0.1) {
                    f32::NEG_INFINITY
                } else {
                    x
                }
            })
            .collect();
        let fingerprint = |s: OnlineState| {
            let vals = s.top.vals.map(f32::to_bits);
            (
                s.max.to_bits(),
                s.argmax,
                s.sum_exp.to_bits(),
                s.sum_exp_shifted.to_bits(),
                s.top.ids,
                vals,
            )
        };
        let (dispatched, portable) = (
            reduce_chunk(&xs, 5, MAX_TOP_K),
            reduce_chunk_portable(&xs, 5, MAX_TOP_K),
        );
        assert_eq!(fingerprint(dispatched), fingerprint(portable));
    }

    /// NaN logits give exactly what `-inf` gives, in every column (the CUDA kernel's rule too),
    /// also when a row has fewer finite logits than k.
    #[test]
    fn nan_counts_as_negative_infinity() {
        let mut rng = StdRng::seed_from_u64(5);
        for vocab in [3, 40, CHUNK + 9] {
            let finite: Vec<f32> = (0..vocab).map(|_| rng.random_range(-5.0..5.0)).collect();
            let holes: Vec<bool> = (0..vocab).map(|i| i == 0 || rng.random_bool(0.7)).collect();
            let with = |hole: f32| -> Vec<f32> {
                finite
                    .iter()
                    .zip(&holes)
                    .map(|(&x, &h)| if h { hole } else { x })
                    .collect()
            };
            for k in [0, 1, vocab.min(MAX_TOP_K)] {
                let nan = reduce_rows(&with(f32::NAN), vocab, k);
                let masked = reduce_rows(&with(f32::NEG_INFINITY), vocab, k);
                let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&nan), bits(&masked), "vocab {vocab} k {k}");
            }
        }
    }

    #[test]
    fn top_k_keeps_value_then_id_order() {
        let mut rng = StdRng::seed_from_u64(3);
        let xs: Vec<f32> = (0..500).map(|_| rng.random_range(0..6) as f32).collect();
        let state = reduce_chunk(&xs, 0, 5);
        let mut expected: Vec<(u32, f32)> =
            (0..xs.len() as u32).map(|i| (i, xs[i as usize])).collect();
        expected.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let got: Vec<(u32, f32)> = (0..5)
            .map(|i| (state.top.ids[i], state.top.vals[i]))
            .collect();
        assert_eq!(got, expected[..5]);
    }
}
