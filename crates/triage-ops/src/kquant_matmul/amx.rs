//! The AMX-INT8 kernel of the packed K-quant layouts, written once: per sub-block, `tdpbssd`
//! multiplies up to 16 activation rows (A: the sub-block's int8 values, read in place, one row
//! `nb · 256` bytes after the last) by the row tile's 16 rows (B: the sub-block's 4-value groups,
//! unpacked to int8 by the layout in the order the activation values come in). Each int32 sum is
//! the layout's `Σ q · a` of one sub-block exactly; the layout then scales it (`AmxLayout`) as
//! its VNNI kernel does, so the bits are the portable loop's.
//!
//! The tile instructions and their software model are `cpu::amx`'s.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::tiles::{PackedTiles, TILE_ROWS};
use super::{Acts, AMX_ROWS, QK_K};
use crate::cpu::amx::{Aligned, TileConfig, Tiles, BC_ROW_BYTES, TA, TB, TC};

/// Sub-blocks in flight at once (one C tile each).
const IN_FLIGHT: usize = 4;
/// The largest B tile: 16 rows of 64 bytes.
const MAX_B_BYTES: usize = 16 * BC_ROW_BYTES;

/// How one packed layout feeds the AMX skeleton: its sub-blocks' B tiles, and the integer and
/// float steps that turn their exact dot products into the layout's sums. The steps run inside
/// `tile_amx` (AVX-512 F/BW, F16C), where they are inlined.
pub(super) trait AmxLayout {
    /// Values per sub-block: the A tile's bytes per row.
    const SUB_VALUES: usize;

    /// Writes sub-block `s`'s B tile (`SUB_VALUES / 4` rows of 64 bytes: 4 values of each of
    /// the 16 weight rows) from the super-block tile at `tile` to `dst`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW; `tile` is one packed super-block tile and `dst` is writable for
    /// the B tile.
    unsafe fn unpack_b(tile: *const u8, s: usize, dst: *mut u8);

    /// `sum` plus sub-block `s`'s part of one activation row's integer sum, from its dot products
    /// with the 16 weight rows (`dots`) and the row's sums of 16 (`bsums`).
    ///
    /// # Safety
    /// As for `unpack_b`, with `bsums` the row's 16 sums of this super-block.
    unsafe fn add_sub_block(
        tile: *const u8,
        s: usize,
        dots: __m512i,
        bsums: &[i16],
        sum: __m512i,
    ) -> __m512i;

    /// `acc` after one super-block's float steps for one activation row of scale `ya`.
    ///
    /// # Safety
    /// As for `add_sub_block`, and the CPU has F16C.
    unsafe fn finish(tile: *const u8, ya: f32, bsums: &[i16], sum: __m512i, acc: __m512) -> __m512;
}

/// Row tile `t` against activation rows `c0..c0 + rows` (`rows ≤ 16`): `out[c][r]`.
///
/// # Safety
/// The CPU has AVX-512 F/BW and F16C, and `tiles` can run (see `Tiles::configure`); `t` is a row
/// tile of `w` and `act` holds rows `c0..c0 + rows` of `w.nb` super-blocks.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn tile_amx<T: Tiles, const BYTES: usize>(
    tiles: &mut T,
    w: &PackedTiles<BYTES>,
    t: usize,
    act: &Acts,
    c0: usize,
    rows: usize,
    out: &mut [[f32; TILE_ROWS]; AMX_ROWS],
) where
    PackedTiles<BYTES>: AmxLayout,
{
    let sub_values = <PackedTiles<BYTES> as AmxLayout>::SUB_VALUES;
    let (sub_blocks, b_bytes) = (QK_K / sub_values, sub_values / 4 * BC_ROW_BYTES);
    assert!((1..=AMX_ROWS).contains(&rows) && b_bytes <= MAX_B_BYTES);
    assert!(sub_blocks.is_multiple_of(IN_FLIGHT));
    let stride = act.nb * 256;
    let mut unpacked = Aligned([0u8; IN_FLIGHT * MAX_B_BYTES]);
    let mut sums = Aligned([[[0i32; TILE_ROWS]; AMX_ROWS]; IN_FLIGHT]);
    let mut acc = [_mm512_setzero_ps(); AMX_ROWS];
    // SAFETY (all): the caller's contract; the A tile reads `rows` rows of `sub_values` values
    // inside `act`'s rows, B and C tiles read and write `unpacked` and `sums` within their bounds.
    unsafe {
        tiles.configure(&TileConfig::shape(rows, sub_values));
        for b in 0..w.nb {
            let tile = w.tile(t, b).as_ptr();
            let mut sum = [_mm512_setzero_si512(); AMX_ROWS];
            for first in (0..sub_blocks).step_by(IN_FLIGHT) {
                for k in 0..IN_FLIGHT {
                    let s = first + k;
                    let bt_at = unpacked.0.as_mut_ptr().add(k * b_bytes);
                    PackedTiles::<BYTES>::unpack_b(tile, s, bt_at);
                    let a = act
                        .quants
                        .as_ptr()
                        .add((c0 * act.nb + b) * 256 + sub_values * s);
                    let (c, bt) = (TC + k as u8, TB + (k % 2) as u8);
                    tiles.load(TA, a, stride);
                    tiles.load(bt, bt_at.cast_const().cast(), BC_ROW_BYTES);
                    tiles.zero(c);
                    tiles.dot(c, TA, bt);
                    tiles.store(c, sums.0[k].as_mut_ptr().cast(), BC_ROW_BYTES);
                }
                add_in_flight::<PackedTiles<BYTES>>(
                    tile,
                    first,
                    &sums.0,
                    act,
                    (c0, rows),
                    b,
                    &mut sum,
                );
            }
            for c in 0..rows {
                let (ya, _, bsums) = act.block(c0 + c, b);
                acc[c] = PackedTiles::<BYTES>::finish(tile, ya, bsums, sum[c], acc[c]);
            }
        }
        tiles.release();
        for c in 0..rows {
            _mm512_storeu_ps(out[c].as_mut_ptr(), acc[c]);
        }
    }
}

/// Adds the dot products of the sub-blocks in flight from `first` on (`sums[k][c]`: sub-block
/// `first + k`, activation row `c0 + c`) to each row's integer sum of super-block `b`.
///
/// # Safety
/// As for `AmxLayout::add_sub_block`; `act` holds rows `c0..c0 + rows`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn add_in_flight<L: AmxLayout>(
    tile: *const u8,
    first: usize,
    sums: &[[[i32; TILE_ROWS]; AMX_ROWS]; IN_FLIGHT],
    act: &Acts,
    (c0, rows): (usize, usize),
    b: usize,
    sum: &mut [__m512i; AMX_ROWS],
) {
    for k in 0..IN_FLIGHT {
        for c in 0..rows {
            let (_, _, bsums) = act.block(c0 + c, b);
            // SAFETY: the caller's contract; `sums[k][c]` is 16 int32.
            unsafe {
                let dots = _mm512_loadu_si512(sums[k][c].as_ptr().cast());
                sum[c] = L::add_sub_block(tile, first + k, dots, bsums, sum[c]);
            }
        }
    }
}
