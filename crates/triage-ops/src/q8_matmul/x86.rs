//! x86 kernels of `q8_matmul`. A register holds int32 lanes of weight rows (16 in a 512-bit one,
//! 8 in a 256-bit one), each summing 4 products per step: the weights are loaded, the activation
//! row's 4 values broadcast. After a block's 8 steps a lane holds the block's exact dot product;
//! it is converted, scaled and fused into the row's f32 accumulator. Per block: one scale
//! product and one fma per 32 products in every kernel, where the row-major layouts before
//! needed them per 8 (and a horizontal sum), which bound prefill on the FMA ports (prefill
//! 105–116 GMAC/s before, 145–276 after, `ops_q8_matmul`).
//!
//! For one or two activation rows the AVX2 kernel reads both halves of a group at once, groups
//! in stream order, with the 512-bit kernel's L2 prefetch. A half at a time (`halves`, still
//! used for more rows) it streamed at about half VNNI's rate (11 against 23 GB/s; 26–32 after;
//! benches/RESULTS.md, "The AVX2 kernels against an AVX2 llama.cpp").
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::cpu::TileArgs;
use super::matrix::{BLOCK_STEPS, GROUP_BLOCK_BYTES, GROUP_ROWS, LANE_VALUES, SPAN_GROUPS};
use super::narrow::NarrowKind;
use super::{Q8Kernel, Q8Matrix, Q8Rows, QK8_0};

/// Blocks ahead (8 KiB in a decode step's span of 4 groups) that a tile prefetches its weights
/// into L2: a decode step streams them from DRAM, and without it the 0.5B decoded 25 % slower.
/// Into L1 instead was as slow as none (the stream evicts what the step reuses).
const PREFETCH_BLOCKS: usize = 4;
/// From one group's block to the next group's, and to its own next block, in `quants` bytes.
pub(super) const NEXT_GROUP: usize = GROUP_BLOCK_BYTES;
pub(super) const NEXT_BLOCK: usize = SPAN_GROUPS * GROUP_BLOCK_BYTES;
/// The same steps in `scales`.
pub(super) const NEXT_GROUP_SCALES: usize = GROUP_ROWS;
pub(super) const NEXT_BLOCK_SCALES: usize = SPAN_GROUPS * GROUP_ROWS;

/// Runs `kernel` (an x86 kernel this CPU has, from `cpu::available`) on the tile of `args`, with
/// `groups_left` weight groups from `args.group` on; returns how many groups it did.
pub(super) fn tile(kernel: Q8Kernel, args: TileArgs, groups_left: usize) -> usize {
    let TileArgs {
        w,
        group,
        a,
        tile,
        out,
        out_stride,
    } = args;
    let na = a.tile_rows(tile);
    // AVX-VNNI's kernel reads int8 values only; narrow values reach an AVX-VNNI host's decode
    // tiles through AVX2's (`Q8Kernel::reads_narrow`), which that host has too.
    let kernel = match kernel {
        Q8Kernel::AvxVnni if w.narrow.is_some() => Q8Kernel::Avx2,
        kernel => kernel,
    };
    // Per group and row, the kernel writes 16 lanes of the row's output.
    let gw = match (kernel, na) {
        (Q8Kernel::Avx512Vnni | Q8Kernel::Avx2, 1) => groups_left.min(4),
        (Q8Kernel::Avx512Vnni, 2 | 3) | (Q8Kernel::Avx2, 2) => groups_left.min(2),
        _ => 1,
    }
    .min(SPAN_GROUPS - group % SPAN_GROUPS);
    assert!(group + gw <= w.rows.div_ceil(GROUP_ROWS) && (1..=8).contains(&na));
    assert!(out.len() >= (na - 1) * out_stride + gw * GROUP_ROWS);
    let out = out.as_mut_ptr();
    // SAFETY (all): `kernel` came from `cpu::available`, so the CPU has its features; groups
    // `group..group + gw` exist in `w` and tile `tile` has `na` rows of `w.cols` columns in `a`
    // (`cpu::tiles` checked both); `out` holds every row's `gw · 16` values (asserted above).
    unsafe {
        let ops = Operands {
            w,
            group,
            a,
            tile,
            out,
            out_stride,
        };
        match kernel {
            Q8Kernel::Avx512Vnni if w.narrow.is_some() => {
                avx512_shapes(&avx512::Narrow::new(w, group), &ops, gw, na)
            }
            Q8Kernel::Avx512Vnni => {
                let start = Start::new(w, group, a, tile);
                avx512_shapes(&avx512::Int8(&start), &ops, gw, na)
            }
            Q8Kernel::AvxVnni => halves(Half::AvxVnni, w, group, a, tile, out, out_stride),
            _ if w.narrow.is_some() => {
                let steps = avx2::Narrow(avx512::Narrow::new(w, group));
                let done = avx2_shapes(&steps, &ops, gw, na);
                assert!(done, "narrow values reach AVX2 in 1 or 2 rows");
            }
            _ => {
                let start = Start::new(w, group, a, tile);
                if !avx2_shapes(&avx2::Int8(&start), &ops, gw, na) {
                    halves(Half::Avx2, w, group, a, tile, out, out_stride);
                }
            }
        }
    }
    gw
}

