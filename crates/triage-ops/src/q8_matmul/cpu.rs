//! CPU kernels of `q8_matmul`: a portable loop and register-tiled x86 ones (AVX2, and AVX-VNNI or
//! AVX-512 VNNI where the CPU has them), picked at run time. All give each output element one
//! accumulator fed block by block in column order; the x86 kernels give the same bits.

use super::pairs::PairedRows;
use super::{Q8Kernel, Q8Matrix, QK8_0};

#[cfg(target_arch = "x86_64")]
pub(super) use avx2::hsum;

/// Weight rows per register tile.
const TILE_W: usize = 2;
/// Activation rows per register tile: 2 × 4 accumulators, the two weight blocks (raw and
/// absolute) and a few temporaries fit the 16 AVX2 registers without spilling (4 × 3 spilled and
/// ran at 20 GMAC/s instead of 30+ on 16 rows).
const TILE_A: usize = 4;

/// The kernels this CPU can run, slowest first.
pub(super) fn available() -> Vec<Q8Kernel> {
    let mut kernels = vec![Q8Kernel::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") {
            kernels.push(Q8Kernel::Avx2);
            if has!("avxvnni") {
                kernels.push(Q8Kernel::AvxVnni);
            }
            if has!("avx512f")
                && has!("avx512vl")
                && has!("avx512bw")
                && has!("avx512dq")
                && has!("avx512vnni")
            {
                kernels.push(Q8Kernel::Avx512Vnni);
                kernels.push(Q8Kernel::Avx512VnniPairs);
            }
        }
    }
    kernels
}

/// Activation rows in the layout a kernel reads, prepared once per product.
pub(super) enum Activations<'a> {
    Rows(&'a Q8Matrix),
    /// Two rows per 512-bit register (`Q8Kernel::Avx512VnniPairs`).
    Pairs(PairedRows),
}

impl<'a> Activations<'a> {
    pub(super) fn prepare(kernel: Q8Kernel, a: &'a Q8Matrix) -> Self {
        match kernel {
            Q8Kernel::Avx512VnniPairs => Self::Pairs(PairedRows::new(a)),
            _ => Self::Rows(a),
        }
    }
}

/// Fill `dst` (`[num_w, num_a]`: weight rows `w0..w0 + num_w` by activation rows
/// `a0..a0 + num_a`; `a0` even for the paired layout).
#[allow(clippy::too_many_arguments)]
pub(super) fn tiles(
    kernel: Q8Kernel,
    w: &Q8Matrix,
    w0: usize,
    num_w: usize,
    a: &Activations,
    a0: usize,
    num_a: usize,
    dst: &mut [f32],
) {
    let a = match a {
        Activations::Rows(a) => *a,
        Activations::Pairs(pairs) => {
            #[cfg(target_arch = "x86_64")]
            super::pairs::tiles(w, w0, num_w, pairs, a0, num_a, dst);
            // Elsewhere `available` never offers the paired kernel, so nothing prepares pairs.
            #[cfg(not(target_arch = "x86_64"))]
            let _ = pairs;
            return;
        }
    };
    debug_assert!(w0 + num_w <= w.rows && a0 + num_a <= a.rows && w.cols == a.cols);
    debug_assert!(dst.len() >= num_w * num_a);
    #[cfg(target_arch = "x86_64")]
    if num_a == 1 && matches!(kernel, Q8Kernel::Avx512Vnni | Q8Kernel::Avx512VnniPairs) {
        assert!(w0 + num_w <= w.rows && a0 < a.rows && w.cols == a.cols && dst.len() >= num_w);
        // SAFETY: `kernel` came from `available()`, which offers it only where the CPU has
        // AVX-512 F/BW/VL/DQ and VNNI; the ranges were checked just above.
        #[allow(unsafe_code)]
        unsafe {
            super::weight_pairs::rows(w, w0, num_w, a, a0, dst)
        };
        return;
    }
    for wr in (0..num_w).step_by(TILE_W) {
        let tw = TILE_W.min(num_w - wr);
        for ar in (a0..a0 + num_a).step_by(TILE_A) {
            let ta = TILE_A.min(a0 + num_a - ar);
            let mut out = [[0f32; TILE_A]; TILE_W];
            tile(kernel, w, w0 + wr, tw, a, ar, ta, &mut out);
            for (r, row) in out.iter().enumerate().take(tw) {
                let at = (wr + r) * num_a + ar - a0;
                dst[at..at + ta].copy_from_slice(&row[..ta]);
            }
        }
    }
}

