//! CPU kernels of `kquant_matmul`, picked per representation: Q4_K's packed tiles
//! (`packed_q4k`), and Q6_K's GGML blocks read in place, where a tile is weight rows against up
//! to four activation rows whose values are unpacked once per group. Each has a portable loop
//! that states the order of operations and x86 kernels that give its bits.

use super::blocks::{self, Q6K_D, Q6K_SCALES};
use super::packed_q4k::{self, PackedQ4K, TILE_ROWS};
use super::{Acts, KQuantData, KQuantKernel, KQuantMatrix, Q8KRows, QK_K, TILE_A};

/// The kernels this CPU can run, slowest first.
pub(super) fn available() -> Vec<KQuantKernel> {
    let mut kernels = vec![KQuantKernel::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            kernels.push(KQuantKernel::Avx2);
            if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                kernels.push(KQuantKernel::Avx512Vnni);
            }
        }
    }
    kernels
}

/// Fill `dst` (`[num_w, num_a]`: weight rows `w0..w0 + num_w` by activation rows
/// `a0..a0 + num_a`).
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
    assert!(dst.len() >= num_w * num_a);
    // Slicing checks that the activation rows are inside `a`; the kernels read within them and
    // within the weight rows, whose length is `cols / 256` super-blocks.
    let nb = a.cols / QK_K;
    let act = Acts {
        nb,
        d: &a.d[a0 * nb..(a0 + num_a) * nb],
        quants: &a.quants[a0 * a.cols..(a0 + num_a) * a.cols],
        bsums: &a.bsums[a0 * a.cols / 16..(a0 + num_a) * a.cols / 16],
    };
    match &w.data {
        KQuantData::PackedQ4K(packed) => packed_tiles(kernel, packed, w0, num_w, &act, num_a, dst),
        KQuantData::Q6K(_) => q6k_tiles(kernel, w, w0, num_w, &act, num_a, dst),
    }
}

/// Packed Q4_K: the task's rows are one row tile (tasks are tile-aligned).
fn packed_tiles(
    kernel: KQuantKernel,
    w: &PackedQ4K,
    w0: usize,
    num_w: usize,
    act: &Acts,
    num_a: usize,
    dst: &mut [f32],
) {
    assert!(w0 % TILE_ROWS == 0 && num_w <= TILE_ROWS);
    let t = w0 / TILE_ROWS;
    let step = match kernel {
        KQuantKernel::Avx512Vnni => TILE_A,
        _ => 2,
    };
    for c0 in (0..num_a).step_by(step) {
        let ta = step.min(num_a - c0);
        let mut out = [[0f32; TILE_ROWS]; TILE_A];
        // SAFETY: `kernel` came from `available()`, so the CPU runs the instructions it is
        // compiled for; `t` is a row tile of `w` and `act` holds rows `c0..c0 + ta`.
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        let done = unsafe {
            use packed_q4k::x86::{tile_avx2, tile_vnni};
            match (kernel, ta) {
                (KQuantKernel::Avx512Vnni, 4) => tile_vnni::<4>(w, t, act, c0, &mut out),
                (KQuantKernel::Avx512Vnni, 3) => tile_vnni::<3>(w, t, act, c0, &mut out),
                (KQuantKernel::Avx512Vnni, 2) => tile_vnni::<2>(w, t, act, c0, &mut out),
                (KQuantKernel::Avx512Vnni, _) => tile_vnni::<1>(w, t, act, c0, &mut out),
                (KQuantKernel::Avx2, 2) => tile_avx2::<2>(w, t, act, c0, &mut out),
                (KQuantKernel::Avx2, _) => tile_avx2::<1>(w, t, act, c0, &mut out),
                (KQuantKernel::Portable, _) => {}
            }
            kernel != KQuantKernel::Portable
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = false;
        if !done {
            for (c, row) in out.iter_mut().enumerate().take(ta) {
                for (r, o) in row.iter_mut().enumerate().take(num_w) {
                    *o = packed_q4k::portable_row(w, t, r, act, c0 + c);
                }
            }
        }
        for (c, row) in out.iter().enumerate().take(ta) {
            for (r, &o) in row.iter().enumerate().take(num_w) {
                dst[r * num_a + c0 + c] = o;
            }
        }
    }
}

/// Q6_K blocks in place.
fn q6k_tiles(
    kernel: KQuantKernel,
    w: &KQuantMatrix,
    w0: usize,
    num_w: usize,
    act: &Acts,
    num_a: usize,
    dst: &mut [f32],
) {
    // SAFETY (all): `kernel` came from `available()`, so the CPU runs the instructions the
    // kernel is compiled for; `act` holds `num_a` rows of `nb` super-blocks and every weight
    // row `nb` super-blocks of `w.ty`, which is all the kernels read.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    match kernel {
        KQuantKernel::Avx2 => return unsafe { avx2::q6k_rows(w, w0, num_w, act, num_a, dst) },
        KQuantKernel::Avx512Vnni => {
            return unsafe { avx512::vnni::q6k_rows(w, w0, num_w, act, num_a, dst) }
        }
        KQuantKernel::Portable => {}
    }
    for r in 0..num_w {
        let row = w.row(w0 + r);
        for c in 0..num_a {
            dst[r * num_a + c] = portable_q6k(row, act, c);
        }
    }
}

