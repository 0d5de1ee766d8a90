//! What the packed K-quant layouts (`packed_q4k`, `packed_q6k`) share: the kernels each layout
//! provides (`PackedKQuant`), and the walk that runs them over a row tile's activation rows,
//! sixteen at a time with AMX, four with AVX-512 VNNI, three with AVX2, one by one portably.

use super::tiles::{PackedTiles, TILE_ROWS};
use super::{Acts, KQuantKernel, AMX_ROWS, TILE_A};

/// A packed K-quant layout's kernels over one row tile `t` (16 weight rows). Each gives the bits
/// of `portable_row`, whose layout module states the order of operations.
#[allow(unsafe_code)]
pub(super) trait PackedKQuant {
    /// Row `r` of row tile `t` against activation row `c`, in the layout's order.
    fn portable_row(&self, t: usize, r: usize, act: &Acts, c: usize) -> f32;

    /// Row tile `t` against activation rows `c0..c0 + C`: `out[c][r]`, with AVX-512 VNNI.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F/BW/VNNI, AVX2, FMA and F16C; `t` is a row tile of `self` and
    /// `act` holds rows `c0..c0 + C`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_vnni<const C: usize>(
        &self,
        t: usize,
        act: &Acts,
        c0: usize,
        out: &mut [[f32; TILE_ROWS]; TILE_A],
    );

    /// As `tile_vnni`, with AVX2.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C; as for `tile_vnni` otherwise.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_avx2<const C: usize>(
        &self,
        t: usize,
        act: &Acts,
        c0: usize,
        out: &mut [[f32; TILE_ROWS]; TILE_A],
    );

    /// As `tile_avx2`, for the one activation row `c0`.
    ///
    /// # Safety
    /// As for `tile_avx2`, with `act` holding row `c0`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn row_avx2(
        &self,
        t: usize,
        act: &Acts,
        c0: usize,
        out: &mut [[f32; TILE_ROWS]; TILE_A],
    );

    /// Row tile `t` against activation rows `c0..c0 + rows` (up to 16) on `tiles`, with the AMX
    /// skeleton (`super::amx`).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW and F16C, and `tiles` can run (see `Tiles::configure`); `t` is a
    /// row tile of `self` and `act` holds rows `c0..c0 + rows`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_amx<T: crate::cpu::amx::Tiles>(
        &self,
        tiles: &mut T,
        t: usize,
        act: &Acts,
        c0: usize,
        rows: usize,
        out: &mut [[f32; TILE_ROWS]; AMX_ROWS],
    );
}

/// The `PackedKQuant` impl of a layout module, which forwards to the module's `portable_row`, its
/// `x86` kernels and the AMX skeleton over its `AmxLayout`. Every layout forwards the same way, so
/// the impl is written once; names resolve in the module that invokes it.
macro_rules! impl_packed_kquant {
    ($layout:ty) => {
        impl PackedKQuant for $layout {
            fn portable_row(&self, t: usize, r: usize, act: &Acts, c: usize) -> f32 {
                portable_row(self, t, r, act, c)
            }

            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            unsafe fn tile_vnni<const C: usize>(
                &self,
                t: usize,
                act: &Acts,
                c0: usize,
                out: &mut [[f32; TILE_ROWS]; TILE_A],
            ) {
                // SAFETY: the caller's contract.
                unsafe { x86::tile_vnni::<C>(self, t, act, c0, out) }
            }

            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            unsafe fn tile_avx2<const C: usize>(
                &self,
                t: usize,
                act: &Acts,
                c0: usize,
                out: &mut [[f32; TILE_ROWS]; TILE_A],
            ) {
                // SAFETY: the caller's contract.
                unsafe { x86::tile_avx2::<C>(self, t, act, c0, out) }
            }

            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            unsafe fn row_avx2(
                &self,
                t: usize,
                act: &Acts,
                c0: usize,
                out: &mut [[f32; TILE_ROWS]; TILE_A],
            ) {
                // SAFETY: the caller's contract.
                unsafe { x86::row_avx2(self, t, act, c0, out) }
            }

            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            unsafe fn tile_amx<T: crate::cpu::amx::Tiles>(
                &self,
                tiles: &mut T,
                t: usize,
                act: &Acts,
                c0: usize,
                rows: usize,
                out: &mut [[f32; TILE_ROWS]; AMX_ROWS],
            ) {
                // SAFETY: the caller's contract.
                unsafe { super::amx::tile_amx(tiles, self, t, act, c0, rows, out) }
            }
        }
    };
}
pub(super) use impl_packed_kquant;

