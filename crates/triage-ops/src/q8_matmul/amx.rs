//! The AMX-INT8 kernel of `q8_matmul`: per block, `tdpbssd` multiplies an activation tile (8 rows
//! of the block's 32 values, tmm0) by up to 4 weight groups (each group's block is already the
//! 8 × 64-byte B operand AMX takes: step, row, 4 values), giving each (row, weight row) pair the
//! block's exact int32 dot product in tmm4..tmm7. The tiles are stored and scaled with AVX-512
//! as the other kernels scale: `acc = fma(dot, w_scale · a_scale, acc)` per block, in block
//! order, so AMX gives the portable loop's bits.
//!
//! The instructions have no stable intrinsics: each is one line of inline assembly behind the
//! `Tiles` trait, which a software model of the same instructions also implements. The kernel
//! body is written once over `Tiles`, so hosts without AMX test it (on the model) and AMX hosts
//! run it (on the CPU) with the same code. `kquant_matmul`'s AMX kernel uses the same tiles.
#![allow(unsafe_code)]

use std::arch::asm;
use std::arch::x86_64::*;

use super::cpu::TileArgs;
use super::matrix::{BLOCK_STEPS, GROUP_ROWS, LANE_VALUES, SPAN_GROUPS};
use super::rows::TILE_ROWS;
use super::x86::{Start, NEXT_BLOCK, NEXT_BLOCK_SCALES, NEXT_GROUP, NEXT_GROUP_SCALES};
use super::{Q8Matrix, Q8Rows, QK8_0};

/// Bytes of one row of an A tile: one block of one activation row.
const A_ROW_BYTES: usize = QK8_0;
/// Bytes of one row of a B or C tile: 16 weight rows × 4 values, or 16 int32 dot products.
const BC_ROW_BYTES: usize = GROUP_ROWS * LANE_VALUES;
/// The tile registers: A, the two B registers groups alternate between, and the first C.
pub(crate) const TA: u8 = 0;
pub(crate) const TB: u8 = 1;
pub(crate) const TC: u8 = 4;

/// `ldtilecfg`'s 64-byte operand (palette 1): bytes per row and rows of each tile register.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// This kernel's: `TileConfig::rows(8)`.
    fn kernel() -> Self {
        Self::rows(TILE_ROWS)
    }

    /// tmm0: `rows` rows × 32 bytes (A: a block of 32 values of `rows` activation rows);
    /// tmm1, tmm2: 8 × 64 (B: 8 steps of 16 weight rows × 4 values); tmm4..tmm7: `rows` × 64
    /// (C: int32 sums of 16 weight rows). The rest unused (0 × 0).
    pub(crate) fn rows(rows: usize) -> Self {
        Self::shape(rows, A_ROW_BYTES)
    }

    /// As `rows`, with `a_bytes` values per A row (a multiple of 4, up to 64) and B tiles of
    /// `a_bytes / 4` steps.
    pub(crate) fn shape(rows: usize, a_bytes: usize) -> Self {
        assert!((1..=16).contains(&rows), "a tile has 1 to 16 rows");
        assert!(a_bytes.is_multiple_of(4) && (4..=64).contains(&a_bytes));
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let mut set = |t: u8, rows: usize, colsb: usize| {
            c.colsb[t as usize] = colsb as u16;
            c.rows[t as usize] = rows as u8;
        };
        set(TA, rows, a_bytes);
        for t in [TB, TB + 1] {
            set(t, a_bytes / LANE_VALUES, BC_ROW_BYTES);
        }
        for t in TC..TC + SPAN_GROUPS as u8 {
            set(t, rows, BC_ROW_BYTES);
        }
        c
    }
}

/// The AMX instructions the kernel uses, on tile registers `tmm0..tmm7` named by number.
pub(crate) trait Tiles {
    /// `ldtilecfg`.
    ///
    /// # Safety
    /// On `Hardware`, the CPU has AMX-TILE and the process may use tile data.
    unsafe fn configure(&mut self, config: &TileConfig);
    /// `tileloadd`: the configured rows of tile `t`, each `stride` bytes after the last.
    ///
    /// # Safety
    /// `src` is readable for `t`'s rows and bytes per row at that stride.
    unsafe fn load(&mut self, t: u8, src: *const i8, stride: usize);
    /// `tilezero`.
    unsafe fn zero(&mut self, t: u8);
    /// `tdpbssd`: `c += a · b`, signed bytes, 4 products summed per int32.
    unsafe fn dot(&mut self, c: u8, a: u8, b: u8);
    /// `tilestored`.
    ///
    /// # Safety
    /// `dst` is writable for `t`'s rows and bytes per row at that stride.
    unsafe fn store(&mut self, t: u8, dst: *mut i32, stride: usize);
    /// `tilerelease`.
    unsafe fn release(&mut self);
}

