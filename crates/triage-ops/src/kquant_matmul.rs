//! `kquant_matmul`: f32 activations times GGML's K-quant weights (Q4_K, Q6_K), with no dense
//! copy. The activations are quantized to Q8_K (GGML's `quantize_row_q8_K`) and each
//! super-block's products run in integers (4- or 6-bit weights by int8 activations, times the
//! 6- or 8-bit sub-block scales), which are exact, so every kernel (portable, AVX2, AVX-512) gives
//! the same bits and a row gives the same bits alone as in a batch (the engine relies on it).
//!
//! Both types are re-laid out once, losslessly, into tiles of 16 rows (`packed_q4k`,
//! `packed_q6k`, each stating its order of operations) whose products run 16 rows per
//! `vpdpbusd`; the GGUF blocks are dropped after packing.
//!
//! Ours instead of candle's: candle keeps the GGUF blocks and builds a second, f32-scaled copy
//! for its repacked x86 kernel (about 2.3× the Q4_K bytes in all). It also runs one row through
//! another kernel than several, so a row's bits depend on its batch.

use candle_core::{DType, Device, Tensor};

use crate::cpu::{KernelCells, KernelChoice};
use crate::{OpsError, Result};

#[cfg(target_arch = "x86_64")]
mod amx;
mod blocks;
mod cpu;
mod packed;
mod packed_q4k;
mod packed_q6k;
mod tiles;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;
/// Weight rows per parallel task: one packed Q4_K row tile.
const TASK_ROWS: usize = tiles::TILE_ROWS;
/// Activation rows per register tile.
const TILE_A: usize = 4;
/// Activation rows per AMX tile (`amx`): one A tile's 16 rows.
const AMX_ROWS: usize = 16;
/// Activation rows reused against one task's weights before moving on.
const ROW_CHUNK: usize = 16;

/// A K-quant weight type `kquant_matmul` multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuantType {
    /// 4-bit values, 6-bit scales and mins per 32, 4.5 bits per weight.
    Q4K,
    /// 6-bit values, int8 scales per 16, 6.5625 bits per weight.
    Q6K,
}

impl KQuantType {
    /// Bytes of one super-block.
    pub fn block_bytes(self) -> usize {
        match self {
            KQuantType::Q4K => blocks::Q4K_BYTES,
            KQuantType::Q6K => blocks::Q6K_BYTES,
        }
    }
}

/// The CPU kernel that runs the integer products; all give the same bits. `best()` takes the
/// fastest this CPU runs, or the one `TRIAGE_KQUANT_KERNEL` names (`portable`, `avx2`,
/// `avx512-vnni`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KQuantKernel {
    /// A plain loop, for any CPU.
    Portable,
    /// x86 AVX2 + FMA: `maddubs` and `madd` over 4 values of 8 packed rows.
    Avx2,
    /// AVX-512 VNNI: one `vpdpbusd` over 4 values of 16 packed rows.
    Avx512Vnni,
    /// AMX-INT8 (`tdpbssd`: 16 activation rows by 16 weight rows per sub-block, 32 values for
    /// Q4_K and 16 for Q6_K). Chosen only when `TRIAGE_KQUANT_KERNEL=amx` names it, until an AMX
    /// host has measured it (it has not yet run on one).
    Amx,
}

impl KernelChoice for KQuantKernel {
    const ENV: &'static str = "TRIAGE_KQUANT_KERNEL";
    const PORTABLE: Self = KQuantKernel::Portable;

    fn name(self) -> &'static str {
        match self {
            KQuantKernel::Portable => "portable",
            KQuantKernel::Avx2 => "avx2",
            KQuantKernel::Avx512Vnni => "avx512-vnni",
            KQuantKernel::Amx => "amx",
        }
    }

    fn detect() -> Vec<Self> {
        cpu::available()
    }

    /// AMX is taken only when named (see `KQuantKernel::Amx`).
    fn measured(self) -> bool {
        self != KQuantKernel::Amx
    }

    fn cells() -> &'static KernelCells<Self> {
        static CELLS: KernelCells<KQuantKernel> = KernelCells::new();
        &CELLS
    }
}