/// A register tile's operands, as `tile` checked them.
struct Operands<'a> {
    w: &'a Q8Matrix,
    group: usize,
    a: &'a Q8Rows,
    tile: usize,
    out: *mut f32,
    out_stride: usize,
}

/// The 512-bit kernel on `(gw, na)`, the register tile shape `tile` chose.
///
/// # Safety
/// As `avx512::tile`, for `gw` groups and `na` rows.
unsafe fn avx512_shapes<S: avx512::Steps>(steps: &S, ops: &Operands, gw: usize, na: usize) {
    let Operands {
        w,
        group,
        a,
        tile,
        out,
        out_stride,
    } = *ops;
    // SAFETY: the caller's contract.
    unsafe {
        match (gw, na) {
            (4, 1) => avx512::tile::<S, 4, 1>(steps, w, group, a, tile, out, out_stride),
            (3, 1) => avx512::tile::<S, 3, 1>(steps, w, group, a, tile, out, out_stride),
            (2, 1) => avx512::tile::<S, 2, 1>(steps, w, group, a, tile, out, out_stride),
            (2, 2) => avx512::tile::<S, 2, 2>(steps, w, group, a, tile, out, out_stride),
            (2, 3) => avx512::tile::<S, 2, 3>(steps, w, group, a, tile, out, out_stride),
            (_, 1) => avx512::tile::<S, 1, 1>(steps, w, group, a, tile, out, out_stride),
            (_, 2) => avx512::tile::<S, 1, 2>(steps, w, group, a, tile, out, out_stride),
            (_, 3) => avx512::tile::<S, 1, 3>(steps, w, group, a, tile, out, out_stride),
            (_, 4) => avx512::tile::<S, 1, 4>(steps, w, group, a, tile, out, out_stride),
            (_, 5) => avx512::tile::<S, 1, 5>(steps, w, group, a, tile, out, out_stride),
            (_, 6) => avx512::tile::<S, 1, 6>(steps, w, group, a, tile, out, out_stride),
            (_, 7) => avx512::tile::<S, 1, 7>(steps, w, group, a, tile, out, out_stride),
            _ => avx512::tile::<S, 1, 8>(steps, w, group, a, tile, out, out_stride),
        }
    }
}

/// The AVX2 decode kernel on `(gw, na)` if it has that shape (1 or 2 rows); false otherwise.
///
/// # Safety
/// As `avx2::tile`, for `gw` groups and `na` rows.
unsafe fn avx2_shapes<S: avx2::Steps>(steps: &S, ops: &Operands, gw: usize, na: usize) -> bool {
    let Operands {
        w,
        group,
        a,
        tile,
        out,
        out_stride,
    } = *ops;
    // SAFETY: the caller's contract.
    unsafe {
        match (gw, na) {
            (4, 1) => avx2::tile::<S, 4, 1>(steps, w, group, a, tile, out, out_stride),
            (3, 1) => avx2::tile::<S, 3, 1>(steps, w, group, a, tile, out, out_stride),
            (2, 1) => avx2::tile::<S, 2, 1>(steps, w, group, a, tile, out, out_stride),
            (1, 1) => avx2::tile::<S, 1, 1>(steps, w, group, a, tile, out, out_stride),
            (2, 2) => avx2::tile::<S, 2, 2>(steps, w, group, a, tile, out, out_stride),
            (1, 2) => avx2::tile::<S, 1, 2>(steps, w, group, a, tile, out, out_stride),
            _ => return false,
        }
    }
    true
}

