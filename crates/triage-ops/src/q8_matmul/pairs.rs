//! The AVX-512 VNNI kernel of `q8_matmul` that holds two activation rows in one 512-bit register:
//! lanes 0–7 are row 2p's eight partial sums of a block, lanes 8–15 row 2p + 1's, against the
//! same weight block broadcast to both halves. Each half does exactly what the 256-bit kernels do
//! to one row (same int32 sums, same scale product, same fma, same final horizontal sum), so the
//! bits are theirs, with half the instructions per product.

use super::{Q8Matrix, QK8_0};

/// Bytes of one paired block: block b of two rows, 32 values each.
const PAIR_BYTES: usize = 2 * QK8_0;
/// Lanes of one paired scale vector: each row's block scale over eight lanes.
const PAIR_LANES: usize = 16;
/// Weight rows per register tile.
const TILE_W: usize = 4;
/// Row pairs per register tile: 4 × 4 accumulators, 4 weight blocks, their 4 start values and a
/// few temporaries fit the 32 AVX-512 registers.
const TILE_P: usize = 4;

/// Activation rows paired for this kernel, offset by 128 (`vpdpbusd` takes them unsigned). An
/// odd last row is paired with a zero row whose results are dropped.
pub(super) struct PairedRows {
    rows: usize,
    /// Blocks per row.
    kb: usize,
    /// `[pairs, kb, 64]`.
    quants: Vec<u8>,
    /// `[pairs, kb, 16]`.
    scales: Vec<f32>,
}

impl PairedRows {
    pub(super) fn new(a: &Q8Matrix) -> Self {
        let kb = a.cols / QK8_0;
        let pairs = a.rows.div_ceil(2);
        // Padding: value 0 (128 offset) with scale 0 contributes exactly 0 to the dropped row.
        let mut quants = vec![0x80u8; pairs * kb * PAIR_BYTES];
        let mut scales = vec![0f32; pairs * kb * PAIR_LANES];
        for row in 0..a.rows {
            let (pair, half) = (row / 2, row % 2);
            for b in 0..kb {
                let src = &a.quants[row * a.cols + b * QK8_0..][..QK8_0];
                let at = (pair * kb + b) * PAIR_BYTES + half * QK8_0;
                for (dst, &v) in quants[at..at + QK8_0].iter_mut().zip(src) {
                    *dst = (v as u8) ^ 0x80;
                }
                let at = (pair * kb + b) * PAIR_LANES + half * 8;
                scales[at..at + 8].fill(a.scales[row * kb + b]);
            }
        }
        Self {
            rows: a.rows,
            kb,
            quants,
            scales,
        }
    }
}

