//! The AMX-INT8 kernel of the packed Q6_K layout: per sub-block of 16 values, `tdpbssd` multiplies
//! up to 16 activation rows (A: their 16 int8 values, read in place) by the row tile's 16 rows (B:
//! the sub-block's two groups, each as its first then its last four 6-bit values, widened from
//! the low and high bits as the VNNI kernel widens them), giving the module's `Σ q · a` exactly;
//! centring, scales and float steps are the VNNI kernel's, so the bits are the portable loop's.
//!
//! The tile instructions and their software model are `cpu::amx`'s.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::tiles::TILE_ROWS;
use super::super::{Acts, AMX_ROWS};
use super::{PackedQ6K, D_AT, QH_AT, QL_AT, SCALES_AT};
use crate::cpu::amx::{Aligned, TileConfig, Tiles, TA, TB, TC};

/// Sub-blocks per super-block, values in each, and those in flight at once (one C tile each).
const SUB_BLOCKS: usize = 16;
const SUB_VALUES: usize = 16;
const IN_FLIGHT: usize = 4;
/// Bytes of one sub-block's B tile: 4 steps × 16 rows × 4 values.
const B_BYTES: usize = 4 * 64;

/// Row tile `t` against activation rows `c0..c0 + rows` (`rows ≤ 16`): `out[c][r]`.
///
/// # Safety
/// The CPU has AVX-512 F/BW and F16C, and `tiles` can run (see `Tiles::configure`); `t` is a row
/// tile of `w` and `act` holds rows `c0..c0 + rows` of `w.nb` super-blocks.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(in super::super) unsafe fn tile_amx<T: Tiles>(
    tiles: &mut T,
    w: &PackedQ6K,
    t: usize,
    act: &Acts,
    c0: usize,
    rows: usize,
    out: &mut [[f32; TILE_ROWS]; AMX_ROWS],
) {
    assert!((1..=AMX_ROWS).contains(&rows));
    let (m4, m2) = (_mm512_set1_epi8(0xF), _mm512_set1_epi8(3));
    let stride = act.nb * 256;
    let mut unpacked = Aligned([0u8; IN_FLIGHT * B_BYTES]);
    let mut sums = Aligned([[[0i32; TILE_ROWS]; AMX_ROWS]; IN_FLIGHT]);
    let mut acc = [_mm512_setzero_ps(); AMX_ROWS];
    // SAFETY (all): the caller's contract; the A tile reads `rows` rows of 16 values inside
    // `act`'s rows, B and C tiles read and write `unpacked` and `sums` within their bounds.
    unsafe {
        tiles.configure(&TileConfig::shape(rows, SUB_VALUES));
        for b in 0..w.nb {
            let tile = w.tile(t, b).as_ptr();
            let mut sum = [_mm512_setzero_si512(); AMX_ROWS];
            for first in (0..SUB_BLOCKS).step_by(IN_FLIGHT) {
                for k in 0..IN_FLIGHT {
                    let pair = first + k;
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
                        let at = unpacked.0.as_mut_ptr().add(k * B_BYTES + 2 * h * 64);
                        _mm512_storeu_si512(at.cast(), lo);
                        _mm512_storeu_si512(at.add(64).cast(), hi);
                    }
                    let a = act
                        .quants
                        .as_ptr()
                        .add((c0 * act.nb + b) * 256 + SUB_VALUES * pair);
                    let (c, bt) = (TC + k as u8, TB + (k % 2) as u8);
                    tiles.load(TA, a, stride);
                    tiles.load(bt, unpacked.0.as_ptr().add(k * B_BYTES).cast(), 64);
                    tiles.zero(c);
                    tiles.dot(c, TA, bt);
                    tiles.store(c, sums.0[k].as_mut_ptr().cast(), 64);
                }
                for k in 0..IN_FLIGHT {
                    let pair = first + k;
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                        tile.add(SCALES_AT + 16 * pair).cast(),
                    ));
                    for c in 0..rows {
                        let (_, _, bsums) = act.block(c0 + c, b);
                        let p = _mm512_loadu_si512(sums.0[k][c].as_ptr().cast());
                        let centred =
                            _mm512_sub_epi32(p, _mm512_set1_epi32(32 * bsums[pair] as i32));
                        sum[c] = _mm512_add_epi32(sum[c], _mm512_mullo_epi32(centred, sc));
                    }
                }
            }
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(D_AT).cast()));
            for c in 0..rows {
                let (ya, _, _) = act.block(c0 + c, b);
                let d = _mm512_mul_ps(dv, _mm512_set1_ps(ya));
                acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum[c]), acc[c]);
            }
        }
        tiles.release();
        for c in 0..rows {
            _mm512_storeu_ps(out[c].as_mut_ptr(), acc[c]);
        }
    }
}