/// The 256-bit kernels.
#[derive(Clone, Copy)]
enum Half {
    Avx2,
    AvxVnni,
    /// AVX-VNNI's body with the EVEX form of the same instruction, so that a host with AVX-512
    /// VNNI but not AVX-VNNI tests it.
    #[cfg(test)]
    AvxVnniEvex,
}

/// One weight group against tile `tile` with a 256-bit kernel: each half of the group (8 rows)
/// against up to 4 rows at a time (2 × 4 accumulators fit the 16 ymm registers).
///
/// # Safety
/// As `half_avx2` (or the kernel `half` names), for every row of the tile.
#[allow(clippy::too_many_arguments)]
unsafe fn halves(
    half_kernel: Half,
    w: &Q8Matrix,
    group: usize,
    a: &Q8Rows,
    tile: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let na = a.tile_rows(tile);
    let mut i0 = 0;
    while i0 < na {
        let n = (na - i0).min(4);
        for half in 0..2 {
            // SAFETY: the caller's contract, for rows `i0..i0 + n` of the tile and this half.
            unsafe {
                let o = out.add(i0 * out_stride + half * 8);
                macro_rules! rows {
                    ($f:ident) => {
                        match n {
                            4 => $f::<4>(w, group, half, a, tile, i0, o, out_stride),
                            3 => $f::<3>(w, group, half, a, tile, i0, o, out_stride),
                            2 => $f::<2>(w, group, half, a, tile, i0, o, out_stride),
                            _ => $f::<1>(w, group, half, a, tile, i0, o, out_stride),
                        }
                    };
                }
                match half_kernel {
                    Half::Avx2 => rows!(half_avx2),
                    Half::AvxVnni => rows!(half_vnni),
                    #[cfg(test)]
                    Half::AvxVnniEvex => rows!(half_vnni_evex),
                }
            }
        }
        i0 += n;
    }
}

/// Runs AVX-VNNI's kernel body, with EVEX encoding, on the tile of `args` (one group), where
/// the CPU has AVX-512 F/VL and VNNI; `None` elsewhere.
#[cfg(test)]
pub(super) fn avx_vnni_body_on_avx512(args: TileArgs) -> Option<()> {
    let isa = crate::cpu::Isa::get();
    if !(isa.avx2_fma() && isa.avx512f && isa.avx512vl && isa.avx512vnni) {
        return None;
    }
    let TileArgs {
        w,
        group,
        a,
        tile,
        out,
        out_stride,
    } = args;
    let na = a.tile_rows(tile);
    assert!(group < w.rows.div_ceil(GROUP_ROWS) && out.len() >= (na - 1) * out_stride + 16);
    // SAFETY: the features were detected above; the group and tile exist and `out` holds them.
    unsafe {
        halves(
            Half::AvxVnniEvex,
            w,
            group,
            a,
            tile,
            out.as_mut_ptr(),
            out_stride,
        )
    };
    Some(())
}

/// Where a tile's operands start: blocks per row, the weight groups' quants and scales, the
/// activation tile's quants, scales and offsets, and its number of rows.
pub(super) struct Start {
    pub(super) kb: usize,
    pub(super) wq: *const i8,
    pub(super) ws: *const f32,
    pub(super) aq: *const i8,
    pub(super) as_: *const f32,
    pub(super) ao: *const i32,
    pub(super) na: usize,
}

impl Start {
    /// Slicing checks that the first group and the tile are inside the buffers. For a narrow
    /// matrix `wq` is null (see `avx512::Narrow`).
    pub(super) fn new(w: &Q8Matrix, group: usize, a: &Q8Rows, tile: usize) -> Self {
        let kb = w.cols / QK8_0;
        let (aq0, as0) = a.tile_start(tile);
        Self {
            kb,
            // A narrow matrix has no int8 values; its kernel reads them through `Narrow`.
            wq: match w.narrow {
                None => w.quants[w.group_block(group, 0) * GROUP_BLOCK_BYTES..].as_ptr(),
                Some(_) => std::ptr::null(),
            },
            ws: w.scales[w.group_block(group, 0) * GROUP_ROWS..].as_ptr(),
            aq: a.quants[aq0..].as_ptr(),
            as_: a.scales[as0..].as_ptr(),
            ao: a.offsets[as0..].as_ptr(),
            na: a.tile_rows(tile),
        }
    }

