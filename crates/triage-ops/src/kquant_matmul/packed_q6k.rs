//! Q6_K weights re-laid out like `packed_q4k`: each tile holds one super-block of 16 consecutive
//! rows, the low 4 bits of its values interleaved so that one 64-byte load gives 4 values of each
//! row, the high 2 bits of two groups in one more 64-byte load. Lossless and exactly the file's
//! size (6.5625 bits per weight); the GGUF blocks are dropped after packing.
//!
//! Order of operations, for every kernel: per super-block one exact int32 sum per output,
//! `S = Σ_s scale_s · Σ_i (q_i − 32)·a_i` over the 16 sub-blocks s of 16 values (formed as
//! `Σ q·a − 32·Σ a` with the activations' sums of 16), then `acc = fma(d·ya, S, acc)` in
//! super-block order. Every kernel gives the same bits; a row gives the same bits alone as in a
//! batch.

use super::blocks::{self, Q6K_BYTES, Q6K_D, Q6K_QH, Q6K_SCALES};
use super::packed::{impl_packed_kquant, PackedKQuant};
use super::tiles::{PackedTiles, TILE_ROWS};
use super::{Acts, AMX_ROWS, QK_K, TILE_A};

/// Bytes of one tile: 16 f16 `d`, 16 × 16 int8 scales, 32 groups × 16 rows × 4 bytes of low
/// bits, then 16 group pairs × 16 rows × 4 bytes of high bits.
pub(super) const TILE_BYTES: usize = 32 + 256 + QK_K / 2 * TILE_ROWS + QK_K / 4 * TILE_ROWS;
pub(super) const D_AT: usize = 0;
pub(super) const SCALES_AT: usize = 32;
pub(super) const QL_AT: usize = 288;
pub(super) const QH_AT: usize = QL_AT + QK_K / 2 * TILE_ROWS;

/// A Q6_K matrix in row tiles (`tiles.rs`).
pub(super) type PackedQ6K = PackedTiles<TILE_BYTES>;

/// From GGML's Q6_K rows (`rows · nb` blocks of 210 bytes).
pub(super) fn pack(rows: usize, nb: usize, ggml: &[u8]) -> PackedQ6K {
    PackedQ6K::pack(rows, nb, ggml, Q6K_BYTES, pack_row)
}

/// Row `r` (0..16) of a tile as 256 f32, as GGML's `dequantize_row_q6_K` writes it.
pub(super) fn dequantize_row(tile: &[u8], r: usize, out: &mut [f32]) {
    let d = blocks::f16_at(tile, D_AT + 2 * r);
    for (i, o) in out.iter_mut().enumerate().take(QK_K) {
        let scale = tile[SCALES_AT + TILE_ROWS * (i / 16) + r] as i8;
        *o = d * scale as f32 * (value(tile, r, i) as i32 - 32) as f32;
    }
}

/// Value `i` (0..256) of row `r` in a tile, 0..=63 (before the −32).
pub(super) fn value(tile: &[u8], r: usize, i: usize) -> u8 {
    let (group, within) = (i / 8, i % 8);
    let low = tile[QL_AT + (group * TILE_ROWS + r) * 4 + within % 4];
    let low = if within < 4 { low & 0xF } else { low >> 4 };
    // Group pair `group / 2`: each byte holds 2 bits of values j, 4 + j of the even group, then
    // of the odd one.
    let high = tile[QH_AT + (group / 2 * TILE_ROWS + r) * 4 + within % 4];
    let shift = 4 * (group % 2) + 2 * (within / 4);
    low | (((high >> shift) & 3) << 4)
}

/// Row `r` of a tile from one GGML Q6_K block.
fn pack_row(block: &[u8], r: usize, tile: &mut [u8]) {
    tile[D_AT + 2 * r..D_AT + 2 * r + 2].copy_from_slice(&block[Q6K_D..Q6K_D + 2]);
    for s in 0..16 {
        tile[SCALES_AT + TILE_ROWS * s + r] = block[Q6K_SCALES + s];
    }
    // A group's 8 values lie in one of GGML's runs of 32 (the same `ql` nibble half and `qh`
    // bit pair for all): their low bits are 8 consecutive `ql` bytes, their high bits 8
    // consecutive `qh` bytes, one word each.
    let word = |at: usize| u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes"));
    for group in 0..QK_K / 8 {
        let first = 8 * group;
        let (half, chunk, l) = (first / 128, first % 128 / 32, first % 32);
        let low =
            (word(64 * half + 32 * (chunk % 2) + l) >> (4 * (chunk / 2))) & 0x0F0F_0F0F_0F0F_0F0F;
        let high = (word(Q6K_QH + 32 * half + l) >> (2 * chunk)) & 0x0303_0303_0303_0303;
        let packed_low = (low as u32) | (((low >> 32) as u32) << 4);
        let packed_high = ((high as u32) | (((high >> 32) as u32) << 2)) << (4 * (group % 2));
        let at = QL_AT + (group * TILE_ROWS + r) * 4;
        tile[at..at + 4].copy_from_slice(&packed_low.to_le_bytes());
        let at = QH_AT + (group / 2 * TILE_ROWS + r) * 4;
        let both = u32::from_le_bytes(tile[at..at + 4].try_into().expect("4 bytes")) | packed_high;
        tile[at..at + 4].copy_from_slice(&both.to_le_bytes());
    }
}

/// The portable kernel: row `r` of row tile `t` against activation row `c`, in the order the
/// module's doc states.
pub(super) fn portable_row(w: &PackedQ6K, t: usize, r: usize, act: &Acts, c: usize) -> f32 {
    let mut acc = 0f32;
    for b in 0..w.nb {
        let tile = w.tile(t, b);
        let (ya, q8, bsums) = act.block(c, b);
        let mut sum = 0i32;
        for s in 0..16 {
            let p: i32 = (16 * s..16 * s + 16)
                .map(|i| value(tile, r, i) as i32 * q8[i] as i32)
                .sum();
            let scale = tile[SCALES_AT + TILE_ROWS * s + r] as i8 as i32;
            sum += scale * (p - 32 * bsums[s] as i32);
        }
        let d = blocks::f16_at(tile, D_AT + 2 * r) * ya;
        acc = d.mul_add(sum as f32, acc);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
pub(super) mod amx;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

// The layout's kernels, for `packed::row_tile`.
impl_packed_kquant!(PackedQ6K);
