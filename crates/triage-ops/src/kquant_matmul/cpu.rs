//! CPU kernels of `kquant_matmul`: the packed Q4_K and Q6_K row tiles (`packed_q4k`,
//! `packed_q6k`) against several activation rows at a time, each with a portable loop that
//! states the order of operations and x86 kernels that give its bits (AVX2, AVX-512 VNNI, AMX).
//!
//! A row tile runs against four activation rows at a time with AVX-512 VNNI, three with AVX2,
//! whose 16 registers spill a fourth row's int sums to the stack (f97f2e3); sixteen with AMX
//! (`packed`'s walk).

use super::packed::row_tile;
use super::tiles::TILE_ROWS;
use super::{Acts, KQuantData, KQuantKernel, KQuantMatrix, Q8KRows, QK_K};
use crate::cpu::Isa;

/// The kernels this CPU can run, slowest first.
pub(super) fn available() -> Vec<KQuantKernel> {
    let isa = Isa::get();
    let mut kernels = vec![KQuantKernel::Portable];
    if isa.avx2_fma() && isa.f16c {
        kernels.push(KQuantKernel::Avx2);
        if isa.avx512f && isa.avx512bw && isa.avx512vnni {
            kernels.push(KQuantKernel::Avx512Vnni);
            if isa.amx_int8() {
                kernels.push(KQuantKernel::Amx);
            }
        }
    }
    kernels
}

/// Fill `dst` (`[num_w, num_a]`: weight rows `w0..w0 + num_w` by activation rows
/// `a0..a0 + num_a`). The weight rows are one row tile: `w0` is a multiple of 16 and
/// `num_w ≤ 16` (tasks are tile-aligned).
#[allow(clippy::too_many_arguments)]
pub(super) fn tiles(
    kernel: KQuantKernel,
    w: &KQuantMatrix,
    w0: usize,
    num_w: usize,
    a: &Q8KRows,
    a0: usize,
    num_a: usize,
    dst: &mut [f32],
) {
    assert!(w0 + num_w <= w.rows && a0 + num_a <= a.rows && w.cols == a.cols);
    assert!(w0.is_multiple_of(TILE_ROWS) && num_w <= TILE_ROWS && dst.len() >= num_w * num_a);
    // Slicing checks that the activation rows are inside `a`; the kernels read within them and
    // within the row tile.
    let nb = a.cols / QK_K;
    let act = Acts {
        nb,
        d: &a.d[a0 * nb..(a0 + num_a) * nb],
        quants: &a.quants[a0 * a.cols..(a0 + num_a) * a.cols],
        bsums: &a.bsums[a0 * a.cols / 16..(a0 + num_a) * a.cols / 16],
    };
    let t = w0 / TILE_ROWS;
    match &w.data {
        KQuantData::PackedQ4K(p) => row_tile(kernel, p, t, num_w, &act, num_a, dst),
        KQuantData::PackedQ6K(p) => row_tile(kernel, p, t, num_w, &act, num_a, dst),
    }
}