    /// Group `g`'s block `b + PREFETCH_BLOCKS` (quants and scales) into L2. A prefetch never
    /// faults, so addresses past the matrix are harmless.
    #[inline(always)]
    fn prefetch_ahead(&self, b: usize, g: usize) {
        let ahead = (b + PREFETCH_BLOCKS) * NEXT_BLOCK + g * NEXT_GROUP;
        for line in 0..GROUP_BLOCK_BYTES / 64 {
            // SAFETY: prefetching reads nothing a program can see, at any address.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.wq.wrapping_add(ahead + 64 * line)) };
        }
        let ahead = (b + PREFETCH_BLOCKS) * NEXT_BLOCK_SCALES + g * NEXT_GROUP_SCALES;
        // SAFETY: as above.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(self.ws.wrapping_add(ahead) as *const i8) };
    }
}

/// Activation row `i`'s 4 values of step `step` of block `b`, as one int32.
///
/// # Safety
/// `aq` is a tile's quants with `na` rows; `b` is one of its blocks, `i < na`.
#[inline(always)]
unsafe fn four(aq: *const i8, na: usize, b: usize, step: usize, i: usize) -> i32 {
    let at = ((b * BLOCK_STEPS + step) * na + i) * LANE_VALUES;
    unsafe { (aq.add(at) as *const i32).read_unaligned() }
}

mod avx512 {
    use super::*;

    /// Where a block's steps of weights come from: each step is 16 rows × 4 values as unsigned
    /// bytes (what `vpdpbusd` takes), which make the signed values once each block's sum starts at
    /// `start(−128 · Σa)`.
    pub(super) trait Steps {
        /// Group `g` (from the tile's first), block `b`, step `step`.
        ///
        /// # Safety
        /// The group and block exist; the CPU has AVX-512 F/BW.
        unsafe fn step(&self, b: usize, g: usize, step: usize) -> __m512i;
        /// Group `g`'s block `b + PREFETCH_BLOCKS` into L2.
        fn prefetch(&self, b: usize, g: usize);
        /// A block's starting sum, from the activation tile's `−128 · Σa`.
        fn start(&self, minus_128_sum: i32) -> i32;
    }