/// The CPU's tile registers. An instruction names its registers in its encoding, so each
/// register the kernel uses has its own line; the kernel's calls are inlined with constant
/// numbers, which leaves one instruction. A register the kernel does not use is a bug: it panics.
pub(crate) struct Hardware;

impl Tiles for Hardware {
    unsafe fn configure(&mut self, config: &TileConfig) {
        // SAFETY: the caller's contract; `config` is a valid palette-1 configuration.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config, options(nostack, readonly)) };
    }

    #[inline(always)]
    unsafe fn load(&mut self, t: u8, src: *const i8, stride: usize) {
        macro_rules! load {
            ($n:literal) => {
                asm!(concat!("tileloadd tmm", $n, ", [{p} + {s}]"), p = in(reg) src,
                     s = in(reg) stride, options(nostack, readonly))
            };
        }
        // SAFETY: the caller's contract.
        unsafe {
            match t {
                0 => load!(0),
                1 => load!(1),
                2 => load!(2),
                _ => unreachable!("the kernel loads tmm0..tmm2 only, not tmm{t}"),
            }
        }
    }

    #[inline(always)]
    unsafe fn zero(&mut self, t: u8) {
        macro_rules! zero {
            ($n:literal) => {
                asm!(concat!("tilezero tmm", $n), options(nostack, nomem))
            };
        }
        // SAFETY: touches tile registers only.
        unsafe {
            match t {
                4 => zero!(4),
                5 => zero!(5),
                6 => zero!(6),
                7 => zero!(7),
                _ => unreachable!("the kernel zeroes tmm4..tmm7 only, not tmm{t}"),
            }
        }
    }

    #[inline(always)]
    unsafe fn dot(&mut self, c: u8, a: u8, b: u8) {
        macro_rules! dot {
            ($c:literal, $b:literal) => {
                asm!(
                    concat!("tdpbssd tmm", $c, ", tmm0, tmm", $b),
                    options(nostack, nomem)
                )
            };
        }
        // SAFETY: touches tile registers only.
        unsafe {
            match (c, a, b) {
                (4, 0, 1) => dot!(4, 1),
                (4, 0, 2) => dot!(4, 2),
                (5, 0, 1) => dot!(5, 1),
                (5, 0, 2) => dot!(5, 2),
                (6, 0, 1) => dot!(6, 1),
                (6, 0, 2) => dot!(6, 2),
                (7, 0, 1) => dot!(7, 1),
                (7, 0, 2) => dot!(7, 2),
                _ => unreachable!("the kernel has no tdpbssd tmm{c}, tmm{a}, tmm{b}"),
            }
        }
    }

    #[inline(always)]
    unsafe fn store(&mut self, t: u8, dst: *mut i32, stride: usize) {
        macro_rules! store {
            ($n:literal) => {
                asm!(concat!("tilestored [{p} + {s}], tmm", $n), p = in(reg) dst,
                     s = in(reg) stride, options(nostack))
            };
        }
        // SAFETY: the caller's contract.
        unsafe {
            match t {
                4 => store!(4),
                5 => store!(5),
                6 => store!(6),
                7 => store!(7),
                _ => unreachable!("the kernel stores tmm4..tmm7 only, not tmm{t}"),
            }
        }
    }

