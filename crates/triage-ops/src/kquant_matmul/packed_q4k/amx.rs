//! The AMX-INT8 kernel of the packed Q4_K layout: per sub-block of 32 values, `tdpbssd` multiplies
//! up to 16 activation rows (A: their 32 int8 values, read in place, one row `nb · 256` bytes
//! after the last) by the row tile's 16 rows (B: the sub-block's 4 groups, each unpacked to its low
//! and its high nibbles in turn, which is the order the activation values come in). Each int32
//! sum is the module's `Σ q · a` of one sub-block exactly; the scales, mins and float steps are
//! the VNNI kernel's, so the bits are the portable loop's.
//!
//! The tile instructions and their software model are `cpu::amx`'s.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::tiles::TILE_ROWS;
use super::super::Acts;
use super::{PackedQ4K, DMIN_AT, D_AT, QS_AT, SCALES_AT};
use crate::cpu::amx::{Aligned, TileConfig, Tiles, TA, TB, TC};

/// Activation rows a call takes: one A tile.
pub(in super::super) const AMX_ROWS: usize = 16;
/// Sub-blocks per super-block, and those in flight at once (one C tile each).
const SUB_BLOCKS: usize = 8;
const IN_FLIGHT: usize = 4;
/// Bytes of one sub-block's B tile: 8 steps × 16 rows × 4 values.
const B_BYTES: usize = 8 * 64;

/// Row tile `t` against activation rows `c0..c0 + rows` (`rows ≤ 16`): `out[c][r]`.
///
/// # Safety
/// The CPU has AVX-512 F/BW and F16C, and `tiles` can run (see `Tiles::configure`); `t` is a row
/// tile of `w` and `act` holds rows `c0..c0 + rows` of `w.nb` super-blocks.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(in super::super) unsafe fn tile_amx<T: Tiles>(
    tiles: &mut T,
    w: &PackedQ4K,
    t: usize,
    act: &Acts,
    c0: usize,
    rows: usize,
    out: &mut [[f32; TILE_ROWS]; AMX_ROWS],
) {
    assert!((1..=AMX_ROWS).contains(&rows));
    let m4 = _mm512_set1_epi8(0xF);
    let stride = act.nb * 256;
    let mut unpacked = Aligned([0u8; IN_FLIGHT * B_BYTES]);
    let mut sums = Aligned([[[0i32; TILE_ROWS]; AMX_ROWS]; IN_FLIGHT]);
    let mut acc = [_mm512_setzero_ps(); AMX_ROWS];
    // SAFETY (all): the caller's contract; the A tile reads `rows` rows of 32 values inside
    // `act`'s rows, B and C tiles read and write `unpacked` and `sums` within their bounds.
    unsafe {
        tiles.configure(&TileConfig::rows(rows));
        for b in 0..w.nb {
            let tile = w.tile(t, b).as_ptr();
            let mut s1 = [_mm512_setzero_si512(); AMX_ROWS];
            for first in (0..SUB_BLOCKS).step_by(IN_FLIGHT) {
                for k in 0..IN_FLIGHT {
                    let s = first + k;
                    // B: each group's low nibbles (its values 0–3), then its high (4–7).
                    for g in 0..4 {
                        let wv = _mm512_loadu_si512(tile.add(QS_AT + (4 * s + g) * 64).cast());
                        let lo = _mm512_and_si512(wv, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4);
                        let at = unpacked.0.as_mut_ptr().add(k * B_BYTES + 2 * g * 64);
                        _mm512_storeu_si512(at.cast(), lo);
                        _mm512_storeu_si512(at.add(64).cast(), hi);
                    }
                    let a = act.quants.as_ptr().add((c0 * act.nb + b) * 256 + 32 * s);
                    let (c, bt) = (TC + k as u8, TB + (k % 2) as u8);
                    tiles.load(TA, a, stride);
                    tiles.load(bt, unpacked.0.as_ptr().add(k * B_BYTES).cast(), 64);
                    tiles.zero(c);
                    tiles.dot(c, TA, bt);
                    tiles.store(c, sums.0[k].as_mut_ptr().cast(), 64);
                }
                for k in 0..IN_FLIGHT {
                    let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        tile.add(SCALES_AT + 16 * (first + k)).cast(),
                    ));
                    for c in 0..rows {
                        let p = _mm512_loadu_si512(sums.0[k][c].as_ptr().cast());
                        s1[c] = _mm512_add_epi32(s1[c], _mm512_mullo_epi32(p, sc));
                    }
                }
            }
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(D_AT).cast()));
            let dminv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(DMIN_AT).cast()));
            for c in 0..rows {
                let (ya, _, bsums) = act.block(c0 + c, b);
                let s2 = super::x86::min_sums(tile, bsums);
                let y = _mm512_set1_ps(ya);
                let s1f = _mm512_cvtepi32_ps(s1[c]);
                acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(dv, y), s1f, acc[c]);
                acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dminv, y), _mm512_cvtepi32_ps(s2), acc[c]);
            }
        }
        tiles.release();
        for c in 0..rows {
            _mm512_storeu_ps(out[c].as_mut_ptr(), acc[c]);
        }
    }
}
