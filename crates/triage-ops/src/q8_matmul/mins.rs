//! The min term of weights whose values are `d · q + m` (Q4_1, Q5_1): per output, the kernels'
//! product of the `d · q` part, plus `Σ_b m_b · s_b` with `s_b = d_a · Σ q_a` the activation
//! block's quantized sum rounded to f16 (what GGML's Q8_1 blocks carry, and llama.cpp's
//! `vec_dot_q4_1_q8_1` also adds apart from the integer sums), summed from block 0 as plain f32
//! multiplies and adds. It is the same code for every kernel and for a row alone or in a batch,
//! so `q8_matmul`'s bit-for-bit agreements hold for these types too.

use super::matrix::GROUP_ROWS;
use super::rows::TILE_ROWS;
use super::{Q8Matrix, Q8Rows, QK8_0};

/// Adds the min term to `out` (`[num_a, out_stride]`, as `cpu::tiles` filled it for weight rows
/// `w0..w0 + num_w` by activation rows `a0..a0 + num_a`); `mins` is `w`'s, laid out as its scales.
#[allow(clippy::too_many_arguments)]
pub(super) fn add(
    w: &Q8Matrix,
    mins: &[f32],
    w0: usize,
    num_w: usize,
    a: &Q8Rows,
    a0: usize,
    num_a: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let kb = w.cols / QK8_0;
    let groups = w0 / GROUP_ROWS..(w0 + num_w).div_ceil(GROUP_ROWS);
    for row in a0..a0 + num_a {
        let (tile, i) = (row / TILE_ROWS, row % TILE_ROWS);
        let (na, (_, s0)) = (a.tile_rows(tile), a.tile_start(tile));
        for g in groups.clone() {
            let mut acc = [0f32; GROUP_ROWS];
            for b in 0..kb {
                let s = a.sums[s0 + b * na + i];
                let m = &mins[w.group_block(g, b) * GROUP_ROWS..][..GROUP_ROWS];
                for (acc, &m) in acc.iter_mut().zip(m) {
                    *acc += m * s;
                }
            }
            let at = (row - a0) * out_stride + (g - groups.start) * GROUP_ROWS;
            for (o, acc) in out[at..at + GROUP_ROWS].iter_mut().zip(acc) {
                *o += acc;
            }
        }
    }
}
