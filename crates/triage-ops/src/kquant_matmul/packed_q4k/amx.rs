//! The packed Q4_K layout's steps of the AMX kernel (`kquant_matmul::amx`): per sub-block of 32
//! values, B is the sub-block's 4 groups, each unpacked to its low and then its high nibbles
//! (the order the activation values come in); the scales, mins and float steps are the VNNI
//! kernel's.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::amx::AmxLayout;
use super::{PackedQ4K, DMIN_AT, D_AT, QS_AT, SCALES_AT};

impl AmxLayout for PackedQ4K {
    const SUB_VALUES: usize = 32;

    #[inline(always)]
    unsafe fn unpack_b(tile: *const u8, s: usize, dst: *mut u8) {
        // SAFETY: the caller's contract: the groups lie inside the tile, the B tile in `dst`.
        unsafe {
            let m4 = _mm512_set1_epi8(0xF);
            for g in 0..4 {
                let wv = _mm512_loadu_si512(tile.add(QS_AT + (4 * s + g) * 64).cast());
                let lo = _mm512_and_si512(wv, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4);
                let at = dst.add(2 * g * 64);
                _mm512_storeu_si512(at.cast(), lo);
                _mm512_storeu_si512(at.add(64).cast(), hi);
            }
        }
    }

    #[inline(always)]
    unsafe fn add_sub_block(
        tile: *const u8,
        s: usize,
        dots: __m512i,
        _bsums: &[i16],
        sum: __m512i,
    ) -> __m512i {
        // SAFETY: the caller's contract: the scales lie inside the tile.
        unsafe {
            let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(tile.add(SCALES_AT + 16 * s).cast()));
            _mm512_add_epi32(sum, _mm512_mullo_epi32(dots, sc))
        }
    }

    #[inline(always)]
    unsafe fn finish(tile: *const u8, ya: f32, bsums: &[i16], sum: __m512i, acc: __m512) -> __m512 {
        // SAFETY: the caller's contract: `d`, `dmin` and the mins lie inside the tile.
        unsafe {
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(D_AT).cast()));
            let dminv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(DMIN_AT).cast()));
            let s2 = super::x86::min_sums(tile, bsums);
            let y = _mm512_set1_ps(ya);
            let acc = _mm512_fmadd_ps(_mm512_mul_ps(dv, y), _mm512_cvtepi32_ps(sum), acc);
            _mm512_fnmadd_ps(_mm512_mul_ps(dminv, y), _mm512_cvtepi32_ps(s2), acc)
        }
    }
}
