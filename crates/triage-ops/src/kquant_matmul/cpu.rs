//! CPU kernels of `kquant_matmul`: the packed Q4_K and Q6_K row tiles (`packed_q4k`,
//! `packed_q6k`) against up to four activation rows at a time, each with a portable loop that
//! states the order of operations and x86 kernels that give its bits (AVX2, AVX-512 VNNI).

use super::packed_q4k::{self, PackedQ4K};
use super::packed_q6k::{self, PackedQ6K};
use super::tiles::TILE_ROWS;
use super::{Acts, KQuantData, KQuantKernel, KQuantMatrix, Q8KRows, AMX_ROWS, QK_K, TILE_A};
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
        KQuantData::PackedQ4K(p) => q4k_tiles(kernel, p, t, num_w, &act, num_a, dst),
        KQuantData::PackedQ6K(p) => q6k_tiles(kernel, p, t, num_w, &act, num_a, dst),
    }
}

/// `all` as the `N` output rows a kernel fills (the buffer was made for that kernel).
#[cfg(target_arch = "x86_64")]
fn rows<const N: usize>(all: &mut [[f32; TILE_ROWS]]) -> &mut [[f32; TILE_ROWS]; N] {
    all.try_into().expect("the kernel's output rows")
}

/// Defines `$name`: row tile `t` (its first `num_w` rows) of a `$packed` matrix against `act`'s
/// `num_a` rows, sixteen at a time with AMX, four with AVX-512 VNNI, three with AVX2, one by one
/// portably.
macro_rules! packed_tiles {
    ($name:ident, $packed:ty, $module:ident) => {
        fn $name(
            kernel: KQuantKernel,
            w: &$packed,
            t: usize,
            num_w: usize,
            act: &Acts,
            num_a: usize,
            dst: &mut [f32],
        ) {
            let step = match kernel {
                KQuantKernel::Amx => AMX_ROWS,
                KQuantKernel::Avx512Vnni => TILE_A,
                // Three rows' int sums fit AVX2's 16 registers; four spilled one to the stack
                // (`ops_kquant_matmul`, 128 rows, three alternations: Q4_K 115–138 GMAC/s
                // against 101–117, Q6_K 63–102 against 74–83).
                KQuantKernel::Avx2 => 3,
                KQuantKernel::Portable => 1,
            };
            for c0 in (0..num_a).step_by(step) {
                let ta = step.min(num_a - c0);
                // 16 output rows for AMX only: zeroing them for every tile of a decode step
                // would add to its hot loop what the other kernels never read.
                let (mut rows_amx, mut rows_reg);
                let all: &mut [[f32; TILE_ROWS]] = if kernel == KQuantKernel::Amx {
                    rows_amx = [[0f32; TILE_ROWS]; AMX_ROWS];
                    &mut rows_amx
                } else {
                    rows_reg = [[0f32; TILE_ROWS]; TILE_A];
                    &mut rows_reg
                };
                // SAFETY: `kernel` came from `available()`, so the CPU runs the instructions it
                // is compiled for; `t` is a row tile of `w` and `act` holds rows `c0..c0 + ta`.
                #[cfg(target_arch = "x86_64")]
                #[allow(unsafe_code)]
                let done = unsafe {
                    use $module::x86::{row_avx2, tile_avx2, tile_vnni};
                    let (amx, reg) = (rows::<AMX_ROWS>, rows::<TILE_A>);
                    match (kernel, ta) {
                        (KQuantKernel::Amx, _) => $module::amx_tiles(w, t, act, c0, ta, amx(all)),
                        (KQuantKernel::Avx512Vnni, 4) => tile_vnni::<4>(w, t, act, c0, reg(all)),
                        (KQuantKernel::Avx512Vnni, 3) => tile_vnni::<3>(w, t, act, c0, reg(all)),
                        (KQuantKernel::Avx512Vnni, 2) => tile_vnni::<2>(w, t, act, c0, reg(all)),
                        (KQuantKernel::Avx512Vnni, _) => tile_vnni::<1>(w, t, act, c0, reg(all)),
                        (KQuantKernel::Avx2, 3) => tile_avx2::<3>(w, t, act, c0, reg(all)),
                        (KQuantKernel::Avx2, 2) => tile_avx2::<2>(w, t, act, c0, reg(all)),
                        (KQuantKernel::Avx2, _) => row_avx2(w, t, act, c0, reg(all)),
                        (KQuantKernel::Portable, _) => {}
                    }
                    kernel != KQuantKernel::Portable
                };
                #[cfg(not(target_arch = "x86_64"))]
                let done = false;
                if !done {
                    for (c, row) in all.iter_mut().enumerate().take(ta) {
                        for (r, o) in row.iter_mut().enumerate().take(num_w) {
                            *o = $module::portable_row(w, t, r, act, c0 + c);
                        }
                    }
                }
                for (c, row) in all.iter().enumerate().take(ta) {
                    for (r, &o) in row.iter().enumerate().take(num_w) {
                        dst[r * num_a + c0 + c] = o;
                    }
                }
            }
        }
    };
}

packed_tiles!(q4k_tiles, PackedQ4K, packed_q4k);
packed_tiles!(q6k_tiles, PackedQ6K, packed_q6k);