/// Defines `$name`: every weight row of a task against its activation rows, in tiles of `$r`
/// weight rows (the tail one at a time) by up to four activation rows, through the
/// `$tile::<R, C>` kernel (inlined: one call per task, not per tile).
#[cfg(target_arch = "x86_64")]
macro_rules! rows_loop {
    ($name:ident, $features:literal, $tile:ident, $r:expr) => {
        /// Weight rows `w0..w0 + num_w` against `act`'s `num_a` rows into `dst` (`[num_w, num_a]`).
        ///
        /// # Safety
        #[doc = concat!("The CPU supports ", $features, "; `act` holds `num_a` rows of super-blocks")]
        /// as long as `w`'s rows, and `w0 + num_w <= w.rows`.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(
            w: &KQuantMatrix,
            w0: usize,
            num_w: usize,
            act: &Acts,
            num_a: usize,
            dst: &mut [f32],
        ) {
            const R: usize = $r;
            let mut r = 0;
            while r < num_w {
                let wide = num_w - r >= R;
                for c0 in (0..num_a).step_by(TILE_A) {
                    let ta = TILE_A.min(num_a - c0);
                    if wide {
                        let rows: [&[u8]; R] = std::array::from_fn(|i| w.row(w0 + r + i));
                        let mut out = [[0f32; TILE_A]; R];
                        match ta {
                            4 => $tile::<R, 4>(&rows, act, c0, &mut out),
                            3 => $tile::<R, 3>(&rows, act, c0, &mut out),
                            2 => $tile::<R, 2>(&rows, act, c0, &mut out),
                            _ => $tile::<R, 1>(&rows, act, c0, &mut out),
                        }
                        for (i, o) in out.iter().enumerate() {
                            dst[(r + i) * num_a + c0..][..ta].copy_from_slice(&o[..ta]);
                        }
                    } else {
                        let rows = [w.row(w0 + r)];
                        let mut out = [[0f32; TILE_A]; 1];
                        match ta {
                            4 => $tile::<1, 4>(&rows, act, c0, &mut out),
                            3 => $tile::<1, 3>(&rows, act, c0, &mut out),
                            2 => $tile::<1, 2>(&rows, act, c0, &mut out),
                            _ => $tile::<1, 1>(&rows, act, c0, &mut out),
                        }
                        dst[r * num_a + c0..][..ta].copy_from_slice(&out[0][..ta]);
                    }
                }
                r += if wide { R } else { 1 };
            }
        }
    };
}

/// GGML's `hsum_float_8`: halves added, then pairs, then the last two.
fn hsum8(x: [f32; 8]) -> f32 {
    let r = [x[4] + x[0], x[5] + x[1], x[6] + x[2], x[7] + x[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Q6_K row · activation row `c`.
fn portable_q6k(row: &[u8], act: &Acts, c: usize) -> f32 {
    let mut acc = [0f32; 8];
    for (b, block) in row.chunks_exact(blocks::Q6K_BYTES).enumerate() {
        let (yd, q8, _) = act.block(c, b);
        let d = yd * blocks::f16_at(block, Q6K_D);
        let mut sumi = [0i32; 8];
        // Eight chunks of 32 values; lane l takes values 4l..4l+3 of each, whose scale is the
        // chunk's first (lanes 0–3) or second (lanes 4–7) of 16.
        for chunk in 0..8 {
            for (l, lane) in sumi.iter_mut().enumerate() {
                let mut sum = 0i32;
                for i in 4 * l..4 * l + 4 {
                    let (q, _) = blocks::q6k_value(block, 32 * chunk + i);
                    sum += (q as i32 - 32) * q8[32 * chunk + i] as i32;
                }
                let scale = block[Q6K_SCALES + 2 * chunk + l / 4] as i8;
                *lane += scale as i32 * sum;
            }
        }
        for (lane, &s) in acc.iter_mut().zip(&sumi) {
            *lane = d.mul_add(s as f32, *lane);
        }
    }
    hsum8(acc)
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