    unsafe fn release(&mut self) {
        // SAFETY: drops the tile state; the next call configures again.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// A software model of the same instructions (Intel SDM, "TDPBSSD"): 8 tile registers of up to
/// 16 rows of 64 bytes, shaped by the last configuration.
#[cfg(test)]
pub(crate) struct Model {
    config: Option<TileConfig>,
    tiles: [[[u8; 64]; 16]; 8],
}

#[cfg(test)]
impl Model {
    pub(crate) fn new() -> Self {
        Self {
            config: None,
            tiles: [[[0; 64]; 16]; 8],
        }
    }

    /// Rows and bytes per row of tile `t` (a configuration is required, as on the CPU).
    fn shape(&self, t: u8) -> (usize, usize) {
        let c = self.config.expect("ldtilecfg before any tile instruction");
        (c.rows[t as usize] as usize, c.colsb[t as usize] as usize)
    }
}

#[cfg(test)]
impl Tiles for Model {
    unsafe fn configure(&mut self, config: &TileConfig) {
        self.config = Some(*config);
        self.tiles = [[[0; 64]; 16]; 8];
    }

    unsafe fn load(&mut self, t: u8, src: *const i8, stride: usize) {
        let (rows, colsb) = self.shape(t);
        for r in 0..rows {
            for b in 0..colsb {
                // SAFETY: the caller's contract.
                self.tiles[t as usize][r][b] = unsafe { *src.add(r * stride + b) } as u8;
            }
        }
    }

    unsafe fn zero(&mut self, t: u8) {
        self.tiles[t as usize] = [[0; 64]; 16];
    }

    unsafe fn dot(&mut self, c: u8, a: u8, b: u8) {
        let ((m_rows, c_colsb), (_, a_colsb)) = (self.shape(c), self.shape(a));
        let (a, b) = (self.tiles[a as usize], self.tiles[b as usize]);
        let c = &mut self.tiles[c as usize];
        for m in 0..m_rows {
            for n in 0..c_colsb / 4 {
                let mut sum = i32::from_le_bytes(c[m][4 * n..4 * n + 4].try_into().unwrap());
                for k in 0..a_colsb / 4 {
                    for i in 0..4 {
                        let x = a[m][4 * k + i] as i8 as i32;
                        let y = b[k][4 * n + i] as i8 as i32;
                        sum = sum.wrapping_add(x * y);
                    }
                }
                c[m][4 * n..4 * n + 4].copy_from_slice(&sum.to_le_bytes());
            }
        }
    }

    unsafe fn store(&mut self, t: u8, dst: *mut i32, stride: usize) {
        let (rows, colsb) = self.shape(t);
        let dst = dst as *mut u8;
        for r in 0..rows {
            for b in 0..colsb {
                // SAFETY: the caller's contract.
                unsafe { *dst.add(r * stride + b) = self.tiles[t as usize][r][b] };
            }
        }
    }

    unsafe fn release(&mut self) {
        self.config = None;
    }
}

/// Whether this CPU has AMX-TILE and AMX-INT8 and the kernel lets this process use tile data
/// (Linux asks for it once per process: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`).
pub(crate) fn usable() -> bool {
    // Leaf 7 exists on every CPU with AVX-512, which the kernel needs anyway.
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
    tile && int8 && tile_data_permitted()
}

#[cfg(target_os = "linux")]
fn tile_data_permitted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a request about this process's own register state; it changes nothing else, and a
    // kernel without AMX support refuses it.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn tile_data_permitted() -> bool {
    false
}

/// Weight groups `group..group + GW` against activation tile `tile`, on `tiles`.
///
/// # Safety
/// The CPU has AVX-512 F/VL (and, with `Hardware`, AMX as `usable` found); the groups exist in
/// `w` within one span; the tile exists in `a` with `w.cols` columns; `out` holds
/// `(rows - 1) · out_stride + GW · 16` values for the tile's rows.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn tile<T: Tiles, const GW: usize>(
    tiles: &mut T,
    w: &Q8Matrix,
    group: usize,
    a: &Q8Rows,
    tile: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let s = Start::new(w, group, a, tile);
    let na = s.na;
    // One block of the tile's rows, row-major, as the A tile takes it (rows past `na` stay 0),
    // and the C tiles' dot products; both where the tile instructions read and write them.
    let mut block = Aligned([0i8; TILE_ROWS * A_ROW_BYTES]);
    let mut dots = Aligned([[0i32; TILE_ROWS * GROUP_ROWS]; SPAN_GROUPS]);
    let mut acc = [[_mm512_setzero_ps(); TILE_ROWS]; GW];
    // SAFETY (all): the caller's contract; `block` and `dots` hold the tiles' rows at these
    // strides, and the B operands are whole group blocks of the groups the caller named.
    unsafe {
        tiles.configure(&TileConfig::kernel());
        for b in 0..s.kb {
            for step in 0..BLOCK_STEPS {
                for i in 0..na {
                    let at = ((b * BLOCK_STEPS + step) * na + i) * LANE_VALUES;
                    let four = s.aq.add(at);
                    let to = i * A_ROW_BYTES + step * LANE_VALUES;
                    std::ptr::copy_nonoverlapping(four, block.0[to..].as_mut_ptr(), LANE_VALUES);
                }
            }
            tiles.load(TA, block.0.as_ptr(), A_ROW_BYTES);
            for g in 0..GW {
                // Two B registers, so that one group's load need not wait for the last
                // group's product.
                let (c, bt) = (TC + g as u8, TB + (g % 2) as u8);
                tiles.zero(c);
                tiles.load(bt, s.wq.add(b * NEXT_BLOCK + g * NEXT_GROUP), BC_ROW_BYTES);
                tiles.dot(c, TA, bt);
                tiles.store(c, dots.0[g].as_mut_ptr(), BC_ROW_BYTES);
            }
            for g in 0..GW {
                let ws = _mm512_loadu_ps(s.ws.add(b * NEXT_BLOCK_SCALES + g * NEXT_GROUP_SCALES));
                for i in 0..na {
                    let dot = _mm512_loadu_si512(dots.0[g][i * GROUP_ROWS..].as_ptr().cast());
                    let d = _mm512_mul_ps(ws, _mm512_set1_ps(*s.as_.add(b * na + i)));
                    acc[g][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), d, acc[g][i]);
                }
            }
        }
        tiles.release();
        for g in 0..GW {
            for i in 0..na {
                _mm512_storeu_ps(out.add(i * out_stride + g * GROUP_ROWS), acc[g][i]);
            }
        }
    }
}

