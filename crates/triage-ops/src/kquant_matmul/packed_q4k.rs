//! Q4_K weights re-laid out for products across rows: each tile holds one super-block (256
//! values) of 16 consecutive rows, its 4-bit values interleaved so that one 64-byte load gives 4
//! values of each of the 16 rows (one `vpdpbusd` against 4 broadcast activations), its scales and
//! mins unpacked to bytes. Lossless, and about the file's size (4.625 bits per weight against
//! 4.5): the GGUF blocks are dropped after packing, so nothing is stored twice.
//!
//! Order of operations, for every kernel: per super-block two exact int32 sums per output,
//! `S1 = Σ_s scale_s · Σ_i q_i·a_i` and `S2 = Σ_s min_s · Σ_i a_i` (sub-blocks s of 32), then
//! `acc = fma(d·ya, S1, acc)` and `acc = fma(−(dmin·ya), S2, acc)` in super-block order. The
//! integers do not depend on how a kernel forms them, so every kernel gives the same bits, and a
//! row gives the same bits alone as in a batch.

use super::blocks::{self, Q4K_BYTES, Q4K_QS};
use super::packed::{impl_packed_kquant, PackedKQuant};
use super::tiles::{PackedTiles, TILE_ROWS};
use super::{Acts, AMX_ROWS, QK_K, TILE_A};
/// Bytes of one tile: 16 f16 `d`, 16 f16 `dmin`, 8 × 16 scales, 8 × 16 mins, then
/// 32 groups × 16 rows × 4 bytes of values.
pub(super) const TILE_BYTES: usize = 64 + 256 + QK_K / 2 * TILE_ROWS;
pub(super) const D_AT: usize = 0;
pub(super) const DMIN_AT: usize = 32;
pub(super) const SCALES_AT: usize = 64;
pub(super) const MINS_AT: usize = 192;
pub(super) const QS_AT: usize = 320;

/// A Q4_K matrix in row tiles (`tiles.rs`).
pub(super) type PackedQ4K = PackedTiles<TILE_BYTES>;

/// From GGML's Q4_K rows (`rows · nb` blocks of 144 bytes).
pub(super) fn pack(rows: usize, nb: usize, ggml: &[u8]) -> PackedQ4K {
    PackedQ4K::pack(rows, nb, ggml, Q4K_BYTES, pack_row)
}

/// Row `r` (0..16) of a tile as 256 f32, as GGML's `dequantize_row_q4_K` writes it.
pub(super) fn dequantize_row(tile: &[u8], r: usize, out: &mut [f32]) {
    let d = blocks::f16_at(tile, D_AT + 2 * r);
    let dmin = blocks::f16_at(tile, DMIN_AT + 2 * r);
    for (i, o) in out.iter_mut().enumerate().take(QK_K) {
        let s = i / 32;
        let sc = tile[SCALES_AT + TILE_ROWS * s + r] as f32;
        let m = tile[MINS_AT + TILE_ROWS * s + r] as f32;
        *o = d * sc * value(tile, r, i) as f32 - dmin * m;
    }
}

/// Value `i` (0..256) of row `r` in a tile: group `i / 8`, byte `i % 4` of the row's four, low
/// nibble for the group's first four values and high for the last four.
pub(super) fn value(tile: &[u8], r: usize, i: usize) -> u8 {
    let (group, within) = (i / 8, i % 8);
    let byte = tile[QS_AT + (group * TILE_ROWS + r) * 4 + within % 4];
    if within < 4 {
        byte & 0xF
    } else {
        byte >> 4
    }
}

/// Row `r` of a tile from one GGML Q4_K block.
fn pack_row(block: &[u8], r: usize, tile: &mut [u8]) {
    tile[D_AT + 2 * r..D_AT + 2 * r + 2].copy_from_slice(&block[0..2]);
    tile[DMIN_AT + 2 * r..DMIN_AT + 2 * r + 2].copy_from_slice(&block[2..4]);
    let sm = blocks::q4k_scales_mins(block);
    for s in 0..8 {
        tile[SCALES_AT + TILE_ROWS * s + r] = sm[s];
        tile[MINS_AT + TILE_ROWS * s + r] = sm[8 + s];
    }
    // GGML keeps values 64k..64k+31 in the low nibbles of bytes 32k..32k+31 and 64k+32..64k+63
    // in their high nibbles; a packed group of 8 values lies inside one such run of 32.
    let qs = &block[Q4K_QS..];
    for group in 0..QK_K / 8 {
        let first = 8 * group;
        let byte0 = 32 * (first / 64) + first % 32;
        let shift = if first % 64 < 32 { 0 } else { 4 };
        // The group's eight nibbles: bytes byte0..byte0 + 8, one word.
        let word = u64::from_le_bytes(qs[byte0..byte0 + 8].try_into().expect("8 bytes"));
        let nibbles = (word >> shift) & 0x0F0F_0F0F_0F0F_0F0F;
        let packed = (nibbles as u32) | (((nibbles >> 32) as u32) << 4);
        let at = QS_AT + (group * TILE_ROWS + r) * 4;
        tile[at..at + 4].copy_from_slice(&packed.to_le_bytes());
    }
}

/// The portable kernel: row `r` of row tile `t` against activation row `c`, in the order the
/// module's doc states.
pub(super) fn portable_row(w: &PackedQ4K, t: usize, r: usize, act: &Acts, c: usize) -> f32 {
    let mut acc = 0f32;
    for b in 0..w.nb {
        let tile = w.tile(t, b);
        let (ya, q8, bsums) = act.block(c, b);
        let (mut s1, mut s2) = (0i32, 0i32);
        for s in 0..8 {
            let p: i32 = (32 * s..32 * s + 32)
                .map(|i| value(tile, r, i) as i32 * q8[i] as i32)
                .sum();
            s1 += tile[SCALES_AT + TILE_ROWS * s + r] as i32 * p;
            let a = bsums[2 * s] as i32 + bsums[2 * s + 1] as i32;
            s2 += tile[MINS_AT + TILE_ROWS * s + r] as i32 * a;
        }
        let d = blocks::f16_at(tile, D_AT + 2 * r) * ya;
        let dmin = blocks::f16_at(tile, DMIN_AT + 2 * r) * ya;
        acc = d.mul_add(s1 as f32, acc);
        acc = (-dmin).mul_add(s2 as f32, acc);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
pub(super) mod amx;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

// The layout's kernels, for `packed::row_tile`.
impl_packed_kquant!(PackedQ4K);
