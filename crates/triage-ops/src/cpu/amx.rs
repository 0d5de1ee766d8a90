//! AMX tile primitives shared by the quantized matmuls' AMX-INT8 kernels: the tile configuration,
//! the instructions behind the `Tiles` trait, and a software model of them.
//!
//! The instructions have no stable intrinsics: each is one line of inline assembly behind
//! `Tiles`, which the software model (`Model`, tests only) also implements. A kernel body is
//! written once over `Tiles`, so hosts without AMX test it (on the model) and AMX hosts run it
//! (on the CPU) with the same code. The register use is fixed for every kernel: tmm0 holds A,
//! tmm1 and tmm2 the B operands kernels alternate between (so that one load need not wait for
//! the last product), tmm4..tmm7 the C sums.
//!
//! No kernel built on them has yet run on an AMX host, so the AMX kernels are taken only when
//! `TRIAGE_Q8_KERNEL=amx` or `TRIAGE_KQUANT_KERNEL=amx` names them.
#![allow(unsafe_code)]

use std::arch::asm;

/// Values summed into one int32 of C (`tdpbssd`'s 4 bytes per dword).
const DWORD_VALUES: usize = 4;
/// Bytes of one row of a B or C tile: 16 columns × 4 values, or 16 int32 dot products.
pub(crate) const BC_ROW_BYTES: usize = 64;
/// C tiles in use: tmm4..tmm7.
const NUM_C: u8 = 4;

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
    /// tmm0: `rows` rows × `a_bytes` (A: `a_bytes` values, a multiple of 4 up to 64, of `rows`
    /// activation rows); tmm1, tmm2: `a_bytes / 4` × 64 (B: that many steps of 16 weight rows ×
    /// 4 values); tmm4..tmm7: `rows` × 64 (C: int32 sums of 16 weight rows). The rest unused
    /// (0 × 0).
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
            set(t, a_bytes / DWORD_VALUES, BC_ROW_BYTES);
        }
        for t in TC..TC + NUM_C {
            set(t, rows, BC_ROW_BYTES);
        }
        c
    }
}

/// The AMX instructions the kernels use, on tile registers `tmm0..tmm7` named by number.
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

/// 64-byte alignment for tile memory (not required by the instructions, but a tile row then
/// never straddles a cache line).
#[repr(C, align(64))]
pub(crate) struct Aligned<T>(pub(crate) T);