/// Calls the `$kernel::<R, C>` instance for a `tw` × `ta` tile.
#[cfg(target_arch = "x86_64")]
macro_rules! dispatch_shape {
    ($($kernel:ident)::+, $tw:expr, $ta:expr, $args:tt) => {
        match ($tw, $ta) {
            (2, 4) => $($kernel)::+::<2, 4> $args,
            (2, 3) => $($kernel)::+::<2, 3> $args,
            (2, 2) => $($kernel)::+::<2, 2> $args,
            (2, _) => $($kernel)::+::<2, 1> $args,
            (_, 4) => $($kernel)::+::<1, 4> $args,
            (_, 3) => $($kernel)::+::<1, 3> $args,
            (_, 2) => $($kernel)::+::<1, 2> $args,
            _ => $($kernel)::+::<1, 1> $args,
        }
    };
}

#[allow(clippy::too_many_arguments)]
fn tile(
    kernel: Q8Kernel,
    w: &Q8Matrix,
    w0: usize,
    tw: usize,
    a: &Q8Matrix,
    a0: usize,
    ta: usize,
    out: &mut [[f32; TILE_A]; TILE_W],
) {
    // SAFETY (all three): `kernel` came from `available()`, so the CPU runs the instructions the
    // kernel is compiled for; the row ranges were checked by the caller (`w0 + tw <= w.rows`,
    // `a0 + ta <= a.rows`) and both matrices have `cols` columns, which the kernels read within.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    match kernel {
        Q8Kernel::Avx2 => {
            unsafe { dispatch_shape!(avx2::tile, tw, ta, (w, w0, a, a0, out)) };
            return;
        }
        Q8Kernel::AvxVnni => {
            unsafe { dispatch_shape!(vnni::tile_avx, tw, ta, (w, w0, a, a0, out)) };
            return;
        }
        // The paired kernel's rows arrive as `Activations::Pairs`; given plain rows (a caller
        // that prepared for another kernel) it runs the same bits on 256-bit vectors.
        Q8Kernel::Avx512Vnni | Q8Kernel::Avx512VnniPairs => {
            unsafe { dispatch_shape!(vnni::tile_avx512, tw, ta, (w, w0, a, a0, out)) };
            return;
        }
        Q8Kernel::Portable => {}
    }
    let kb = w.cols / QK8_0;
    for (r, row) in out.iter_mut().enumerate().take(tw) {
        for (c, o) in row.iter_mut().enumerate().take(ta) {
            let (wi, ai) = (w0 + r, a0 + c);
            let mut acc = 0f32;
            for b in 0..kb {
                let wq = &w.quants[wi * w.cols + b * QK8_0..][..QK8_0];
                let aq = &a.quants[ai * a.cols + b * QK8_0..][..QK8_0];
                let dot: i32 = wq.iter().zip(aq).map(|(&x, &y)| x as i32 * y as i32).sum();
                acc += w.scales[wi * kb + b] * a.scales[ai * kb + b] * dot as f32;
            }
            *o = acc;
        }
    }
}

/// Where a tile's rows start: blocks per row, then the weight and activation quants and scales
/// of its first rows.
#[cfg(target_arch = "x86_64")]
struct TileStart {
    kb: usize,
    wq: *const i8,
    aq: *const i8,
    ws: *const f32,
    as_: *const f32,
}

#[cfg(target_arch = "x86_64")]
impl TileStart {
    /// Slicing checks the first rows are inside the matrices; nothing is read here.
    fn new(w: &Q8Matrix, w0: usize, a: &Q8Matrix, a0: usize) -> Self {
        let kb = w.cols / QK8_0;
        Self {
            kb,
            wq: w.quants[w0 * w.cols..].as_ptr(),
            aq: a.quants[a0 * a.cols..].as_ptr(),
            ws: w.scales[w0 * kb..].as_ptr(),
            as_: a.scales[a0 * kb..].as_ptr(),
        }
    }
}