    /// Int8 values, offset by 128 to unsigned: the sum starts at −128 · Σa, which leaves exactly
    /// Σ w · a.
    pub(super) struct Int8<'a>(pub(super) &'a Start);

    impl Steps for Int8<'_> {
        #[inline(always)]
        unsafe fn step(&self, b: usize, g: usize, step: usize) -> __m512i {
            let at = b * NEXT_BLOCK + g * NEXT_GROUP + step * GROUP_ROWS * LANE_VALUES;
            // SAFETY: the caller's contract.
            unsafe {
                let wv = _mm512_loadu_si512(self.0.wq.add(at) as *const __m512i);
                _mm512_xor_si512(wv, _mm512_set1_epi8(i8::MIN))
            }
        }

        #[inline(always)]
        fn prefetch(&self, b: usize, g: usize) {
            self.0.prefetch_ahead(b, g);
        }

        #[inline(always)]
        fn start(&self, minus_128_sum: i32) -> i32 {
            minus_128_sum
        }
    }

    /// Narrow values (`narrow.rs`), widened in registers: a step's nibbles from the group
    /// block's pair of steps and, for 5-bit values, its fifth bits. They are `q` (0..32), whose
    /// signed value is `q + offset`, so the sum starts at `offset · Σa`.
    pub(super) struct Narrow {
        pub(super) bytes: *const u8,
        pub(super) unit_bytes: usize,
        pub(super) fifth_bit: bool,
        pub(super) offset: i32,
    }

    impl Narrow {
        /// The narrow values of `w`'s groups from `group` on (`w` is narrow).
        pub(super) fn new(w: &Q8Matrix, group: usize) -> Self {
            let narrow = w.narrow.as_ref().expect("a narrow matrix");
            let unit_bytes = narrow.kind.group_block_bytes();
            let bytes = narrow.bytes[w.group_block(group, 0) * unit_bytes..].as_ptr();
            Self::of(bytes, narrow.kind)
        }

        /// Group blocks of `kind` from `bytes` on.
        pub(super) fn of(bytes: *const u8, kind: NarrowKind) -> Self {
            Self {
                bytes,
                unit_bytes: kind.group_block_bytes(),
                fifth_bit: kind.fifth_bit(),
                offset: kind.offset() as i32,
            }
        }
    }

    impl Steps for Narrow {
        #[inline(always)]
        unsafe fn step(&self, b: usize, g: usize, step: usize) -> __m512i {
            let unit = (b * SPAN_GROUPS + g) * self.unit_bytes;
            let low4 = _mm512_set1_epi8(0x0F);
            // SAFETY: the caller's contract; a group block holds its 4 nibble runs of 64 bytes,
            // then (with fifth bits) their 64 bytes.
            unsafe {
                let pair =
                    _mm512_loadu_si512(self.bytes.add(unit + step / 2 * 64) as *const __m512i);
                let nibbles = if step.is_multiple_of(2) {
                    pair
                } else {
                    _mm512_srli_epi16::<4>(pair)
                };
                let q = _mm512_and_si512(nibbles, low4);
                if !self.fifth_bit {
                    return q;
                }
                let fifths = _mm512_loadu_si512(self.bytes.add(unit + 256) as *const __m512i);
                // Bit `step` of each byte to bit 0 (16-bit shifts; the mask keeps each byte's
                // own bit), then to bit 4.
                let count = _mm_cvtsi32_si128(step as i32);
                let bit = _mm512_and_si512(_mm512_srl_epi16(fifths, count), _mm512_set1_epi8(1));
                _mm512_or_si512(q, _mm512_slli_epi16::<4>(bit))
            }
        }

        #[inline(always)]
        fn prefetch(&self, b: usize, g: usize) {
            let unit = ((b + PREFETCH_BLOCKS) * SPAN_GROUPS + g) * self.unit_bytes;
            for line in (0..self.unit_bytes).step_by(64) {
                // SAFETY: prefetching reads nothing a program can see, at any address.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T1>(self.bytes.wrapping_add(unit + line) as *const i8)
                };
            }
        }

        #[inline(always)]
        fn start(&self, minus_128_sum: i32) -> i32 {
            // Exact: −128 · Σa is a multiple of 128.
            -(minus_128_sum / 128) * self.offset
        }
    }

    /// Weight groups `group..group + GW` against activation tile `tile`, which has `NA` rows,
    /// their steps from `w_steps`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI; the groups exist in `w` (and `w_steps` reads them),
    /// the tile has `NA` rows with `w.cols` columns, and `out` holds
    /// `(NA - 1) · out_stride + GW · 16` values.
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    pub(super) unsafe fn tile<S: Steps, const GW: usize, const NA: usize>(
        w_steps: &S,
        w: &Q8Matrix,
        group: usize,
        a: &Q8Rows,
        tile: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let s = Start::new(w, group, a, tile);
        debug_assert_eq!(s.na, NA);
        let mut acc = [[_mm512_setzero_ps(); NA]; GW];
        for b in 0..s.kb {
            let mut dot = [[_mm512_setzero_si512(); NA]; GW];
            for g in 0..GW {
                for i in 0..NA {
                    dot[g][i] = _mm512_set1_epi32(w_steps.start(*s.ao.add(b * NA + i)));
                }
                w_steps.prefetch(b, g);
            }
            for step in 0..BLOCK_STEPS {
                for g in 0..GW {
                    let wv = w_steps.step(b, g, step);
                    for i in 0..NA {
                        let av = _mm512_set1_epi32(four(s.aq, NA, b, step, i));
                        dot[g][i] = _mm512_dpbusd_epi32(dot[g][i], wv, av);
                    }
                }
            }
            for g in 0..GW {
                let at = b * NEXT_BLOCK_SCALES + g * NEXT_GROUP_SCALES;
                let ws = _mm512_loadu_ps(s.ws.add(at));
                for i in 0..NA {
                    let d = _mm512_mul_ps(ws, _mm512_set1_ps(*s.as_.add(b * NA + i)));
                    acc[g][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[g][i]), d, acc[g][i]);
                }
            }
        }
        for g in 0..GW {
            for i in 0..NA {
                _mm512_storeu_ps(out.add(i * out_stride + g * GROUP_ROWS), acc[g][i]);
            }
        }
    }
}

