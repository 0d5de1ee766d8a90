//! x86 kernels of the packed Q4_K layout: one row tile (16 rows) against `C` activation rows.
//! AVX-512 VNNI: one `vpdpbusd` per 4 values of all 16 rows. AVX2: `maddubs` per 4 values of 8
//! rows, summed in int16 over a sub-block. Both form the module's exact integer sums.
//!
//! Every kernel prefetches the next super-block's tile into L2, not L1: into L1 the prefetches
//! held the fill buffers the loads waited on. The eight sub-blocks stay a loop behind an opaque
//! trip count: fully unrolled for one activation row, the kernel ran at 28–35 GB/s. The two
//! together took a 1.5B decode step's Q4_K from 14.5 to 11.7 ms (42f4ded).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::tiles::{activation_group as group, TILE_ROWS};
use super::super::{Acts, TILE_A};
use super::{PackedQ4K, DMIN_AT, D_AT, MINS_AT, QS_AT, SCALES_AT, TILE_BYTES};

/// Row tile `t` against activation rows `c0..c0 + C`: `out[c][r]`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VNNI, AVX2, FMA and F16C; `t` is a row tile of `w` and `act`
/// holds rows `c0..c0 + C` of `w.nb` super-blocks.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn tile_vnni<const C: usize>(
    w: &PackedQ4K,
    t: usize,
    act: &Acts,
    c0: usize,
    out: &mut [[f32; TILE_ROWS]; TILE_A],
) {
    let m4 = _mm512_set1_epi8(0xF);
    let mut acc = [_mm512_setzero_ps(); C];
    // An opaque count keeps the sub-blocks a loop: for one activation row LLVM unrolled all
    // eight (64 `vpdpbusd` in a row), and that ran a decode step's Q4_K at 28 GB/s where the
    // loop runs at 42 (`ops_decode_stream`).
    let sub_blocks = std::hint::black_box(8);
    for b in 0..w.nb {
        let tile = w.tile(t, b).as_ptr();
        let mut s1 = [_mm512_setzero_si512(); C];
        for s in 0..sub_blocks {
            let mut p = [_mm512_setzero_si512(); C];
            for g in 0..4 {
                let at = QS_AT + (4 * s + g) * 64;
                // The next super-block's tile (contiguous) streams into L2 while this one
                // computes; into L1 it held the fill buffers the loads wait on (14.5 → 11.7 ms
                // for a 1.5B step's Q4_K, `ops_decode_stream`).
                _mm_prefetch::<_MM_HINT_T1>(tile.wrapping_add(TILE_BYTES + at) as *const i8);
                let wv = _mm512_loadu_si512(tile.add(at) as *const _);
                let lo = _mm512_and_si512(wv, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
                for c in 0..C {
                    let q8 = act
                        .quants
                        .as_ptr()
                        .add(((c0 + c) * act.nb + b) * 256 + 32 * s + 8 * g);
                    p[c] = _mm512_dpbusd_epi32(p[c], lo, _mm512_set1_epi32(group(q8)));
                    p[c] = _mm512_dpbusd_epi32(p[c], hi, _mm512_set1_epi32(group(q8.add(4))));
                }
            }
            let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                tile.add(SCALES_AT + 16 * s) as *const __m128i
            ));
            for c in 0..C {
                s1[c] = _mm512_add_epi32(s1[c], _mm512_mullo_epi32(p[c], sc));
            }
        }
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(D_AT) as *const __m256i));
        let dminv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(DMIN_AT) as *const __m256i));
        for c in 0..C {
            let (ya, _, bsums) = act.block(c0 + c, b);
            let s2 = min_sums(tile, bsums);
            let y = _mm512_set1_ps(ya);
            let s1f = _mm512_cvtepi32_ps(s1[c]);
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(dv, y), s1f, acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dminv, y), _mm512_cvtepi32_ps(s2), acc[c]);
        }
    }
    for c in 0..C {
        _mm512_storeu_ps(out[c].as_mut_ptr(), acc[c]);
    }
}

/// The tile's 16 rows' `S2 = Σ_s min_s · Σa_s` for one activation row's super-block sums
/// (`bsums`, by 16): what the AVX-512 kernels (VNNI and AMX) subtract.
///
/// # Safety
/// The CPU supports AVX-512 F/BW; `tile` is a packed Q4_K tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(in super::super) unsafe fn min_sums(tile: *const u8, bsums: &[i16]) -> __m512i {
    let mut s2 = _mm512_setzero_si512();
    for s in 0..8 {
        // SAFETY: the caller's contract; the mins lie inside the tile.
        let m = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(tile.add(MINS_AT + 16 * s).cast()) });
        let a = bsums[2 * s] as i32 + bsums[2 * s + 1] as i32;
        s2 = _mm512_add_epi32(s2, _mm512_mullo_epi32(m, _mm512_set1_epi32(a)));
    }
    s2
}

