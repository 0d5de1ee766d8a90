//! `q8_matmul`: f32 activations times Q8_0 weights (GGML's blocks of 32 int8 values with one
//! scale). The activations are quantized to the same blocks; the products run int8 by int8 with
//! the weights interleaved in groups of 16 rows (`Q8Matrix`), so one 64-byte load feeds 16 rows'
//! dot products, and the activations in tiles of 8 rows (`Q8Rows`) whose values are broadcast.
//! A weight group is loaded once per 8 activation rows and a block's scaling runs once per 32
//! products (the register-tile shape of oneDNN's int8 GEMMs, written afresh). Written because
//! candle's Q8_0 matmul re-reads and re-converts the f16 scales per row pair, which kept batched
//! decode from scaling with the batch.
//!
//! Batch invariance: every output element is one accumulator that sees the same operations in
//! the same order whatever the kernel, tile shape, number of rows or threads: per block the exact
//! integer dot product, then `acc = fma(dot, w_scale · a_scale, acc)`. A row gives the same bits
//! alone as in a batch of 16 (the engine's batched == alone equivalence relies on it), and every
//! kernel, the portable loop included, gives the same bits.
//!
//! GGML's 4- and 5-bit blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1) are held without loss at their
//! width (`narrow`). The AVX-512 kernel and AVX2's decode tiles widen them in registers; elsewhere
//! a span at a time is widened to int8 into a scratch matrix. Those with a min per block
//! (`d · q + m`) add `Σ m · Σa` after the kernels' products (`mins`), one order for every kernel.

use candle_core::{DType, Device, Tensor};

use crate::cpu::{KernelCells, KernelChoice};
use crate::{OpsError, Result};

#[cfg(target_arch = "x86_64")]
mod amx;
mod cpu;
mod ggml_blocks;
mod matrix;
mod mins;
mod narrow;
mod rows;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use ggml_blocks::GgmlBlockType;
pub use matrix::Q8Matrix;
pub use rows::Q8Rows;

/// Values per Q8_0 block.
pub const QK8_0: usize = 32;
/// Weight rows per parallel task: 4 groups; 64 rows of a 4,864-wide matrix (311 KiB) stay in L2
/// while the activation rows stream past them, and a decode step's task streams 4 groups at once.
const TASK_ROWS: usize = 64;
/// From this many activation rows on, a narrow matrix's span is widened to int8 once for all of
/// them even where the kernel could widen in registers: every 8 rows would widen it again there
/// (the 0.5B's prefill at 601 tokens: 555–562 tok/s widening in registers, against 760 from
/// int8 values), while a decode step reads fewer bytes from memory (71–73 tok/s against 63–64).
const WIDEN_ROWS: usize = 16;
// A task is one span, so a narrow matrix's task widens exactly one span.
const _: () = assert!(TASK_ROWS == matrix::SPAN_ROWS);
/// Activation rows reused against one task's weights before moving on (8 tiles; at most 311 KiB
/// at 4,864 columns, so they stay in L2 too).
const ROW_CHUNK: usize = 64;

/// The CPU kernel that runs the int8 products. All of them give the same bits; `q8_matmul` takes
/// the fastest this CPU runs (`KernelChoice::best`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Kernel {
    /// A plain loop, for any CPU.
    Portable,
    /// x86 AVX2 + FMA: sign, maddubs and madd per 32-value block.
    Avx2,
    /// AVX-VNNI (`vpdpbusd`, VEX-encoded): one instruction per block.
    AvxVnni,
    /// AVX-512 VNNI: 16 weight rows per 512-bit register.
    Avx512Vnni,
    /// AMX-INT8 (`tdpbssd`): 8 activation rows by 16 weight rows per block and tile, scaled with
    /// AVX-512. Chosen only when `TRIAGE_Q8_KERNEL=amx` names it, until an AMX host has measured
    /// it against AVX-512 VNNI (it has not yet run on one).
    Amx,
}

impl KernelChoice for Q8Kernel {
    /// Its names: `portable`, `avx2`, `avx-vnni`, `avx512-vnni`, `amx`.
    const ENV: &'static str = "TRIAGE_Q8_KERNEL";
    const PORTABLE: Self = Q8Kernel::Portable;