/// Widens narrow group blocks `src` to int8 values in `dst` (`GROUP_BLOCK_BYTES` each), step by
/// step as the 512-bit kernel widens them in registers.
///
/// # Safety
/// The CPU has AVX-512 F/BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn widen_avx512(kind: NarrowKind, src: &[u8], dst: &mut [i8]) {
    let unit_bytes = kind.group_block_bytes();
    let units = src.len() / unit_bytes;
    assert!(dst.len() >= units * GROUP_BLOCK_BYTES);
    let narrow = avx512::Narrow::of(src.as_ptr(), kind);
    let offset = _mm512_set1_epi8(kind.offset());
    for unit in 0..units {
        for step in 0..BLOCK_STEPS {
            // SAFETY: the caller's contract; `unit` is inside `src` and `dst` (asserted).
            unsafe {
                let q = avx512::Steps::step(&narrow, unit / SPAN_GROUPS, unit % SPAN_GROUPS, step);
                let at = unit * GROUP_BLOCK_BYTES + step * GROUP_ROWS * LANE_VALUES;
                _mm512_storeu_si512(dst.as_mut_ptr().add(at).cast(), _mm512_add_epi8(q, offset));
            }
        }
    }
}

/// Widens narrow group blocks `src` to int8 values in `dst` with AVX2 (`avx2::widen`).
///
/// # Safety
/// The CPU has AVX2.
pub(super) unsafe fn widen_avx2(kind: NarrowKind, src: &[u8], dst: &mut [i8]) {
    // SAFETY: the caller's contract.
    unsafe { avx2::widen(kind, src, dst) }
}

/// AVX2's products of one step: `acc` plus the 4-value dot products of the weights `w` (int8
/// lanes of 8 rows) and the broadcast activation values `a`. `maddubs` multiplies unsigned by
/// signed bytes, so |w| (as unsigned: a −128 from a file is 128) times a carrying w's sign; a pair
/// of products is at most 2 · 128 · 127, inside int16 (activations never hold −128: GGML's
/// rounding stays within ±127).
macro_rules! dot_avx2 {
    ($acc:expr, $w:expr, $a:expr) => {{
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8($w, $w), _mm256_sign_epi8($a, $w));
        _mm256_add_epi32($acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }};
}

mod avx2 {
    use super::*;

    /// Where a block's steps of weights come from, as two halves of 8 rows × 4 values, and how a
    /// step's products are summed.
    pub(super) trait Steps {
        /// Group `g` (from the tile's first), block `b`, step `step`: rows 0–7 and 8–15.
        ///
        /// # Safety
        /// The group and block exist; the CPU has AVX2.
        unsafe fn step(&self, b: usize, g: usize, step: usize) -> [__m256i; 2];
        /// `acc` plus the 4-value dot products of weights `w` and broadcast activations `a`.
        ///
        /// # Safety
        /// The CPU has AVX2.
        unsafe fn dot(acc: __m256i, w: __m256i, a: __m256i) -> __m256i;
        /// Group `g`'s block `b + PREFETCH_BLOCKS` into L2.
        fn prefetch(&self, b: usize, g: usize);
        /// A block's starting sum, from the activation tile's `−128 · Σa`.
        fn start(&self, minus_128_sum: i32) -> i32;
    }