/// Row tile `t` against activation rows `c0..c0 + C` (`C ≤ 3`), one 8-row half at a time:
/// `out[c][r]`. As `row_avx2`, a sub-block's products add up in int16 before one `madd` by the
/// scales; the f32 sums wait in `out` between super-blocks, so that the int sums of three rows
/// fit AVX2's 16 registers.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; as for `tile_vnni` otherwise.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn tile_avx2<const C: usize>(
    w: &PackedQ4K,
    t: usize,
    act: &Acts,
    c0: usize,
    out: &mut [[f32; TILE_ROWS]; TILE_A],
) {
    let m4 = _mm256_set1_epi8(0xF);
    let sub_blocks = std::hint::black_box(8);
    for h in 0..2 {
        for c in 0..C {
            _mm256_storeu_ps(out[c].as_mut_ptr().add(8 * h), _mm256_setzero_ps());
        }
        for b in 0..w.nb {
            let tile = w.tile(t, b).as_ptr();
            let mut s1 = [_mm256_setzero_si256(); C];
            for s in 0..sub_blocks {
                let mut p = [_mm256_setzero_si256(); C];
                for g in 0..4 {
                    let at = QS_AT + (4 * s + g) * 64 + 32 * h;
                    _mm_prefetch::<_MM_HINT_T1>(tile.wrapping_add(TILE_BYTES + at) as *const i8);
                    let wv = _mm256_loadu_si256(tile.add(at) as *const __m256i);
                    let lo = _mm256_and_si256(wv, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), m4);
                    for c in 0..C {
                        let q8 = act
                            .quants
                            .as_ptr()
                            .add(((c0 + c) * act.nb + b) * 256 + 32 * s + 8 * g);
                        let pairs = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, _mm256_set1_epi32(group(q8))),
                            _mm256_maddubs_epi16(hi, _mm256_set1_epi32(group(q8.add(4)))),
                        );
                        p[c] = _mm256_add_epi16(p[c], pairs);
                    }
                }
                let sc = scale_pairs_avx2(tile, s, h);
                for c in 0..C {
                    s1[c] = _mm256_add_epi32(s1[c], _mm256_madd_epi16(p[c], sc));
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(tile.add(D_AT + 16 * h) as *const __m128i));
            let dminv =
                _mm256_cvtph_ps(_mm_loadu_si128(tile.add(DMIN_AT + 16 * h) as *const __m128i));
            let min_pairs = min_pairs_avx2(tile, h);
            for c in 0..C {
                let (ya, _, bsums) = act.block(c0 + c, b);
                let s2 = mins_avx2(&min_pairs, bsums);
                let y = _mm256_set1_ps(ya);
                let o = out[c].as_mut_ptr().add(8 * h);
                let mut acc = _mm256_loadu_ps(o);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(dv, y), _mm256_cvtepi32_ps(s1[c]), acc);
                acc = _mm256_fnmadd_ps(_mm256_mul_ps(dminv, y), _mm256_cvtepi32_ps(s2), acc);
                _mm256_storeu_ps(o, acc);
            }
        }
    }
}

/// Sub-block `s`'s scales of rows `8·h..8·h + 8`, each in both int16 halves of its int32 lane
/// (scales are 6 bits), so that one `madd` of a row's int16 sums gives `scale · Σ q·a`.
///
/// # Safety
/// The CPU supports AVX2; `tile` is a tile, `s < 8` and `h < 2`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_pairs_avx2(tile: *const u8, s: usize, h: usize) -> __m256i {
    let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
        tile.add(SCALES_AT + 16 * s + 8 * h) as *const __m128i
    ));
    _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16))
}

/// The mins of rows `8·h..8·h + 8` of a tile for the sub-block pairs (0, 1), (2, 3), (4, 5),
/// (6, 7): per row one int32 lane holding both mins as int16, so that one `madd` against a pair
/// of activation sums forms two terms of `S2` (mins are 6 bits, a sub-block's activation sum at
/// most 32 · 128: both fit int16, and `madd` sums in int32, so `S2` is the same integer).
///
/// # Safety
/// The CPU supports AVX2; `tile` is a tile and `h < 2`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn min_pairs_avx2(tile: *const u8, h: usize) -> [__m256i; 4] {
    let mut pairs = [_mm256_setzero_si256(); 4];
    for (p, pair) in pairs.iter_mut().enumerate() {
        let even = _mm_loadl_epi64(tile.add(MINS_AT + 32 * p + 8 * h) as *const __m128i);
        let odd = _mm_loadl_epi64(tile.add(MINS_AT + 32 * p + 16 + 8 * h) as *const __m128i);
        *pair = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(even, odd));
    }
    pairs
}