/// Prefetch block `b` of row `r` of the next tile (`R` rows on), and every 16 blocks its scales:
/// a task's rows are too short (≤ 1 KiB each) for the hardware prefetcher to ramp up, and a
/// decode step streams every weight from DRAM (the samples of a 0.5B decode sat on the weight
/// loads). Prefetches never fault, so rows past the matrix are harmless (`wrapping_add`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_next_tile<const R: usize>(
    wq: *const i8,
    ws: *const f32,
    cols: usize,
    kb: usize,
    r: usize,
    b: usize,
) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: prefetching is a hint that never faults, whatever the address.
    #[allow(unsafe_code)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(wq.wrapping_add((R + r) * cols + b * QK8_0));
        if b.is_multiple_of(16) {
            _mm_prefetch::<_MM_HINT_T0>(ws.wrapping_add((R + r) * kb + b) as *const i8);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::{Q8Matrix, QK8_0};
    use super::{prefetch_next_tile, TileStart, TILE_A};

    /// Products of weight rows `w0..w0 + R` with activation rows `a0..a0 + C`.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; `w0 + R <= w.rows`, `a0 + C <= a.rows`,
    /// `w.cols == a.cols`, `R <= TILE_W` and `C <= TILE_A`.
    // Index loops: the accumulator grid is indexed by (weight row, activation row) on purpose.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const R: usize, const C: usize>(
        w: &Q8Matrix,
        w0: usize,
        a: &Q8Matrix,
        a0: usize,
        out: &mut [[f32; TILE_A]; super::TILE_W],
    ) {
        let TileStart {
            kb,
            wq,
            aq,
            ws,
            as_,
        } = TileStart::new(w, w0, a, a0);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let ones = _mm256_set1_epi16(1);
        for b in 0..kb {
            let mut wv = [_mm256_setzero_si256(); R];
            for (r, v) in wv.iter_mut().enumerate() {
                prefetch_next_tile::<R>(wq, ws, w.cols, kb, r, b);
                *v = _mm256_loadu_si256(wq.add(r * w.cols + b * QK8_0) as *const __m256i);
            }
            for c in 0..C {
                let av = _mm256_loadu_si256(aq.add(c * a.cols + b * QK8_0) as *const __m256i);
                let a_abs = _mm256_sign_epi8(av, av);
                let da = *as_.add(c * kb + b);
                for r in 0..R {
                    let d = _mm256_set1_ps(*ws.add(r * kb + b) * da);
                    let dot = block_dot(a_abs, av, wv[r], ones);
                    acc[r][c] = _mm256_fmadd_ps(dot, d, acc[r][c]);
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                out[r][c] = hsum(acc[r][c]);
            }
        }
    }

    /// Eight partial sums of `a · w` over one 32-value block, as f32 (exact: each is at most
    /// 4 · 128 · 127 in magnitude).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn block_dot(a_abs: __m256i, a: __m256i, w: __m256i, ones: __m256i) -> __m256 {
        // maddubs multiplies unsigned by signed bytes: |a| times w carrying a's sign.
        let w_signed = _mm256_sign_epi8(w, a);
        let pairs = _mm256_maddubs_epi16(a_abs, w_signed);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::q8_matmul) fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

/// The AVX2 tile with the block dot product in one VNNI instruction. `vpdpbusd` multiplies
/// unsigned by signed bytes without saturating, so the activations go in offset by 128
/// (`a ^ 0x80`) and the accumulator starts at −128 · Σw, which leaves exactly `a · w`: the same
/// eight int32 partial sums as AVX2's sign + maddubs + madd, hence the same bits after it.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vnni {
    use std::arch::x86_64::*;

    use super::super::{Q8Matrix, QK8_0};
    use super::{avx2::hsum, TileStart, TILE_A, TILE_W};

    macro_rules! vnni_tile {
        ($name:ident, $features:literal, $dpbusd:ident) => {
            /// Products of weight rows `w0..w0 + R` with activation rows `a0..a0 + C`.
            ///
            /// # Safety
            #[doc = concat!("The CPU supports ", $features, "; `w0 + R <= w.rows`,")]
            /// `a0 + C <= a.rows`, `w.cols == a.cols`, `R <= TILE_W` and `C <= TILE_A`.
            #[allow(clippy::needless_range_loop)]
            #[target_feature(enable = $features)]
            pub(in super::super) unsafe fn $name<const R: usize, const C: usize>(
                w: &Q8Matrix,
                w0: usize,
                a: &Q8Matrix,
                a0: usize,
                out: &mut [[f32; TILE_A]; TILE_W],
            ) {
                let TileStart {
                    kb,
                    wq,
                    aq,
                    ws,
                    as_,
                } = TileStart::new(w, w0, a, a0);
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                let zero = _mm256_setzero_si256();
                let offset = _mm256_set1_epi8(i8::MIN);
                for b in 0..kb {
                    let mut wv = [zero; R];
                    let mut start = [zero; R];
                    for r in 0..R {
                        super::prefetch_next_tile::<R>(wq, ws, w.cols, kb, r, b);
                        wv[r] =
                            _mm256_loadu_si256(wq.add(r * w.cols + b * QK8_0) as *const __m256i);
                        start[r] = _mm256_sub_epi32(zero, $dpbusd(zero, offset, wv[r]));
                    }
                    for c in 0..C {
                        let av =
                            _mm256_loadu_si256(aq.add(c * a.cols + b * QK8_0) as *const __m256i);
                        let a_unsigned = _mm256_xor_si256(av, offset);
                        let da = *as_.add(c * kb + b);
                        for r in 0..R {
                            let d = _mm256_set1_ps(*ws.add(r * kb + b) * da);
                            let dot = _mm256_cvtepi32_ps($dpbusd(start[r], a_unsigned, wv[r]));
                            acc[r][c] = _mm256_fmadd_ps(dot, d, acc[r][c]);
                        }
                    }
                }
                for r in 0..R {
                    for c in 0..C {
                        out[r][c] = hsum(acc[r][c]);
                    }
                }
            }
        };
    }

    vnni_tile!(tile_avx, "avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32);
    vnni_tile!(
        tile_avx512,
        "avx2,fma,avx512f,avx512vl,avx512vnni",
        _mm256_dpbusd_epi32
    );
}
