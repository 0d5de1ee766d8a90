//! The AVX-512 VNNI tile of `q8_matmul`: two 32-value blocks per 512-bit `vpdpbusd`, so the
//! convert, scale and FMA that follow each dot product are paid once per two blocks.
//!
//! Lanes 0–7 of each accumulator take the even blocks and lanes 8–15 the odd ones (an odd last
//! block goes to lanes 0–7 alone); the sixteen lanes are summed at the end. That order is fixed by
//! the column count, not by the tile shape or the batch, so a row still gives the same bits alone
//! and in a batch — but not the same bits as the 256-bit kernels, whose eight lanes see every
//! block in turn.

use std::arch::x86_64::*;

use super::cpu::{TILE_A, TILE_W};
use super::{Q8Matrix, QK8_0};

/// Products of weight rows `w0..w0 + R` with activation rows `a0..a0 + C`.
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512 VNNI; `w0 + R <= w.rows`, `a0 + C <= a.rows`,
/// `w.cols == a.cols`, `R <= TILE_W` and `C <= TILE_A`.
#[allow(unsafe_code, clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn tile<const R: usize, const C: usize>(
    w: &Q8Matrix,
    w0: usize,
    a: &Q8Matrix,
    a0: usize,
    out: &mut [[f32; TILE_A]; TILE_W],
) {
    let kb = w.cols / QK8_0;
    let wq = w.quants.as_ptr().add(w0 * w.cols);
    let aq = a.quants.as_ptr().add(a0 * a.cols);
    let ws = w.scales.as_ptr().add(w0 * kb);
    let as_ = a.scales.as_ptr().add(a0 * kb);
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let zero = _mm512_setzero_si512();
    let offset = _mm512_set1_epi8(i8::MIN);
    // Spreads two scales (lanes 0 and 1) over lanes 0–7 and 8–15.
    let halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let pair_scales = |p: *const f32| -> __m512 {
        let two = _mm_castpd_ps(_mm_load_sd(p as *const f64));
        _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(two))
    };
    let mut b = 0;
    while b + 2 <= kb {
        let mut wv = [zero; R];
        let mut start = [zero; R];
        let mut wd = [_mm512_setzero_ps(); R];
        for r in 0..R {
            wv[r] = _mm512_loadu_si512(wq.add(r * w.cols + b * QK8_0) as *const __m512i);
            start[r] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, wv[r]));
            wd[r] = pair_scales(ws.add(r * kb + b));
        }
        for c in 0..C {
            let av = _mm512_loadu_si512(aq.add(c * a.cols + b * QK8_0) as *const __m512i);
            let a_unsigned = _mm512_xor_si512(av, offset);
            let ad = pair_scales(as_.add(c * kb + b));
            for r in 0..R {
                let dot = _mm512_dpbusd_epi32(start[r], a_unsigned, wv[r]);
                let d = _mm512_mul_ps(wd[r], ad);
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d, acc[r][c]);
            }
        }
        b += 2;
    }
    if b < kb {
        // The odd last block, zero-extended: lanes 8–15 add 0 × d.
        let mut wv = [zero; R];
        let mut start = [zero; R];
        for r in 0..R {
            let block = _mm256_loadu_si256(wq.add(r * w.cols + b * QK8_0) as *const __m256i);
            wv[r] = _mm512_zextsi256_si512(block);
            start[r] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, wv[r]));
        }
        for c in 0..C {
            let block = _mm256_loadu_si256(aq.add(c * a.cols + b * QK8_0) as *const __m256i);
            let a_unsigned = _mm512_xor_si512(_mm512_zextsi256_si512(block), offset);
            let da = *as_.add(c * kb + b);
            for r in 0..R {
                let dot = _mm512_dpbusd_epi32(start[r], a_unsigned, wv[r]);
                let d = _mm512_set1_ps(*ws.add(r * kb + b) * da);
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d, acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
}