/// `S2` of the rows whose [`min_pairs_avx2`] are `pairs`: `Σ_s min_s · Σ a` over the 8
/// sub-blocks, four `madd`s.
///
/// # Safety
/// The CPU supports AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mins_avx2(pairs: &[__m256i; 4], bsums: &[i16]) -> __m256i {
    let mut s2 = _mm256_setzero_si256();
    for (p, &pair) in pairs.iter().enumerate() {
        let even = bsums[4 * p] as i32 + bsums[4 * p + 1] as i32;
        let odd = bsums[4 * p + 2] as i32 + bsums[4 * p + 3] as i32;
        let both = (even & 0xFFFF) | (odd << 16);
        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(pair, _mm256_set1_epi32(both)));
    }
    s2
}

/// Row tile `t` against one activation row `c0` (a decode step's mat-vec), both 8-row halves at
/// once so that the tile is read once, in order: `out[0][r]`. Within a sub-block the four
/// groups' products add up in int16 before one `madd` by the scales (a sum of 8 `maddubs`
/// pairs, each at most 2 · 15 · 127, stays inside int16), which forms the same `S1`.
///
/// # Safety
/// As for `tile_avx2`, with `act` holding row `c0`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn row_avx2(
    w: &PackedQ4K,
    t: usize,
    act: &Acts,
    c0: usize,
    out: &mut [[f32; TILE_ROWS]; TILE_A],
) {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); 2];
    // A loop, not unrolled, as in `tile_vnni`.
    let sub_blocks = std::hint::black_box(8);
    for b in 0..w.nb {
        let tile = w.tile(t, b).as_ptr();
        let q8 = act.quants.as_ptr().add((c0 * act.nb + b) * 256);
        let mut s1 = [_mm256_setzero_si256(); 2];
        for s in 0..sub_blocks {
            let mut p = [_mm256_setzero_si256(); 2];
            for g in 0..4 {
                let at = QS_AT + (4 * s + g) * 64;
                _mm_prefetch::<_MM_HINT_T1>(tile.wrapping_add(TILE_BYTES + at) as *const i8);
                // And four groups ahead in this tile into L1: without it the loads of a
                // sub-block's last group waited on L2 (39 % of the kernel's samples); a 1.5B
                // step's Q4_K streamed 18.4–18.9 GB/s in three runs without it, 18.0–26.4
                // (median 22.6) in nine with it (`ops_decode_stream`). The same line in the
                // Q6_K and VNNI kernels moved nothing past the noise.
                _mm_prefetch::<_MM_HINT_T0>(tile.wrapping_add(at + 256) as *const i8);
                let a_lo = _mm256_set1_epi32(group(q8.add(32 * s + 8 * g)));
                let a_hi = _mm256_set1_epi32(group(q8.add(32 * s + 8 * g + 4)));
                for h in 0..2 {
                    let wv = _mm256_loadu_si256(tile.add(at + 32 * h) as *const __m256i);
                    let lo = _mm256_and_si256(wv, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), m4);
                    let pairs = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, a_lo),
                        _mm256_maddubs_epi16(hi, a_hi),
                    );
                    p[h] = _mm256_add_epi16(p[h], pairs);
                }
            }
            for h in 0..2 {
                s1[h] =
                    _mm256_add_epi32(s1[h], _mm256_madd_epi16(p[h], scale_pairs_avx2(tile, s, h)));
            }
        }
        let (ya, _, bsums) = act.block(c0, b);
        let y = _mm256_set1_ps(ya);
        for h in 0..2 {
            let s2 = mins_avx2(&min_pairs_avx2(tile, h), bsums);
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(tile.add(D_AT + 16 * h) as *const __m128i));
            let dminv =
                _mm256_cvtph_ps(_mm_loadu_si128(tile.add(DMIN_AT + 16 * h) as *const __m128i));
            let s1f = _mm256_cvtepi32_ps(s1[h]);
            acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dv, y), s1f, acc[h]);
            acc[h] = _mm256_fnmadd_ps(_mm256_mul_ps(dminv, y), _mm256_cvtepi32_ps(s2), acc[h]);
        }
    }
    for h in 0..2 {
        _mm256_storeu_ps(out[0].as_mut_ptr().add(8 * h), acc[h]);
    }
}