    fn name(self) -> &'static str {
        match self {
            Q8Kernel::Portable => "portable",
            Q8Kernel::Avx2 => "avx2",
            Q8Kernel::AvxVnni => "avx-vnni",
            Q8Kernel::Avx512Vnni => "avx512-vnni",
            Q8Kernel::Amx => "amx",
        }
    }

    fn detect() -> Vec<Self> {
        cpu::available()
    }

    /// AMX is taken only when named (see `Q8Kernel::Amx`).
    fn measured(self) -> bool {
        self != Q8Kernel::Amx
    }

    fn cells() -> &'static KernelCells<Self> {
        static CELLS: KernelCells<Q8Kernel> = KernelCells::new();
        &CELLS
    }
}

impl Q8Kernel {
    /// Whether the kernel reads 4- and 5-bit values as they are stored (widening them in
    /// registers) for `num_a` activation rows: AVX-512 VNNI below `WIDEN_ROWS`, AVX2 in its
    /// decode tiles (1 or 2 rows; AVX-VNNI hosts run those too). Otherwise a span at a time is
    /// widened to int8 first.
    fn reads_narrow(self, num_a: usize) -> bool {
        match self {
            Q8Kernel::Avx512Vnni => num_a < WIDEN_ROWS,
            Q8Kernel::Avx2 | Q8Kernel::AvxVnni => num_a <= 2,
            Q8Kernel::Portable | Q8Kernel::Amx => false,
        }
    }
}

/// GGML's `quantize_row_q8_0` on one block of 32 values: `x` into `quants`; returns the scale
/// before GGML rounds it to f16 to store it (`to_f16` does that).
fn quantize_block(x: &[f32], quants: &mut [i8; QK8_0]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, v) in quants.iter_mut().zip(x) {
        *q = round_half_away(v * inv) as i8;
    }
    d
}

