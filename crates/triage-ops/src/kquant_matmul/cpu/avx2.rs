//! AVX2 tiles of Q6_K in place: `R` weight rows against `C` activation rows, with `maddubs` and
//! `madd` per 32 values as GGML's own x86 dot product (and the helpers the AVX-512 tiles share:
//! F16C scales, GGML's horizontal sum).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::blocks::{Q6K_BYTES, Q6K_D, Q6K_QH, Q6K_SCALES};
use super::super::KQuantMatrix;
use super::{Acts, TILE_A};

/// Weight rows per tile: AVX2's 16 registers hold 2 × 2 accumulators with two rows' unpacked
/// values and scales; more spills.
const TILE_R: usize = 1;

rows_loop!(q6k_rows, "avx2,fma,f16c", q6k, TILE_R);

/// The f16 at `block[at..at + 2]`, by F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_at(block: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([block[at], block[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// GGML's `hsum_float_8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum8(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// One Q6_K half (128 values) of a super-block as four chunks of 32 values, 0..=63.
///
/// # Safety
/// The CPU supports AVX2; `block` is a whole Q6_K super-block and `half` is 0 or 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_chunks(block: &[u8], half: usize) -> [__m256i; 4] {
    let (m4, m2) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
    let p = block.as_ptr();
    let ql0 = _mm256_loadu_si256(p.add(64 * half) as *const __m256i);
    let ql1 = _mm256_loadu_si256(p.add(64 * half + 32) as *const __m256i);
    let qh = _mm256_loadu_si256(p.add(Q6K_QH + 32 * half) as *const __m256i);
    let high = |h: __m256i| _mm256_slli_epi16(_mm256_and_si256(h, m2), 4);
    [
        _mm256_or_si256(_mm256_and_si256(ql0, m4), high(qh)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), high(_mm256_srli_epi16(qh, 2))),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
            high(_mm256_srli_epi16(qh, 4)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            high(_mm256_srli_epi16(qh, 6)),
        ),
    ]
}

/// Q6_K rows against `C` activation rows from `c0`.
///
/// # Safety
/// As for `q4k`, with Q6_K super-blocks.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6k<const R: usize, const C: usize>(
    rows: &[&[u8]; R],
    act: &Acts,
    c0: usize,
    out: &mut [[f32; TILE_A]; R],
) {
    let m32 = _mm256_set1_epi8(32);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for b in 0..act.nb {
        let sb: [&[u8]; R] = std::array::from_fn(|r| &rows[r][b * Q6K_BYTES..][..Q6K_BYTES]);
        let mut sumi = [[_mm256_setzero_si256(); C]; R];
        for half in 0..2 {
            let chunks: [[__m256i; 4]; R] = std::array::from_fn(|r| q6k_chunks(sb[r], half));
            for k in 0..4 {
                let scale: [__m256i; R] = std::array::from_fn(|r| {
                    let s = sb[r][Q6K_SCALES + 8 * half + 2 * k..].as_ptr() as *const i8;
                    _mm256_setr_m128i(_mm_set1_epi16(*s as i16), _mm_set1_epi16(*s.add(1) as i16))
                });
                for c in 0..C {
                    let q8 = act
                        .quants
                        .as_ptr()
                        .add(((c0 + c) * act.nb + b) * 256 + 128 * half + 32 * k);
                    let a = _mm256_loadu_si256(q8 as *const __m256i);
                    let offset = _mm256_maddubs_epi16(m32, a);
                    for r in 0..R {
                        let prod = _mm256_sub_epi16(_mm256_maddubs_epi16(chunks[r][k], a), offset);
                        sumi[r][c] =
                            _mm256_add_epi32(sumi[r][c], _mm256_madd_epi16(scale[r], prod));
                    }
                }
            }
        }
        for c in 0..C {
            let yd = act.d[(c0 + c) * act.nb + b];
            for r in 0..R {
                let d = _mm256_set1_ps(yd * f16_at(sb[r], Q6K_D));
                acc[r][c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[r][c]), acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            out[r][c] = hsum8(acc[r][c]);
        }
    }
}