/// 64-byte alignment for tile memory (not required by the instructions, but a tile row then
/// never straddles a cache line).
#[repr(C, align(64))]
pub(crate) struct Aligned<T>(pub(crate) T);

/// Runs the kernel on the CPU's tiles (`usable` said yes, as `cpu::available` checks) for the
/// tile of `args`, with `groups_left` weight groups from `args.group` on; returns how many groups
/// it did (up to the end of their span).
pub(super) fn run(args: TileArgs, groups_left: usize) -> usize {
    // SAFETY: `cpu::available` lists AMX only where `usable` and AVX-512 F/VL were found.
    unsafe { run_on(&mut Hardware, args, groups_left) }
}

/// The kernel body on the software model of the tiles, where the CPU has AVX-512 F/VL (for the
/// scaling); `None` elsewhere.
#[cfg(test)]
pub(super) fn run_on_model(args: TileArgs, groups_left: usize) -> Option<usize> {
    use std::arch::is_x86_feature_detected as has;
    if !(has!("avx512f") && has!("avx512vl") && has!("avx2") && has!("fma")) {
        return None;
    }
    // SAFETY: the features were detected above, and the model needs no AMX.
    Some(unsafe { run_on(&mut Model::new(), args, groups_left) })
}

/// # Safety
/// The CPU has AVX-512 F/VL, and `tiles` can run (see `Tiles::configure`).
unsafe fn run_on<T: Tiles>(tiles: &mut T, args: TileArgs, groups_left: usize) -> usize {
    let TileArgs {
        w,
        group,
        a,
        tile: t,
        out,
        out_stride,
    } = args;
    let na = a.tile_rows(t);
    let gw = groups_left.min(SPAN_GROUPS - group % SPAN_GROUPS);
    assert!(gw >= 1 && group + gw <= w.rows.div_ceil(GROUP_ROWS) && (1..=TILE_ROWS).contains(&na));
    assert!(w.cols == a.cols && out.len() >= (na - 1) * out_stride + gw * GROUP_ROWS);
    let out = out.as_mut_ptr();
    // SAFETY: the caller's contract for the CPU; the groups stay within one span and exist, the
    // tile exists with `w.cols` columns, and `out` holds every row's `gw · 16` values (asserted).
    unsafe {
        match gw {
            4 => tile::<T, 4>(tiles, w, group, a, t, out, out_stride),
            3 => tile::<T, 3>(tiles, w, group, a, t, out, out_stride),
            2 => tile::<T, 2>(tiles, w, group, a, t, out, out_stride),
            _ => tile::<T, 1>(tiles, w, group, a, t, out, out_stride),
        }
    }
    gw
}