/// `x` rounded to f16, as GGML stores a block's scale.
fn to_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// `x.round()` (C's `roundf`: halves away from zero) for |x| < 2^31, written with a truncating
/// conversion so that the loop vectorizes (`round` is a library call on baseline x86-64). Exact:
/// `x - trunc(x)` is representable, so the comparison with ±0.5 sees the true fraction.
fn round_half_away(x: f32) -> i32 {
    let t = x as i32;
    let frac = x - t as f32;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

fn check_cols(cols: usize) -> Result<()> {
    check_block_cols(cols, QK8_0, "Q8_0")
}

/// `cols` is a positive multiple of `block` (`what` names the format in the error).
pub(crate) fn check_block_cols(cols: usize, block: usize, what: &str) -> Result<()> {
    if cols == 0 || !cols.is_multiple_of(block) {
        return Err(OpsError::InvalidArgument(format!(
            "{what} rows need a positive multiple of {block} columns, got {cols}"
        )));
    }
    Ok(())
}

/// The rows of `x` (`[m, cols]`, on the CPU) as f32 values for the int8 matmul `op`.
pub(crate) fn cpu_input(op: &str, x: &Tensor, cols: usize) -> Result<(usize, Vec<f32>)> {
    let (m, k) = x.dims2()?;
    if k != cols {
        return Err(OpsError::InvalidArgument(format!(
            "{op}: x has {k} columns, the weights {cols}"
        )));
    }
    if !x.device().is_cpu() {
        return Err(OpsError::InvalidArgument(format!(
            "{op} runs on CPU tensors"
        )));
    }
    Ok((m, x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?))
}

/// `x Wᵀ` for `x` `[m, k]` (f32, CPU) and `w` `[n, k]`: `[m, n]` f32.
pub fn q8_matmul(x: &Tensor, w: &Q8Matrix) -> Result<Tensor> {
    let (m, values) = cpu_input("q8_matmul", x, w.cols())?;
    let a = Q8Rows::quantize(m, w.cols(), &values)?;
    let out = q8_matmul_quantized(&a, w, Q8Kernel::best())?;
    Ok(Tensor::from_vec(out, (m, w.rows()), &Device::Cpu)?)
}

/// `a Wᵀ` for already quantized activations: `[a.rows, w.rows]` row-major, with `kernel` (one
/// of `Q8Kernel::available()`; another falls back to `Portable`).
pub fn q8_matmul_quantized(a: &Q8Rows, w: &Q8Matrix, kernel: Q8Kernel) -> Result<Vec<f32>> {
    if a.cols() != w.cols() {
        return Err(OpsError::InvalidArgument(format!(
            "q8_matmul: activations of {} columns, weights of {}",
            a.cols(),
            w.cols()
        )));
    }
    let kernel = if Q8Kernel::available().contains(&kernel) {
        kernel
    } else {
        Q8Kernel::Portable
    };
    // Tasks are weight rows (output columns). They run on candle's own thread pool: a second
    // pool (rayon) would spin against candle's workers between the ops of a layer, which on 2
    // cores cost a sixth of single-stream decode.
    Ok(crate::cpu::pool::column_tasks(
        a.rows(),
        w.rows(),
        TASK_ROWS,
        ROW_CHUNK,
        crate::cpu::pool::TileLayout::RowMajor,
        |w0, num_w, a0, num_a, tile| {
            if w.narrow.is_none() || kernel.reads_narrow(num_a) {
                return product(kernel, w, w0, num_w, a, a0, num_a, tile);
            }
            // The span (this task's 64 rows) widened to int8 in this worker's scratch matrix,
            // which stays in its cache while the activation rows stream past it.
            WIDENED.with_borrow_mut(|span| {
                w.widen_span(w0 / TASK_ROWS, span);
                product(kernel, span, 0, num_w, a, a0, num_a, tile)
            })
        },
    ))
}

thread_local! {
    /// Each pool worker's span of a narrow matrix, widened; reused from call to call.
    static WIDENED: std::cell::RefCell<Q8Matrix> = std::cell::RefCell::new(Q8Matrix::scratch());
}

/// One task's tile: the kernel's products of int8 matrix `w`, then the min term where it has one.
#[allow(clippy::too_many_arguments)]
fn product(
    kernel: Q8Kernel,
    w: &Q8Matrix,
    w0: usize,
    num_w: usize,
    a: &Q8Rows,
    a0: usize,
    num_a: usize,
    tile: &mut [f32],
) {
    cpu::tiles(kernel, w, w0, num_w, a, a0, num_a, tile, TASK_ROWS);
    if let Some(mins) = &w.mins {
        mins::add(w, mins, w0, num_w, a, a0, num_a, tile, TASK_ROWS);
    }
}

/// Reference: the same quantization written with basic tensor ops, then a plain f32 matmul; for
/// weights with mins, the `d · q` part so, plus the activation blocks' f16-rounded sums (GGML's
/// Q8_1) times the mins.
pub fn q8_matmul_slow(x: &Tensor, w: &Q8Matrix) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let blocks = x.to_dtype(DType::F32)?.reshape((m, k / QK8_0, QK8_0))?;
    let amax = blocks.abs()?.max_keepdim(2)?;
    let d = amax.broadcast_div(&Tensor::new(127f32, x.device())?)?;
    // All-zero blocks: any finite inverse works (their values stay 0).
    let safe = d.eq(0f32)?.where_cond(&d.ones_like()?, &d)?;
    let q = blocks.broadcast_mul(&safe.recip()?)?.round()?;
    let scale = d.to_dtype(DType::F16)?.to_dtype(DType::F32)?;
    let xq = q.broadcast_mul(&scale)?.reshape((m, k))?;
    let (n, kb) = (w.rows(), k / QK8_0);
    let blocks_of_w = (0..n).flat_map(|r| (0..kb).map(move |b| w.block(r, b)));
    let (scaled, mins): (Vec<[f32; QK8_0]>, Vec<f32>) = blocks_of_w
        .map(|blk| (blk.quants.map(|v| blk.d * v as f32), blk.m))
        .unzip();
    let wf = Tensor::from_vec(scaled.concat(), (n, k), x.device())?;
    let out = xq.matmul(&wf.t()?)?;
    if w.mins.is_none() {
        return Ok(out);
    }
    let sums = q.sum(2)?.mul(&d.squeeze(2)?)?;
    let sums = sums.to_dtype(DType::F16)?.to_dtype(DType::F32)?;
    let mins = Tensor::from_vec(mins, (n, kb), x.device())?;
    Ok((out + sums.matmul(&mins.t()?)?)?)
}

#[cfg(test)]
mod tests;
