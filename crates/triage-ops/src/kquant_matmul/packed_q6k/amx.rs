//! The packed Q6_K layout's steps of the AMX kernel (`kquant_matmul::amx`): per sub-block of 16
//! values, B is the sub-block's two groups, each as its first then its last four 6-bit values,
//! widened from the low and high bits as the VNNI kernel widens them; centring, scales and float
//! steps are the VNNI kernel's.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::amx::AmxLayout;
use super::{PackedQ6K, D_AT, QH_AT, QL_AT, SCALES_AT};

impl AmxLayout for PackedQ6K {
    const SUB_VALUES: usize = 16;

    #[inline(always)]
    unsafe fn unpack_b(tile: *const u8, pair: usize, dst: *mut u8) {
        // SAFETY: the caller's contract: the groups lie inside the tile, the B tile in `dst`.
        unsafe {
            let (m4, m2) = (_mm512_set1_epi8(0xF), _mm512_set1_epi8(3));
            let qh = _mm512_loadu_si512(tile.add(QH_AT + pair * 64).cast());
            let high = |shift: i32| {
                let h = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(shift));
                _mm512_slli_epi16::<4>(_mm512_and_si512(h, m2))
            };
            for h in 0..2 {
                let ql = _mm512_loadu_si512(tile.add(QL_AT + (2 * pair + h) * 64).cast());
                let shift = 4 * h as i32;
                let lo = _mm512_or_si512(_mm512_and_si512(ql, m4), high(shift));
                let hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                    high(shift + 2),
                );
                let at = dst.add(2 * h * 64);
                _mm512_storeu_si512(at.cast(), lo);
                _mm512_storeu_si512(at.add(64).cast(), hi);
            }
        }
    }

    #[inline(always)]
    unsafe fn add_sub_block(
        tile: *const u8,
        pair: usize,
        dots: __m512i,
        bsums: &[i16],
        sum: __m512i,
    ) -> __m512i {
        // SAFETY: the caller's contract: the scales lie inside the tile.
        unsafe {
            let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(tile.add(SCALES_AT + 16 * pair).cast()));
            let centred = _mm512_sub_epi32(dots, _mm512_set1_epi32(32 * bsums[pair] as i32));
            _mm512_add_epi32(sum, _mm512_mullo_epi32(centred, sc))
        }
    }

    #[inline(always)]
    unsafe fn finish(
        tile: *const u8,
        ya: f32,
        _bsums: &[i16],
        sum: __m512i,
        acc: __m512,
    ) -> __m512 {
        // SAFETY: the caller's contract: `d` lies inside the tile.
        unsafe {
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(D_AT).cast()));
            let d = _mm512_mul_ps(dv, _mm512_set1_ps(ya));
            _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc)
        }
    }
}