    /// Signed int8 values (`dot_avx2!`).
    pub(super) struct Int8<'a>(pub(super) &'a Start);

    impl Steps for Int8<'_> {
        #[inline(always)]
        unsafe fn step(&self, b: usize, g: usize, step: usize) -> [__m256i; 2] {
            let at = b * NEXT_BLOCK + g * NEXT_GROUP + step * GROUP_ROWS * LANE_VALUES;
            // SAFETY: the caller's contract.
            unsafe {
                [
                    _mm256_loadu_si256(self.0.wq.add(at) as *const __m256i),
                    _mm256_loadu_si256(self.0.wq.add(at + 32) as *const __m256i),
                ]
            }
        }

        #[inline(always)]
        unsafe fn dot(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
            dot_avx2!(acc, w, a)
        }

        #[inline(always)]
        fn prefetch(&self, b: usize, g: usize) {
            self.0.prefetch_ahead(b, g);
        }

        #[inline(always)]
        fn start(&self, _: i32) -> i32 {
            0
        }
    }

    /// Narrow values widened in registers as `avx512::Narrow` widens them, 32 bytes at a time:
    /// unsigned `q`, which `maddubs` takes as it is (a pair of products is at most
    /// 2 · 31 · 127), with the offset in the block's starting sum.
    pub(super) struct Narrow(pub(super) avx512::Narrow);

    impl Steps for Narrow {
        #[inline(always)]
        unsafe fn step(&self, b: usize, g: usize, step: usize) -> [__m256i; 2] {
            let n = &self.0;
            let unit = (b * SPAN_GROUPS + g) * n.unit_bytes;
            let low4 = _mm256_set1_epi8(0x0F);
            let one = _mm256_set1_epi8(1);
            let count = _mm_cvtsi32_si128(step as i32);
            let mut halves = [_mm256_setzero_si256(); 2];
            // A loop, not `array::from_fn`: a closure is a function of its own, without this
            // one's target features, so the intrinsics in it would not be inlined.
            for (half, q) in halves.iter_mut().enumerate() {
                // SAFETY: the caller's contract (see `avx512::Narrow::step`).
                unsafe {
                    let at = unit + step / 2 * 64 + 32 * half;
                    let pair = _mm256_loadu_si256(n.bytes.add(at) as *const __m256i);
                    let nibbles = if step.is_multiple_of(2) {
                        pair
                    } else {
                        _mm256_srli_epi16::<4>(pair)
                    };
                    *q = _mm256_and_si256(nibbles, low4);
                    if n.fifth_bit {
                        let at = unit + 256 + 32 * half;
                        let fifths = _mm256_loadu_si256(n.bytes.add(at) as *const __m256i);
                        let bit = _mm256_and_si256(_mm256_srl_epi16(fifths, count), one);
                        *q = _mm256_or_si256(*q, _mm256_slli_epi16::<4>(bit));
                    }
                }
            }
            halves
        }

        #[inline(always)]
        unsafe fn dot(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
            let pairs = _mm256_maddubs_epi16(w, a);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }

        #[inline(always)]
        fn prefetch(&self, b: usize, g: usize) {
            avx512::Steps::prefetch(&self.0, b, g);
        }

        #[inline(always)]
        fn start(&self, minus_128_sum: i32) -> i32 {
            avx512::Steps::start(&self.0, minus_128_sum)
        }
    }

    /// Weight groups `group..group + GW` against activation tile `tile`, which has `NA` rows
    /// (`GW · NA ≤ 4`): a decode step's mat-vec. Group by group within a block, both halves of
    /// a group at once, so the weights are read once, as the linear stream they are stored in,
    /// prefetched into L2 as the 512-bit kernel does (`halves` read each group twice, a half
    /// at a time, unprefetched: 11 GB/s against VNNI's 23 on the 0.5B, `ops_decode_stream`).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the groups exist in `w` (and `w_steps` reads them), the tile
    /// has `NA` rows with `w.cols` columns, and `out` holds `(NA - 1) · out_stride + GW · 16`
    /// values.
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<S: Steps, const GW: usize, const NA: usize>(
        w_steps: &S,
        w: &Q8Matrix,
        group: usize,
        a: &Q8Rows,
        tile: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let s = Start::new(w, group, a, tile);
        debug_assert_eq!(s.na, NA);
        let mut acc = [[[_mm256_setzero_ps(); 2]; NA]; GW];
        for b in 0..s.kb {
            for g in 0..GW {
                w_steps.prefetch(b, g);
                let mut dot = [[_mm256_setzero_si256(); 2]; NA];
                for i in 0..NA {
                    let start = _mm256_set1_epi32(w_steps.start(*s.ao.add(b * NA + i)));
                    dot[i] = [start; 2];
                }
                for step in 0..BLOCK_STEPS {
                    let [lo, hi] = w_steps.step(b, g, step);
                    for i in 0..NA {
                        let av = _mm256_set1_epi32(four(s.aq, NA, b, step, i));
                        dot[i][0] = S::dot(dot[i][0], lo, av);
                        dot[i][1] = S::dot(dot[i][1], hi, av);
                    }
                }
                let at = b * NEXT_BLOCK_SCALES + g * NEXT_GROUP_SCALES;
                for h in 0..2 {
                    let ws = _mm256_loadu_ps(s.ws.add(at + 8 * h));
                    for i in 0..NA {
                        let d = _mm256_mul_ps(ws, _mm256_set1_ps(*s.as_.add(b * NA + i)));
                        acc[g][i][h] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][h]), d, acc[g][i][h]);
                    }
                }
            }
        }
        for g in 0..GW {
            for i in 0..NA {
                for h in 0..2 {
                    let at = i * out_stride + g * GROUP_ROWS + 8 * h;
                    _mm256_storeu_ps(out.add(at), acc[g][i][h]);
                }
            }
        }
    }

    /// Widens narrow group blocks `src` to int8 values in `dst` (`GROUP_BLOCK_BYTES` each), as
    /// the kernel widens them in registers.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen(kind: NarrowKind, src: &[u8], dst: &mut [i8]) {
        let unit_bytes = kind.group_block_bytes();
        let units = src.len() / unit_bytes;
        assert!(dst.len() >= units * GROUP_BLOCK_BYTES);
        let narrow = Narrow(avx512::Narrow::of(src.as_ptr(), kind));
        let offset = _mm256_set1_epi8(kind.offset());
        for unit in 0..units {
            for step in 0..BLOCK_STEPS {
                // SAFETY: the caller's contract; `unit` is inside `src` and `dst` (asserted).
                unsafe {
                    let halves = narrow.step(unit / SPAN_GROUPS, unit % SPAN_GROUPS, step);
                    let at = unit * GROUP_BLOCK_BYTES + step * GROUP_ROWS * LANE_VALUES;
                    for (h, q) in halves.into_iter().enumerate() {
                        let to = dst.as_mut_ptr().add(at + 32 * h).cast();
                        _mm256_storeu_si256(to, _mm256_add_epi8(q, offset));
                    }
                }
            }
        }
    }
}