/// `all` as the `N` output rows a kernel fills (the buffer was made for that kernel).
#[cfg(target_arch = "x86_64")]
fn rows<const N: usize>(all: &mut [[f32; TILE_ROWS]]) -> &mut [[f32; TILE_ROWS]; N] {
    all.try_into().expect("the kernel's output rows")
}

/// Activation rows one call of `kernel` takes.
fn step(kernel: KQuantKernel) -> usize {
    match kernel {
        KQuantKernel::Amx => AMX_ROWS,
        KQuantKernel::Avx512Vnni => TILE_A,
        // Three rows' int sums fit AVX2's 16 registers; four spilled one to the stack
        // (`ops_kquant_matmul`, 128 rows, three alternations: Q4_K 115–138 GMAC/s
        // against 101–117, Q6_K 63–102 against 74–83).
        KQuantKernel::Avx2 => 3,
        KQuantKernel::Portable => 1,
    }
}

/// Row tile `t` (its first `num_w` rows) of `w` against `act`'s `num_a` rows, into `dst`
/// (`[num_w, num_a]`), with `kernel` (which came from `KQuantKernel::available()`).
pub(super) fn row_tile<const BYTES: usize>(
    kernel: KQuantKernel,
    w: &PackedTiles<BYTES>,
    t: usize,
    num_w: usize,
    act: &Acts,
    num_a: usize,
    dst: &mut [f32],
) where
    PackedTiles<BYTES>: PackedKQuant,
{
    let step = step(kernel);
    for c0 in (0..num_a).step_by(step) {
        let ta = step.min(num_a - c0);
        // 16 output rows for AMX only: zeroing them for every tile of a decode step would add
        // to its hot loop what the other kernels never read.
        let (mut rows_amx, mut rows_reg);
        let all: &mut [[f32; TILE_ROWS]] = if kernel == KQuantKernel::Amx {
            rows_amx = [[0f32; TILE_ROWS]; AMX_ROWS];
            &mut rows_amx
        } else {
            rows_reg = [[0f32; TILE_ROWS]; TILE_A];
            &mut rows_reg
        };
        if !simd(kernel, w, t, act, c0, ta, all) {
            for (c, row) in all.iter_mut().enumerate().take(ta) {
                for (r, o) in row.iter_mut().enumerate().take(num_w) {
                    *o = w.portable_row(t, r, act, c0 + c);
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

/// Rows `c0..c0 + ta` with `kernel`'s x86 form into `all`; `false` for the portable kernel
/// (which the caller runs).
#[cfg(target_arch = "x86_64")]
fn simd<W: PackedKQuant>(
    kernel: KQuantKernel,
    w: &W,
    t: usize,
    act: &Acts,
    c0: usize,
    ta: usize,
    all: &mut [[f32; TILE_ROWS]],
) -> bool {
    let (amx, reg) = (rows::<AMX_ROWS>, rows::<TILE_A>);
    // SAFETY: `kernel` came from `available()`, so the CPU runs the instructions it is compiled
    // for (AMX usable where it is listed); `t` is a row tile of `w` and `act` holds rows
    // `c0..c0 + ta`.
    #[allow(unsafe_code)]
    unsafe {
        match (kernel, ta) {
            (KQuantKernel::Amx, _) => {
                let mut tiles = crate::cpu::amx::Hardware;
                w.tile_amx(&mut tiles, t, act, c0, ta, amx(all))
            }
            (KQuantKernel::Avx512Vnni, 4) => w.tile_vnni::<4>(t, act, c0, reg(all)),
            (KQuantKernel::Avx512Vnni, 3) => w.tile_vnni::<3>(t, act, c0, reg(all)),
            (KQuantKernel::Avx512Vnni, 2) => w.tile_vnni::<2>(t, act, c0, reg(all)),
            (KQuantKernel::Avx512Vnni, _) => w.tile_vnni::<1>(t, act, c0, reg(all)),
            (KQuantKernel::Avx2, 3) => w.tile_avx2::<3>(t, act, c0, reg(all)),
            (KQuantKernel::Avx2, 2) => w.tile_avx2::<2>(t, act, c0, reg(all)),
            (KQuantKernel::Avx2, _) => w.row_avx2(t, act, c0, reg(all)),
            (KQuantKernel::Portable, _) => return false,
        }
    }
    true
}

#[cfg(not(target_arch = "x86_64"))]
fn simd<W: PackedKQuant>(
    _kernel: KQuantKernel,
    _w: &W,
    _t: usize,
    _act: &Acts,
    _c0: usize,
    _ta: usize,
    _all: &mut [[f32; TILE_ROWS]],
) -> bool {
    false
}
