//! x86 kernels of the packed Q6_K layout: one row tile (16 rows) against `C` activation rows, as
//! `packed_q4k`'s (one `vpdpbusd` per 4 values of 16 rows with AVX-512 VNNI; `maddubs` and `madd`
//! per 8 rows with AVX2). Both form the module's exact integer sums.
//!
//! Every kernel prefetches the next super-block's tile into L2, not L1: into L1 the prefetches
//! held the fill buffers the loads waited on (a 1.5B decode step's Q6_K 23 → 15 ms, cf850dc).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::tiles::{activation_group as group, TILE_ROWS};
use super::super::{Acts, TILE_A};
use super::{PackedQ6K, D_AT, QH_AT, QL_AT, SCALES_AT, TILE_BYTES};

/// Row tile `t` against activation rows `c0..c0 + C`: `out[c][r]`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VNNI, AVX2, FMA and F16C; `t` is a row tile of `w` and `act`
/// holds rows `c0..c0 + C` of `w.nb` super-blocks.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn tile_vnni<const C: usize>(
    w: &PackedQ6K,
    t: usize,
    act: &Acts,
    c0: usize,
    out: &mut [[f32; TILE_ROWS]; TILE_A],
) {
    let (m4, m2) = (_mm512_set1_epi8(0xF), _mm512_set1_epi8(3));
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..w.nb {
        let tile = w.tile(t, b).as_ptr();
        let mut sum = [_mm512_setzero_si512(); C];
        for pair in 0..16 {
            // Group pair `pair` is sub-block `pair` (16 values): groups 2·pair and 2·pair + 1.
            let qh = _mm512_loadu_si512(tile.add(QH_AT + pair * 64) as *const _);
            // The next tile into L2, not L1: three lines a pair prefetched into L1 held its fill
            // buffers, and the loads waited behind them (a 1.5B step's Q6_K 23 → 15 ms,
            // `ops_decode_stream`).
            _mm_prefetch::<_MM_HINT_T1>(
                tile.wrapping_add(TILE_BYTES + QH_AT + pair * 64) as *const i8
            );
            let mut p = [_mm512_setzero_si512(); C];
            for h in 0..2 {
                let g = 2 * pair + h;
                let at = QL_AT + g * 64;
                _mm_prefetch::<_MM_HINT_T1>(tile.wrapping_add(TILE_BYTES + at) as *const i8);
                let ql = _mm512_loadu_si512(tile.add(at) as *const _);
                let high = |shift: u32| {
                    let h = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(shift as i32));
                    _mm512_slli_epi16(_mm512_and_si512(h, m2), 4)
                };
                let shift = 4 * h as u32;
                let lo = _mm512_or_si512(_mm512_and_si512(ql, m4), high(shift));
                let hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                    high(shift + 2),
                );
                for c in 0..C {
                    let q8 = act
                        .quants
                        .as_ptr()
                        .add(((c0 + c) * act.nb + b) * 256 + 8 * g);
                    p[c] = _mm512_dpbusd_epi32(p[c], lo, _mm512_set1_epi32(group(q8)));
                    p[c] = _mm512_dpbusd_epi32(p[c], hi, _mm512_set1_epi32(group(q8.add(4))));
                }
            }
            let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                tile.add(SCALES_AT + 16 * pair) as *const __m128i
            ));
            for c in 0..C {
                let (_, _, bsums) = act.block(c0 + c, b);
                let centred = _mm512_sub_epi32(p[c], _mm512_set1_epi32(32 * bsums[pair] as i32));
                sum[c] = _mm512_add_epi32(sum[c], _mm512_mullo_epi32(centred, sc));
            }
        }
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(D_AT) as *const __m256i));
        for c in 0..C {
            let (ya, _, _) = act.block(c0 + c, b);
            let d = _mm512_mul_ps(dv, _mm512_set1_ps(ya));
            acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum[c]), acc[c]);
        }
    }
    for c in 0..C {
        _mm512_storeu_ps(out[c].as_mut_ptr(), acc[c]);
    }
}