/// The 256-bit kernels: half `half` of one weight group (8 rows) against `R` rows of an
/// activation tile from row `i0` on. `$dot` adds one step's products of weights `w` and the
/// broadcast activation values `a` to `acc`.
macro_rules! half_kernel {
    ($name:ident, $features:literal, |$acc:ident, $w:ident, $a:ident| $dot:expr, $offset:expr) => {
        /// # Safety
        #[doc = concat!("The CPU has ", $features, "; `group` exists in `w`, tile `tile` of `a`")]
        /// has rows `i0..i0 + R` and `w.cols` columns, `half < 2`, and `out` holds
        /// `(R - 1) · out_stride + 8` values.
        #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize>(
            w: &Q8Matrix,
            group: usize,
            half: usize,
            a: &Q8Rows,
            tile: usize,
            i0: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            let s = Start::new(w, group, a, tile);
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..s.kb {
                let mut dot = [_mm256_setzero_si256(); R];
                if $offset {
                    for i in 0..R {
                        dot[i] = _mm256_set1_epi32(*s.ao.add(b * s.na + i0 + i));
                    }
                }
                for step in 0..BLOCK_STEPS {
                    let at = b * NEXT_BLOCK + (step * GROUP_ROWS + half * 8) * LANE_VALUES;
                    let $w = _mm256_loadu_si256(s.wq.add(at) as *const __m256i);
                    for i in 0..R {
                        let $a = _mm256_set1_epi32(four(s.aq, s.na, b, step, i0 + i));
                        let $acc = dot[i];
                        dot[i] = $dot;
                    }
                }
                let ws = _mm256_loadu_ps(s.ws.add(b * NEXT_BLOCK_SCALES + half * 8));
                for i in 0..R {
                    let d = _mm256_mul_ps(ws, _mm256_set1_ps(*s.as_.add(b * s.na + i0 + i)));
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i]), d, acc[i]);
                }
            }
            for i in 0..R {
                _mm256_storeu_ps(out.add(i * out_stride), acc[i]);
            }
        }
    };
}

// AVX2, for tiles of 3 or more activation rows (`dot_avx2!`).
half_kernel!(
    half_avx2,
    "avx2,fma",
    |acc, w, a| dot_avx2!(acc, w, a),
    false
);

// AVX-VNNI: as the 512-bit kernel, weights offset to unsigned and the sum started at −128 · Σa.
half_kernel!(
    half_vnni,
    "avx2,fma,avxvnni",
    |acc, w, a| _mm256_dpbusd_avx_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN)), a),
    true
);

// The AVX-VNNI kernel in EVEX encoding (tests only, see `Half::AvxVnniEvex`).
#[cfg(test)]
half_kernel!(
    half_vnni_evex,
    "avx2,fma,avx512f,avx512vl,avx512vnni",
    |acc, w, a| _mm256_dpbusd_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN)), a),
    true
);
