//! CPU kernels of `q8_matmul`: which this CPU runs, the walk over a task's register tiles, and
//! the portable loop. Every kernel computes an output element the same way, so all give the same
//! bits: per block the exact integer dot product, then `acc = fma(dot, w_scale · a_scale, acc)`
//! in block order from 0.

use super::matrix::{BLOCK_STEPS, GROUP_BLOCK_BYTES, GROUP_ROWS, LANE_VALUES, SPAN_ROWS};
use super::rows::TILE_ROWS;
use super::{Q8Kernel, Q8Matrix, Q8Rows, QK8_0};
use crate::cpu::Isa;

/// The kernels this CPU can run, slowest first.
pub(super) fn available() -> Vec<Q8Kernel> {
    let isa = Isa::get();
    let mut kernels = vec![Q8Kernel::Portable];
    if isa.avx2_fma() {
        kernels.push(Q8Kernel::Avx2);
        if isa.avx_vnni {
            kernels.push(Q8Kernel::AvxVnni);
        }
        if isa.avx512f && isa.avx512bw && isa.avx512vl && isa.avx512vnni {
            kernels.push(Q8Kernel::Avx512Vnni);
        }
        if isa.avx512f && isa.avx512vl && isa.amx_int8() {
            kernels.push(Q8Kernel::Amx);
        }
    }
    kernels
}

/// One register tile's operands: weight groups from `group` on, activation tile `tile`.
pub(super) struct TileArgs<'a> {
    pub(super) w: &'a Q8Matrix,
    pub(super) group: usize,
    pub(super) a: &'a Q8Rows,
    pub(super) tile: usize,
    /// Output row `i`, group `g`'s 16 columns start at `out[i * out_stride + g * 16]`.
    pub(super) out: &'a mut [f32],
    pub(super) out_stride: usize,
}

/// Fill `out` (`[num_a, out_stride]`, row-major: activation rows `a0..a0 + num_a` by weight rows
/// `w0..w0 + num_w`, rounded up to whole groups, which `out_stride` holds) with `kernel`;
/// `w0` is a multiple of 64 (a span) and `a0` of 8.
#[allow(clippy::too_many_arguments)]
pub(super) fn tiles(
    kernel: Q8Kernel,
    w: &Q8Matrix,
    w0: usize,
    num_w: usize,
    a: &Q8Rows,
    a0: usize,
    num_a: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    debug_assert!(w0.is_multiple_of(SPAN_ROWS) && a0.is_multiple_of(TILE_ROWS));
    // Only some kernels read narrow values; for the others they are widened first.
    assert!(
        w.narrow.is_none() || kernel.reads_narrow(num_a),
        "{kernel:?} multiplies int8 values"
    );
    let groups = w0 / GROUP_ROWS..(w0 + num_w).div_ceil(GROUP_ROWS);
    assert!(groups.end * GROUP_ROWS - w0 <= out_stride && a0 + num_a <= a.rows);
    assert!(groups.end <= w.rows.div_ceil(GROUP_ROWS) && w.cols == a.cols);
    for tile in a0 / TILE_ROWS..(a0 + num_a).div_ceil(TILE_ROWS) {
        let first_row_at = (tile * TILE_ROWS - a0) * out_stride;
        let mut g = groups.start;
        while g < groups.end {
            let args = TileArgs {
                w,
                group: g,
                a,
                tile,
                out: &mut out[first_row_at + (g - groups.start) * GROUP_ROWS..],
                out_stride,
            };
            g += match kernel {
                #[cfg(target_arch = "x86_64")]
                Q8Kernel::Avx2 | Q8Kernel::AvxVnni | Q8Kernel::Avx512Vnni => {
                    super::x86::tile(kernel, args, groups.end - g)
                }
                #[cfg(target_arch = "x86_64")]
                Q8Kernel::Amx => super::amx::run(args, groups.end - g),
                _ => portable(args),
            };
        }
    }
}

/// One weight group against one activation tile; returns the groups done (1).
fn portable(args: TileArgs) -> usize {
    let TileArgs {
        w,
        group,
        a,
        tile,
        out,
        out_stride,
    } = args;
    let kb = w.cols / QK8_0;
    let na = a.tile_rows(tile);
    let (aq0, as0) = a.tile_start(tile);
    for i in 0..na {
        for lane in 0..GROUP_ROWS {
            let mut acc = 0f32;
            for b in 0..kb {
                let unit = w.group_block(group, b);
                let wq = &w.quants[unit * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                let aq = &a.quants[aq0 + b * BLOCK_STEPS * na * LANE_VALUES..];
                let mut dot = 0i32;
                for step in 0..BLOCK_STEPS {
                    let wv = &wq[(step * GROUP_ROWS + lane) * LANE_VALUES..][..LANE_VALUES];
                    let av = &aq[(step * na + i) * LANE_VALUES..][..LANE_VALUES];
                    dot += wv
                        .iter()
                        .zip(av)
                        .map(|(&x, &y)| x as i32 * y as i32)
                        .sum::<i32>();
                }
                let d = w.scales[unit * GROUP_ROWS + lane] * a.scales[as0 + b * na + i];
                acc = (dot as f32).mul_add(d, acc);
            }
            out[i * out_stride + lane] = acc;
        }
    }
    1
}