/// Fill `dst` (`[num_w, num_a]`: weight rows `w0..w0 + num_w` by activation rows
/// `a0..a0 + num_a`); `a0` is even.
#[cfg(target_arch = "x86_64")]
pub(super) fn tiles(
    w: &Q8Matrix,
    w0: usize,
    num_w: usize,
    a: &PairedRows,
    a0: usize,
    num_a: usize,
    dst: &mut [f32],
) {
    debug_assert!(a0.is_multiple_of(2) && a0 + num_a <= a.rows && w0 + num_w <= w.rows);
    debug_assert!(w.cols / QK8_0 == a.kb && dst.len() >= num_w * num_a);
    for wr in (0..num_w).step_by(TILE_W) {
        let tw = TILE_W.min(num_w - wr);
        for ar in (a0..a0 + num_a).step_by(2 * TILE_P) {
            let ta = (2 * TILE_P).min(a0 + num_a - ar);
            let mut out = [[0f32; 2 * TILE_P]; TILE_W];
            // SAFETY: this kernel is only offered where the CPU has AVX-512F, VL and VNNI
            // (`cpu::available`); `w0 + wr + tw <= w.rows` (checked above) and pairs
            // `ar / 2 .. (ar + ta).div_ceil(2)` exist since `ar + ta <= rows`; both operands
            // have `kb` blocks per row, which is all the kernel reads.
            #[allow(unsafe_code)]
            unsafe {
                avx512::dispatch(w, w0 + wr, tw, a, ar / 2, ta.div_ceil(2), &mut out)
            };
            for (r, row) in out.iter().enumerate().take(tw) {
                let at = (wr + r) * num_a + ar - a0;
                dst[at..at + ta].copy_from_slice(&row[..ta]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use std::arch::x86_64::*;

    use super::super::{Q8Matrix, QK8_0};
    use super::{PairedRows, PAIR_BYTES, PAIR_LANES, TILE_P, TILE_W};
    use crate::q8_matmul::cpu::hsum;

    type Out = [[f32; 2 * TILE_P]; TILE_W];

    /// Calls the `tile::<R, P>` instance for `tw` weight rows and `tp` pairs.
    ///
    /// # Safety
    /// As `tile`, with `tw <= TILE_W` and `tp <= TILE_P`.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn dispatch(
        w: &Q8Matrix,
        w0: usize,
        tw: usize,
        a: &PairedRows,
        p0: usize,
        tp: usize,
        out: &mut Out,
    ) {
        macro_rules! by_pairs {
            ($r:literal) => {
                match tp {
                    4 => tile::<$r, 4>(w, w0, a, p0, out),
                    3 => tile::<$r, 3>(w, w0, a, p0, out),
                    2 => tile::<$r, 2>(w, w0, a, p0, out),
                    _ => tile::<$r, 1>(w, w0, a, p0, out),
                }
            };
        }
        match tw {
            4 => by_pairs!(4),
            3 => by_pairs!(3),
            2 => by_pairs!(2),
            _ => by_pairs!(1),
        }
    }

    /// Products of weight rows `w0..w0 + R` with the activation rows of pairs `p0..p0 + P`.
    ///
    /// # Safety
    /// The CPU supports AVX-512F, VL and VNNI; `w0 + R <= w.rows`, `p0 + P` pairs exist in `a`,
    /// `w.cols / 32` is `a`'s blocks per row, `R <= TILE_W` and `P <= TILE_P`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    unsafe fn tile<const R: usize, const P: usize>(
        w: &Q8Matrix,
        w0: usize,
        a: &PairedRows,
        p0: usize,
        out: &mut Out,
    ) {
        let kb = a.kb;
        // Slicing checks that the first rows are inside the buffers.
        let wq = w.quants[w0 * w.cols..].as_ptr();
        let ws = w.scales[w0 * kb..].as_ptr();
        let aq = a.quants[p0 * kb * PAIR_BYTES..].as_ptr();
        let as_ = a.scales[p0 * kb * PAIR_LANES..].as_ptr();
        let zero = _mm512_setzero_si512();
        let offset = _mm512_set1_epi8(i8::MIN);
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        for b in 0..kb {
            let mut wv = [zero; R];
            let mut start = [zero; R];
            let mut wd = [_mm512_setzero_ps(); R];
            for r in 0..R {
                // The next tile's rows stream in from DRAM while this one computes: a task's
                // rows are too short (≤ 1 KiB each) for the hardware prefetcher to ramp up, and
                // without this the LM head ran at two thirds of the in-cache rate. Prefetches
                // never fault, so rows past the matrix are harmless (`wrapping_add`).
                let next = wq.wrapping_add((R + r) * w.cols + b * QK8_0);
                _mm_prefetch::<_MM_HINT_T0>(next);
                let block = _mm256_loadu_si256(wq.add(r * w.cols + b * QK8_0) as *const __m256i);
                wv[r] = _mm512_broadcast_i64x4(block);
                // −128 · Σw per lane cancels the activations' offset.
                start[r] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, wv[r]));
                wd[r] = _mm512_set1_ps(*ws.add(r * kb + b));
            }
            for p in 0..P {
                let av = _mm512_loadu_si512(aq.add((p * kb + b) * PAIR_BYTES) as *const __m512i);
                let ad = _mm512_loadu_ps(as_.add((p * kb + b) * PAIR_LANES));
                for r in 0..R {
                    let d = _mm512_mul_ps(wd[r], ad);
                    let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start[r], av, wv[r]));
                    acc[r][p] = _mm512_fmadd_ps(dot, d, acc[r][p]);
                }
            }
        }
        for r in 0..R {
            for p in 0..P {
                let lo = _mm512_castps512_ps256(acc[r][p]);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][p]), 1));
                out[r][2 * p] = hsum(lo);
                out[r][2 * p + 1] = hsum(hi);
            }
        }
    }
}
