//! The AVX-512 VNNI kernel of `q8_matmul` for one activation row (a decode step): two weight rows
//! per 512-bit register, lanes 0–7 row 2p's eight partial sums of a block and lanes 8–15 row
//! 2p + 1's, against the activation block broadcast to both halves. Each half does exactly what
//! the 256-bit kernels do to one row (the same int32 sums, scale product, fma and final
//! horizontal sum), so the bits are theirs, with half the vector instructions per weight byte: a
//! decode step is bound by how fast these run over the weights, not by memory (`ops_decode_stream`).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::cpu::hsum;
use super::{Q8Matrix, QK8_0};

/// Row pairs per register tile: 4 accumulators, 8 rows' scale vectors and a few temporaries.
const TILE_P: usize = 4;
/// Blocks whose scales are loaded and multiplied at once (one 512-bit vector of f32).
const SCALE_RUN: usize = 16;

/// Products of weight rows `w0..w0 + num_w` with activation row `a_row`, into `dst[..num_w]`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VL/DQ and VNNI, AVX2 and FMA; `w0 + num_w <= w.rows`,
/// `a_row < a.rows`, `w.cols == a.cols` and `dst.len() >= num_w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
pub(super) unsafe fn rows(
    w: &Q8Matrix,
    w0: usize,
    num_w: usize,
    a: &Q8Matrix,
    a_row: usize,
    dst: &mut [f32],
) {
    let mut r = 0;
    while r < num_w {
        // Pairs of this tile; an odd last row is paired with itself and its copy dropped.
        let pairs = TILE_P.min((num_w - r).div_ceil(2));
        let rows = [0, 1, 2, 3, 4, 5, 6, 7].map(|i| w0 + (r + i).min(num_w - 1));
        let mut out = [0f32; 2 * TILE_P];
        // SAFETY: every entry of `rows` is below `w0 + num_w`, inside `w`; the caller's contract
        // covers the rest.
        unsafe {
            match pairs {
                4 => tile::<4>(w, &rows, a, a_row, &mut out),
                3 => tile::<3>(w, &rows, a, a_row, &mut out),
                2 => tile::<2>(w, &rows, a, a_row, &mut out),
                _ => tile::<1>(w, &rows, a, a_row, &mut out),
            }
        }
        let n = (2 * pairs).min(num_w - r);
        dst[r..r + n].copy_from_slice(&out[..n]);
        r += n;
    }
}

/// Prefetch the next tile's share for block `b` into L2: the 2P rows after this tile's
/// (contiguous, as its scales are) stream in linearly, 2P · 32 bytes and 2P scales per block,
/// while this tile computes. A decode step's rows (896 bytes in the 0.5B) are too short for the
/// hardware prefetcher, which leaves every load to miss without this (19 → 30 GB/s in
/// `ops_decode_stream`); into L1 instead of L2 was no faster. Prefetches never fault, so a last
/// tile's reach past the matrix is harmless (`wrapping_add`).
#[inline(always)]
fn prefetch_next_tile<const P: usize>(wq: *const i8, ws: *const f32, cols: usize, b: usize) {
    let kb = cols / QK8_0;
    let next = wq.wrapping_add(2 * P * cols + b * 2 * P * QK8_0);
    let scales = ws.wrapping_add(2 * P * kb + b * 2 * P) as *const i8;
    // SAFETY: prefetching is a hint that never faults, whatever the address.
    unsafe {
        for line in 0..P {
            _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * line));
        }
        _mm_prefetch::<_MM_HINT_T1>(scales);
    }
}

/// Weight rows `rows[0..2P]` (pair p: rows `2p`, `2p + 1`) against activation row `a_row`:
/// `out[i]` for row `rows[i]`.
///
/// # Safety
/// As `rows`, with every `rows[i]` a row of `w`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
unsafe fn tile<const P: usize>(
    w: &Q8Matrix,
    rows: &[usize; 8],
    a: &Q8Matrix,
    a_row: usize,
    out: &mut [f32; 2 * TILE_P],
) {
    let (cols, kb) = (w.cols, w.cols / QK8_0);
    let aq = a.quants[a_row * cols..][..cols].as_ptr();
    let as_ = a.scales[a_row * kb..][..kb].as_ptr();
    let wq: [*const i8; 8] = rows.map(|r| w.quants[r * cols..][..cols].as_ptr());
    let ws: [*const f32; 8] = rows.map(|r| w.scales[r * kb..][..kb].as_ptr());
    let zero = _mm512_setzero_si512();
    let offset = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); P];
    for b0 in (0..kb).step_by(SCALE_RUN) {
        let run = SCALE_RUN.min(kb - b0);
        let mask: __mmask16 = ((1u32 << run) - 1) as __mmask16;
        // Each row's block scales times the activation's, as the 256-bit kernels form them one
        // by one (`ws · da` in f32).
        let da = _mm512_maskz_loadu_ps(mask, as_.add(b0));
        let mut scale = [[_mm512_setzero_ps(); 2]; P];
        for p in 0..P {
            for h in 0..2 {
                let ws_run = _mm512_maskz_loadu_ps(mask, ws[2 * p + h].add(b0));
                scale[p][h] = _mm512_mul_ps(ws_run, da);
            }
        }
        // Lane j of the low row's products in lanes 0–7, of the high row's in lanes 8–15.
        let mut pick = _mm512_set_epi32(16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0);
        let one = _mm512_set1_epi32(1);
        for b in b0..b0 + run {
            prefetch_next_tile::<P>(wq[0], ws[0], cols, b);
            let av =
                _mm512_broadcast_i64x4(_mm256_loadu_si256(aq.add(b * QK8_0) as *const __m256i));
            let a_unsigned = _mm512_xor_si512(av, offset);
            for p in 0..P {
                let low = _mm256_loadu_si256(wq[2 * p].add(b * QK8_0) as *const __m256i);
                let high = _mm256_loadu_si256(wq[2 * p + 1].add(b * QK8_0) as *const __m256i);
                let wv = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
                // −128 · Σw per lane, then Σ (a + 128) · w on top: exactly Σ a · w.
                let start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, wv));
                let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, a_unsigned, wv));
                let d = _mm512_permutex2var_ps(scale[p][0], pick, scale[p][1]);
                acc[p] = _mm512_fmadd_ps(dot, d, acc[p]);
            }
            pick = _mm512_add_epi32(pick, one);
        }
    }
    for p in 0..P {
        out[2 * p] = hsum(_mm512_castps512_ps256(acc[p]));
        out[2 * p + 1] = hsum(_mm512_extractf32x8_ps::<1>(acc[p]));
    }
}
