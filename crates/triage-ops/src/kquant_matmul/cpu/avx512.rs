//! AVX-512 tiles of Q6_K in place: `R` weight rows against `C` activation rows. One 512-bit
//! register holds two Q6_K chunks of 32 values, so its lanes 0–7 are what AVX2's first product
//! gives and lanes 8–15 its second; the halves are added at the end
//! of each super-block into the same eight int32 lanes, hence AVX2's bits. `vpdpwssd` does the
//! scale multiply and the accumulate in one instruction (same integers).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// Weight rows per tile: 4 × 4 accumulators, four rows' unpacked values and scales and the
/// activation registers fit the 32 registers.
const TILE_R: usize = 4;

/// The eight int32 lanes of a super-block: the two 256-bit halves added.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// Two 256-bit halves in one register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// `acc + madd(scale, p)` in one `vpdpwssd` (no saturation: the same integers).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn madd_add_vnni(acc: __m512i, scale: __m512i, p: __m512i) -> __m512i {
    _mm512_dpwssd_epi32(acc, p, scale)
}

/// The int16 permutation that spreads Q6_K scales `first..first + 4` over eight lanes each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
fn q6k_scale_index(first: i16) -> __m512i {
    let lanes: [i16; 32] = std::array::from_fn(|i| first + (i / 8) as i16);
    // SAFETY: `lanes` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(lanes.as_ptr() as *const _) }
}

macro_rules! avx512_tiles {
    ($module:ident, $features:literal, $madd_add:ident) => {
        pub(super) mod $module {
            use std::arch::x86_64::*;

            use super::super::super::blocks::{Q6K_BYTES, Q6K_D, Q6K_QH, Q6K_SCALES};
            use super::super::super::KQuantMatrix;
            use super::super::avx2::{f16_at, hsum8};
            use super::super::{Acts, TILE_A};
            use super::{fold, join, q6k_scale_index, $madd_add, TILE_R};

            rows_loop!(q6k_rows, $features, q6k, TILE_R);

            /// Q6_K rows against `C` activation rows from `c0`.
            ///
            /// # Safety
            /// The CPU supports the module's features; each row holds `act.nb` Q6_K super-blocks
            /// and `act` rows `c0..c0 + C`.
            #[allow(clippy::needless_range_loop)]
            #[inline]
            #[target_feature(enable = $features)]
            pub(in super::super) unsafe fn q6k<const R: usize, const C: usize>(
                rows: &[&[u8]; R],
                act: &Acts,
                c0: usize,
                out: &mut [[f32; TILE_A]; R],
            ) {
                let m4 = _mm512_set1_epi8(0xF);
                let m2 = _mm512_set1_epi8(3);
                let m32 = _mm512_set1_epi8(32);
                // Per 16-bit lane: the high bits of chunks 0 and 1 sit at shifts 0 and 2, of
                // chunks 2 and 3 at 4 and 6.
                let shifts = [
                    join(_mm256_set1_epi16(0), _mm256_set1_epi16(2)),
                    join(_mm256_set1_epi16(4), _mm256_set1_epi16(6)),
                ];
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                for b in 0..act.nb {
                    let sb: [&[u8]; R] =
                        std::array::from_fn(|r| &rows[r][b * Q6K_BYTES..][..Q6K_BYTES]);
                    let mut sumi = [[_mm512_setzero_si512(); C]; R];
                    for half in 0..2 {
                        for pair in 0..2 {
                            let index = q6k_scale_index((8 * half + 4 * pair) as i16);
                            let mut q = [_mm512_setzero_si512(); R];
                            let mut scale = [_mm512_setzero_si512(); R];
                            for r in 0..R {
                                let p = sb[r].as_ptr();
                                let ql = _mm512_loadu_si512(p.add(64 * half) as *const _);
                                let ql = if pair == 0 {
                                    ql
                                } else {
                                    _mm512_srli_epi16(ql, 4)
                                };
                                let qh =
                                    _mm256_loadu_si256(p.add(Q6K_QH + 32 * half) as *const __m256i);
                                let high = _mm512_srlv_epi16(join(qh, qh), shifts[pair]);
                                let high = _mm512_slli_epi16(_mm512_and_si512(high, m2), 4);
                                q[r] = _mm512_or_si512(_mm512_and_si512(ql, m4), high);
                                let s = _mm_loadu_si128(p.add(Q6K_SCALES) as *const __m128i);
                                let s = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(s));
                                scale[r] = _mm512_permutexvar_epi16(index, s);
                            }
                            for c in 0..C {
                                let q8 = act
                                    .quants
                                    .as_ptr()
                                    .add(((c0 + c) * act.nb + b) * 256 + 128 * half + 64 * pair);
                                let a = _mm512_loadu_si512(q8 as *const _);
                                let offset = _mm512_maddubs_epi16(m32, a);
                                for r in 0..R {
                                    let p = _mm512_sub_epi16(_mm512_maddubs_epi16(q[r], a), offset);
                                    sumi[r][c] = $madd_add(sumi[r][c], scale[r], p);
                                }
                            }
                        }
                    }
                    for c in 0..C {
                        let yd = act.d[(c0 + c) * act.nb + b];
                        for r in 0..R {
                            let d = _mm256_set1_ps(yd * f16_at(sb[r], Q6K_D));
                            let s = _mm256_cvtepi32_ps(fold(sumi[r][c]));
                            acc[r][c] = _mm256_fmadd_ps(d, s, acc[r][c]);
                        }
                    }
                }
                for r in 0..R {
                    for c in 0..C {
                        out[r][c] = hsum8(acc[r][c]);
                    }
                }
            }
        }
    };
}

avx512_tiles!(
    vnni,
    "avx512f,avx512bw,avx512vnni,avx2,fma,f16c",
    madd_add_vnni
);