/// A row-major `[rows, cols]` matrix of K-quant weights.
#[derive(Debug, Clone, PartialEq)]
pub struct KQuantMatrix {
    ty: KQuantType,
    rows: usize,
    cols: usize,
    data: KQuantData,
}

/// How a matrix's super-blocks are stored.
#[derive(Debug, Clone, PartialEq)]
enum KQuantData {
    /// Q4_K in row tiles of 16.
    PackedQ4K(packed_q4k::PackedQ4K),
    /// Q6_K in row tiles of 16.
    PackedQ6K(packed_q6k::PackedQ6K),
}

impl KQuantMatrix {
    /// From GGML's bytes (e.g. a GGUF tensor's data): Q4_K is packed from them, Q6_K copied.
    pub fn from_ggml_bytes(ty: KQuantType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        check_cols(cols)?;
        let want = rows * cols / QK_K * ty.block_bytes();
        if bytes.len() != want {
            return Err(OpsError::InvalidArgument(format!(
                "{ty:?} [{rows}, {cols}] needs {want} bytes, got {}",
                bytes.len()
            )));
        }
        let data = match ty {
            KQuantType::Q4K => KQuantData::PackedQ4K(packed_q4k::pack(rows, cols / QK_K, bytes)),
            KQuantType::Q6K => KQuantData::PackedQ6K(packed_q6k::pack(rows, cols / QK_K, bytes)),
        };
        Ok(Self {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// The rows of `parts`, one matrix after the other (all of one type and width, all parts
    /// but the last a whole number of 16-row tiles). Each output element keeps its own
    /// accumulator, so the stacked product gives every part's bits.
    pub fn stack_rows(parts: &[&KQuantMatrix]) -> Result<Self> {
        let first = parts
            .first()
            .ok_or_else(|| OpsError::InvalidArgument("stacking no matrices".into()))?;
        if let Some(bad) = parts
            .iter()
            .find(|p| p.ty != first.ty || p.cols != first.cols)
        {
            return Err(OpsError::InvalidArgument(format!(
                "stacking {:?} [_, {}] with {:?} [_, {}]",
                first.ty, first.cols, bad.ty, bad.cols
            )));
        }
        let (init, _) = parts.split_at(parts.len() - 1);
        if let Some(bad) = init.iter().find(|p| !p.rows.is_multiple_of(TASK_ROWS)) {
            return Err(OpsError::InvalidArgument(format!(
                "stacking after {} rows (not a whole number of {TASK_ROWS}-row tiles)",
                bad.rows
            )));
        }
        // Tiles are row tile major, so the parts' tiles follow one another.
        let nb = first.cols / QK_K;
        let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.packed_bytes().len()).sum());
        for part in parts {
            bytes.extend_from_slice(part.packed_bytes());
        }
        let data = match first.ty {
            KQuantType::Q4K => KQuantData::PackedQ4K(packed_q4k::PackedQ4K { nb, bytes }),
            KQuantType::Q6K => KQuantData::PackedQ6K(packed_q6k::PackedQ6K { nb, bytes }),
        };
        Ok(Self {
            ty: first.ty,
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            data,
        })
    }

    pub fn ty(&self) -> KQuantType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The packed tiles' bytes.
    fn packed_bytes(&self) -> &[u8] {
        match &self.data {
            KQuantData::PackedQ4K(p) => &p.bytes,
            KQuantData::PackedQ6K(p) => &p.bytes,
        }
    }

    /// The matrix as f32, as GGML's `dequantize_row_*` writes it.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, values) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(row, values);
        }
        out
    }

    /// Row `row` (< `rows`) as f32 into `out` (`cols` values), as `dequantize` writes it: an
    /// embedding lookup in a table kept in a K-quant.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        for (b, dst) in out.chunks_exact_mut(QK_K).enumerate() {
            match &self.data {
                KQuantData::PackedQ4K(p) => {
                    let tile = p.tile(row / TASK_ROWS, b);
                    packed_q4k::dequantize_row(tile, row % TASK_ROWS, dst)
                }
                KQuantData::PackedQ6K(p) => {
                    let tile = p.tile(row / TASK_ROWS, b);
                    packed_q6k::dequantize_row(tile, row % TASK_ROWS, dst)
                }
            }
        }
    }
}