/// Row tile `t` against activation rows `c0..c0 + C` (`C ≤ 3`), one 8-row half at a time:
/// `out[c][r]`. The f32 sums wait in `out` between super-blocks, so that the int sums of three
/// rows fit AVX2's 16 registers.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; as for `tile_vnni` otherwise.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn tile_avx2<const C: usize>(
    w: &PackedQ6K,
    t: usize,
    act: &Acts,
    c0: usize,
    out: &mut [[f32; TILE_ROWS]; TILE_A],
) {
    let ones = _mm256_set1_epi16(1);
    for half in 0..2 {
        for c in 0..C {
            _mm256_storeu_ps(out[c].as_mut_ptr().add(8 * half), _mm256_setzero_ps());
        }
        for b in 0..w.nb {
            let tile = w.tile(t, b).as_ptr();
            let mut sum = [_mm256_setzero_si256(); C];
            for pair in 0..16 {
                let qh =
                    _mm256_loadu_si256(tile.add(QH_AT + pair * 64 + 32 * half) as *const __m256i);
                let mut p = [_mm256_setzero_si256(); C];
                for g in [2 * pair, 2 * pair + 1] {
                    let at = QL_AT + g * 64 + 32 * half;
                    _mm_prefetch::<_MM_HINT_T1>(tile.wrapping_add(TILE_BYTES + at) as *const i8);
                    let ql = _mm256_loadu_si256(tile.add(at) as *const __m256i);
                    let (lo, hi) = values_avx2(ql, qh, g);
                    for c in 0..C {
                        let q8 = act
                            .quants
                            .as_ptr()
                            .add(((c0 + c) * act.nb + b) * 256 + 8 * g);
                        // Pairs of products in int16: at most 2 · 63 · 127 each, twice, under
                        // 32,767; then the row's four summed in int32.
                        let pairs = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, _mm256_set1_epi32(group(q8))),
                            _mm256_maddubs_epi16(hi, _mm256_set1_epi32(group(q8.add(4)))),
                        );
                        p[c] = _mm256_add_epi32(p[c], _mm256_madd_epi16(pairs, ones));
                    }
                }
                let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                    tile.add(SCALES_AT + 16 * pair + 8 * half) as *const __m128i,
                ));
                for c in 0..C {
                    let (_, _, bsums) = act.block(c0 + c, b);
                    let centred =
                        _mm256_sub_epi32(p[c], _mm256_set1_epi32(32 * bsums[pair] as i32));
                    sum[c] = _mm256_add_epi32(sum[c], _mm256_mullo_epi32(centred, sc));
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(tile.add(D_AT + 16 * half) as *const __m128i));
            for c in 0..C {
                let (ya, _, _) = act.block(c0 + c, b);
                let d = _mm256_mul_ps(dv, _mm256_set1_ps(ya));
                let o = out[c].as_mut_ptr().add(8 * half);
                let acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum[c]), _mm256_loadu_ps(o));
                _mm256_storeu_ps(o, acc);
            }
        }
    }
}

/// Group `g`'s 6-bit values of 8 rows, the first 4 of each row in `lo` and the last 4 in `hi`,
/// from its low bits `ql` and its pair's high bits `qh`. The even group's 2-bit pairs sit at
/// bits 0–1 and 2–3 of each `qh` byte, the odd one's at 4–5 and 6–7: one shift and one mask put
/// each at bits 4–5 (bits a 16-bit shift carries across bytes are masked off).
///
/// # Safety
/// The CPU supports AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn values_avx2(ql: __m256i, qh: __m256i, g: usize) -> (__m256i, __m256i) {
    let (m4, m_high) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x30));
    let (high_lo, high_hi) = if g.is_multiple_of(2) {
        (_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2))
    } else {
        (qh, _mm256_srli_epi16(qh, 2))
    };
    let lo = _mm256_or_si256(_mm256_and_si256(ql, m4), _mm256_and_si256(high_lo, m_high));
    let hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4),
        _mm256_and_si256(high_hi, m_high),
    );
    (lo, hi)
}

/// Row tile `t` against one activation row `c0` (a decode step's mat-vec), both 8-row halves at
/// once so that the tile is read once, in order: `out[0][r]`.
///
/// # Safety
/// As for `tile_avx2`, with `act` holding row `c0`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn row_avx2(
    w: &PackedQ6K,
    t: usize,
    act: &Acts,
    c0: usize,
    out: &mut [[f32; TILE_ROWS]; TILE_A],
) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in 0..w.nb {
        let tile = w.tile(t, b).as_ptr();
        let (ya, q8, bsums) = act.block(c0, b);
        let q8 = q8.as_ptr();
        let mut sum = [_mm256_setzero_si256(); 2];
        for pair in 0..16 {
            let qh_at = QH_AT + pair * 64;
            _mm_prefetch::<_MM_HINT_T1>(tile.wrapping_add(TILE_BYTES + qh_at) as *const i8);
            let mut p = [_mm256_setzero_si256(); 2];
            for g in [2 * pair, 2 * pair + 1] {
                let at = QL_AT + g * 64;
                _mm_prefetch::<_MM_HINT_T1>(tile.wrapping_add(TILE_BYTES + at) as *const i8);
                let a_lo = _mm256_set1_epi32(group(q8.add(8 * g)));
                let a_hi = _mm256_set1_epi32(group(q8.add(8 * g + 4)));
                for h in 0..2 {
                    let qh = _mm256_loadu_si256(tile.add(qh_at + 32 * h) as *const __m256i);
                    let ql = _mm256_loadu_si256(tile.add(at + 32 * h) as *const __m256i);
                    let (lo, hi) = values_avx2(ql, qh, g);
                    // Pairs of products in int16: at most 2 · 63 · 127 each, twice, under
                    // 32,767; then the row's four summed in int32.
                    let pairs = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, a_lo),
                        _mm256_maddubs_epi16(hi, a_hi),
                    );
                    p[h] = _mm256_add_epi32(p[h], _mm256_madd_epi16(pairs, ones));
                }
            }
            let centre = _mm256_set1_epi32(32 * bsums[pair] as i32);
            for h in 0..2 {
                let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                    tile.add(SCALES_AT + 16 * pair + 8 * h) as *const __m128i,
                ));
                let centred = _mm256_sub_epi32(p[h], centre);
                sum[h] = _mm256_add_epi32(sum[h], _mm256_mullo_epi32(centred, sc));
            }
        }
        let y = _mm256_set1_ps(ya);
        for h in 0..2 {
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(tile.add(D_AT + 16 * h) as *const __m128i));
            acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dv, y), _mm256_cvtepi32_ps(sum[h]), acc[h]);
        }
    }
    for h in 0..2 {
        _mm256_storeu_ps(out[0].as_mut_ptr().add(8 * h), acc[h]);
    }
}
