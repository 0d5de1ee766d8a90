//! The AMX-INT8 kernel of `q8_matmul`: per block, `tdpbssd` multiplies an activation tile (8 rows
//! of the block's 32 values, tmm0) by up to 4 weight groups (each group's block is already the
//! 8 × 64-byte B operand AMX takes: step, row, 4 values), giving each (row, weight row) pair the
//! block's exact int32 dot product in tmm4..tmm7. The tiles are stored and scaled with AVX-512
//! as the other kernels scale: `acc = fma(dot, w_scale · a_scale, acc)` per block, in block
//! order, so AMX gives the portable loop's bits.
//!
//! The tile instructions, and their software model on which hosts without AMX test this body, are
//! `cpu::amx`'s.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::cpu::TileArgs;
use super::matrix::{BLOCK_STEPS, GROUP_ROWS, LANE_VALUES, SPAN_GROUPS};
use super::rows::TILE_ROWS;
use super::x86::{Start, NEXT_BLOCK, NEXT_BLOCK_SCALES, NEXT_GROUP, NEXT_GROUP_SCALES};
use super::{Q8Matrix, Q8Rows, QK8_0};
#[cfg(test)]
use crate::cpu::amx::Model;
use crate::cpu::amx::{Aligned, Hardware, TileConfig, Tiles, BC_ROW_BYTES, TA, TB, TC};
#[cfg(test)]
use crate::cpu::Isa;

/// Bytes of one row of the A tile: one block of one activation row.
const A_ROW_BYTES: usize = QK8_0;
// The B tiles are whole group blocks: 16 weight rows × 4 values a row.
const _: () = assert!(BC_ROW_BYTES == GROUP_ROWS * LANE_VALUES);

/// Weight groups `group..group + GW` against activation tile `tile`, on `tiles`.
///
/// # Safety
/// The CPU has AVX-512 F/VL (and, with `Hardware`, AMX as `Isa::amx_int8` found); the groups exist in
/// `w` within one span; the tile exists in `a` with `w.cols` columns; `out` holds
/// `(rows - 1) · out_stride + GW · 16` values for the tile's rows.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn tile<T: Tiles, const GW: usize>(
    tiles: &mut T,
    w: &Q8Matrix,
    group: usize,
    a: &Q8Rows,
    tile: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let s = Start::new(w, group, a, tile);
    let na = s.na;
    // One block of the tile's rows, row-major, as the A tile takes it (rows past `na` stay 0),
    // and the C tiles' dot products; both where the tile instructions read and write them.
    let mut block = Aligned([0i8; TILE_ROWS * A_ROW_BYTES]);
    let mut dots = Aligned([[0i32; TILE_ROWS * GROUP_ROWS]; SPAN_GROUPS]);
    let mut acc = [[_mm512_setzero_ps(); TILE_ROWS]; GW];
    // SAFETY (all): the caller's contract; `block` and `dots` hold the tiles' rows at these
    // strides, and the B operands are whole group blocks of the groups the caller named.
    unsafe {
        tiles.configure(&TileConfig::shape(TILE_ROWS, A_ROW_BYTES));
        for b in 0..s.kb {
            for step in 0..BLOCK_STEPS {
                for i in 0..na {
                    let at = ((b * BLOCK_STEPS + step) * na + i) * LANE_VALUES;
                    let four = s.aq.add(at);
                    let to = i * A_ROW_BYTES + step * LANE_VALUES;
                    std::ptr::copy_nonoverlapping(four, block.0[to..].as_mut_ptr(), LANE_VALUES);
                }
            }
            tiles.load(TA, block.0.as_ptr(), A_ROW_BYTES);
            for g in 0..GW {
                // Two B registers, so that one group's load need not wait for the last
                // group's product.
                let (c, bt) = (TC + g as u8, TB + (g % 2) as u8);
                tiles.zero(c);
                tiles.load(bt, s.wq.add(b * NEXT_BLOCK + g * NEXT_GROUP), BC_ROW_BYTES);
                tiles.dot(c, TA, bt);
                tiles.store(c, dots.0[g].as_mut_ptr(), BC_ROW_BYTES);
            }
            for g in 0..GW {
                let ws = _mm512_loadu_ps(s.ws.add(b * NEXT_BLOCK_SCALES + g * NEXT_GROUP_SCALES));
                for i in 0..na {
                    let dot = _mm512_loadu_si512(dots.0[g][i * GROUP_ROWS..].as_ptr().cast());
                    let d = _mm512_mul_ps(ws, _mm512_set1_ps(*s.as_.add(b * na + i)));
                    acc[g][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d, acc[g][i]);
                }
            }
        }
        tiles.release();
        for g in 0..GW {
            for i in 0..na {
                _mm512_storeu_ps(out.add(i * out_stride + g * GROUP_ROWS), acc[g][i]);
            }
        }
    }
}

/// Runs the kernel on the CPU's tiles (`Isa::amx_int8` said yes, as `cpu::available` checks) for the
/// tile of `args`, with `groups_left` weight groups from `args.group` on; returns how many groups
/// it did (up to the end of their span).
pub(super) fn run(args: TileArgs, groups_left: usize) -> usize {
    // SAFETY: `cpu::available` lists AMX only where `Isa::amx_int8` and AVX-512 F/VL were found.
    unsafe { run_on(&mut Hardware, args, groups_left) }
}

/// The kernel body on the software model of the tiles, where the CPU has AVX-512 F/VL (for the
/// scaling); `None` elsewhere.
#[cfg(test)]
pub(super) fn run_on_model(args: TileArgs, groups_left: usize) -> Option<usize> {
    let isa = Isa::get();
    if !(isa.avx512f && isa.avx512vl && isa.avx2_fma()) {
        return None;
    }
    // SAFETY: the features were detected above, and the model needs no AMX.
    Some(unsafe { run_on(&mut Model::new(), args, groups_left) })
}

/// # Safety
/// The CPU has AVX-512 F/VL, and `tiles` can run (see `Tiles::configure`).
unsafe fn run_on<T: Tiles>(tiles: &mut T, args: TileArgs, groups_left: usize) -> usize {
    let TileArgs {
        w,
        group,
        a,
        tile: t,
        out,
        out_stride,
    } = args;
    let na = a.tile_rows(t);
    let gw = groups_left.min(SPAN_GROUPS - group % SPAN_GROUPS);
    assert!(gw >= 1 && group + gw <= w.rows.div_ceil(GROUP_ROWS) && (1..=TILE_ROWS).contains(&na));
    assert!(w.cols == a.cols && out.len() >= (na - 1) * out_stride + gw * GROUP_ROWS);
    let out = out.as_mut_ptr();
    // SAFETY: the caller's contract for the CPU; the groups stay within one span and exist, the
    // tile exists with `w.cols` columns, and `out` holds every row's `gw · 16` values (asserted).
    unsafe {
        match gw {
            4 => tile::<T, 4>(tiles, w, group, a, t, out, out_stride),
            3 => tile::<T, 3>(tiles, w, group, a, t, out, out_stride),
            2 => tile::<T, 2>(tiles, w, group, a, t, out, out_stride),
            _ => tile::<T, 1>(tiles, w, group, a, t, out, out_stride),
        }
    }
    gw
}