/// One super-block being quantized: its values, and where its int8 values, sums of 16 and scale
/// go.
type Q8KBlock<'a> = (&'a [f32], &'a mut [i8], &'a mut [i16], &'a mut f32);

/// Activation rows in Q8_K: per super-block of 256 one f32 scale, int8 values and the sums of
/// each 16 of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8KRows {
    rows: usize,
    cols: usize,
    /// `[rows, cols / 256]`.
    d: Vec<f32>,
    /// `[rows, cols]`.
    quants: Vec<i8>,
    /// `[rows, cols / 16]`.
    bsums: Vec<i16>,
}

impl Q8KRows {
    /// Quantize row-major f32 `values` (`[rows, cols]`) exactly as GGML's `quantize_row_q8_K`.
    pub fn quantize(rows: usize, cols: usize, values: &[f32]) -> Result<Self> {
        check_cols(cols)?;
        if values.len() != rows * cols {
            return Err(OpsError::InvalidArgument(format!(
                "{} values for a [{rows}, {cols}] matrix",
                values.len()
            )));
        }
        let mut quants = vec![0i8; rows * cols];
        let mut bsums = vec![0i16; rows * cols / 16];
        let mut d = vec![0f32; rows * cols / QK_K];
        let mut by_block: Vec<Q8KBlock> = values
            .chunks_exact(QK_K)
            .zip(quants.chunks_exact_mut(QK_K))
            .zip(bsums.chunks_exact_mut(QK_K / 16))
            .zip(d.iter_mut())
            .map(|(((x, q), s), d)| (x, q, s, d))
            .collect();
        let quantize = |(x, q, s, d): &mut Q8KBlock| **d = blocks::quantize_q8k(x, q, s);
        if rows >= 4 {
            let per_row = cols / QK_K;
            crate::cpu::pool::for_each_chunk_mut(&mut by_block, per_row, |_, row| {
                row.iter_mut().for_each(quantize)
            });
        } else {
            by_block.iter_mut().for_each(quantize);
        }
        Ok(Self {
            rows,
            cols,
            d,
            quants,
            bsums,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row `row` alone (for batch-invariance checks and callers that split a batch).
    pub fn row(&self, row: usize) -> Q8KRows {
        let nb = self.cols / QK_K;
        Q8KRows {
            rows: 1,
            cols: self.cols,
            d: self.d[row * nb..(row + 1) * nb].to_vec(),
            quants: self.quants[row * self.cols..(row + 1) * self.cols].to_vec(),
            bsums: self.bsums[row * self.cols / 16..(row + 1) * self.cols / 16].to_vec(),
        }
    }

    /// The rows as f32 (scale times value): what the products see.
    pub fn dequantize(&self) -> Vec<f32> {
        self.quants
            .chunks_exact(QK_K)
            .zip(&self.d)
            .flat_map(|(q, &d)| q.iter().map(move |&v| d * v as f32))
            .collect()
    }
}

/// A tile's activation rows: `[rows, nb]` scales, `[rows, nb · 256]` values,
/// `[rows, nb · 16]` sums of 16.
struct Acts<'a> {
    nb: usize,
    d: &'a [f32],
    quants: &'a [i8],
    bsums: &'a [i16],
}

impl Acts<'_> {
    /// Row `c`'s super-block `b`: scale, values, sums of 16.
    fn block(&self, c: usize, b: usize) -> (f32, &[i8], &[i16]) {
        let at = c * self.nb + b;
        (
            self.d[at],
            &self.quants[at * QK_K..(at + 1) * QK_K],
            &self.bsums[at * 16..(at + 1) * 16],
        )
    }
}

fn check_cols(cols: usize) -> Result<()> {
    crate::q8_matmul::check_block_cols(cols, QK_K, "K-quant")
}

/// `x Wᵀ` for `x` `[m, k]` (f32, CPU) and `w` `[n, k]`: `[m, n]` f32.
pub fn kquant_matmul(x: &Tensor, w: &KQuantMatrix) -> Result<Tensor> {
    let (m, values) = crate::q8_matmul::cpu_input("kquant_matmul", x, w.cols)?;
    let a = Q8KRows::quantize(m, w.cols, &values)?;
    let out = kquant_matmul_quantized(&a, w, KQuantKernel::best())?;
    Ok(Tensor::from_vec(out, (m, w.rows), &Device::Cpu)?)
}

/// `a Wᵀ` for already quantized activations: `[a.rows, w.rows]` row-major, with `kernel` (one of
/// `KQuantKernel::available()`; another falls back to `Portable`).
pub fn kquant_matmul_quantized(
    a: &Q8KRows,
    w: &KQuantMatrix,
    kernel: KQuantKernel,
) -> Result<Vec<f32>> {
    if a.cols != w.cols {
        return Err(OpsError::InvalidArgument(format!(
            "kquant_matmul: activations of {} columns, weights of {}",
            a.cols, w.cols
        )));
    }
    let kernel = if KQuantKernel::available().contains(&kernel) {
        kernel
    } else {
        KQuantKernel::Portable
    };
    let (m, n) = (a.rows, w.rows);
    // Tasks are row tiles (output columns), on candle's pool like every triage op.
    Ok(crate::cpu::pool::column_tasks(
        m,
        n,
        TASK_ROWS,
        ROW_CHUNK,
        crate::cpu::pool::TileLayout::ColumnMajor,
        |w0, num_w, a0, num_a, tile| cpu::tiles(kernel, w, w0, num_w, a, a0, num_a, tile),
    ))
}

/// Reference: GGML's Q8_K quantization written with basic tensor ops (per 256 values the signed
/// value of largest magnitude, scale −127 / it, round half to even, cap at 127), then a plain
/// f32 matmul against the dequantized weights.
pub fn kquant_matmul_slow(x: &Tensor, w: &KQuantMatrix) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    check_cols(k)?;
    let blocks = x.to_dtype(DType::F32)?.reshape((m, k / QK_K, QK_K))?;
    let idx = blocks.abs()?.argmax_keepdim(2)?;
    let max = blocks.gather(&idx, 2)?;
    // All-zero blocks: any finite scale works (their values stay 0).
    let safe = max.eq(0f32)?.where_cond(&max.ones_like()?, &max)?;
    let iscale = safe.recip()?.affine(-127.0, 0.0)?;
    let q = round_half_even(&blocks.broadcast_mul(&iscale)?)?.clamp(-128f32, 127f32)?;
    let xq = q.broadcast_mul(&iscale.recip()?)?.reshape((m, k))?;
    let wf = Tensor::from_vec(w.dequantize(), (w.rows, w.cols), x.device())?;
    Ok(xq.matmul(&wf.t()?)?)
}

/// Round half to even with tensor ops: `round` (halves away from zero), then one step back
/// toward zero where `x` was exactly halfway and the result is odd.
fn round_half_even(x: &Tensor) -> Result<Tensor> {
    let r = x.round()?;
    let halfway = (x - x.floor()?)?.eq(0.5f32)?;
    let odd = (r.affine(0.5, 0.0)?.floor()?.affine(2.0, 0.0)? - &r)?.ne(0f32)?;
    let toward_zero = (&r - r.sign()?)?;
    let fix = halfway.mul(&odd)?;
    Ok(fix.where_cond(&toward_zero, &r)?)
}

#[cfg(test)]
mod tests;
