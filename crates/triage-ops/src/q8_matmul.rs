//! `q8_matmul`: f32 activations times Q8_0 weights (GGML's blocks of 32 int8 values with one
//! scale). The activations are quantized to the same blocks and the products run int8 by int8 in
//! register tiles of 2 weight rows by 4 activation rows, so a weight block is loaded once for four
//! rows and an activation block once for two (llamafile's tinyBLAS idea, written afresh).
//!
//! Batch invariance: every output element is one accumulator that sees the same operations in
//! the same order whatever the tile shape, the number of rows or threads; a row gives the same
//! bits alone as in a batch of 16 (the engine's batched == alone equivalence relies on it).

use candle_core::{DType, Device, Tensor};

use crate::{OpsError, Result};

mod cpu;
mod pairs;
#[cfg(target_arch = "x86_64")]
mod weight_pairs;

/// Values per Q8_0 block.
pub const QK8_0: usize = 32;
/// Bytes of one GGML Q8_0 block: an f16 scale, then 32 int8 values.
const GGML_BLOCK_BYTES: usize = 2 + QK8_0;
/// Weight rows per parallel task: 16 rows of a 4,864-wide matrix (78 KiB) stay in L2 while the
/// activation rows stream past them.
const TASK_ROWS: usize = 16;
/// Activation rows reused against one task's weights before moving on (at most 311 KiB at 4,864
/// columns, so they stay in L2 too).
const ROW_CHUNK: usize = 64;

/// The CPU kernel that runs the int8 products. All of them give the same bits but for
/// `Portable`, whose sums are scalar; `q8_matmul` takes the fastest this CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Kernel {
    /// A plain loop, for any CPU.
    Portable,
    /// x86 AVX2 + FMA: sign, maddubs and madd per 32-value block.
    Avx2,
    /// AVX-VNNI (`vpdpbusd`, VEX-encoded): one instruction per block.
    AvxVnni,
    /// AVX-512 VNNI on 256-bit vectors (CPUs with AVX-512 but not AVX-VNNI).
    Avx512Vnni,
    /// AVX-512 VNNI with two activation rows per 512-bit register: half the instructions per
    /// product where several rows share the weights (one row runs `Avx512Vnni`).
    Avx512VnniPairs,
}

impl Q8Kernel {
    /// The kernels this CPU can run, slowest first (detected once).
    pub fn available() -> &'static [Q8Kernel] {
        static AVAILABLE: std::sync::OnceLock<Vec<Q8Kernel>> = std::sync::OnceLock::new();
        AVAILABLE.get_or_init(cpu::available)
    }

    /// The fastest kernel this CPU runs, or the one `TRIAGE_Q8_KERNEL` names (`portable`, `avx2`,
    /// `avx-vnni`, `avx512-vnni`, `avx512-vnni-pairs`) when the CPU runs it: all give the same
    /// bits, so the variable only changes speed (benchmarks compare kernels with it). Read once.
    pub fn best() -> Q8Kernel {
        static BEST: std::sync::OnceLock<Q8Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            crate::kernel_choice::chosen("TRIAGE_Q8_KERNEL", Self::available(), Self::name)
                .unwrap_or(Q8Kernel::Portable)
        })
    }

    /// The kernel of this `name` (see `name`), if this CPU runs it.
    pub fn from_name(name: &str) -> Option<Q8Kernel> {
        crate::kernel_choice::named(Self::available(), name, Self::name)
    }

    /// The kernel's name for `TRIAGE_Q8_KERNEL`.
    pub fn name(self) -> &'static str {
        match self {
            Q8Kernel::Portable => "portable",
            Q8Kernel::Avx2 => "avx2",
            Q8Kernel::AvxVnni => "avx-vnni",
            Q8Kernel::Avx512Vnni => "avx512-vnni",
            Q8Kernel::Avx512VnniPairs => "avx512-vnni-pairs",
        }
    }
}

/// A row-major matrix `[rows, cols]` in Q8_0: int8 values and one f32 scale per 32 of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Matrix {
    rows: usize,
    cols: usize,
    /// `[rows, cols / 32]`.
    scales: Vec<f32>,
    /// `[rows, cols]`.
    quants: Vec<i8>,
}

impl Q8Matrix {
    /// From GGML's Q8_0 bytes (`rows * cols / 32` blocks of 34 bytes), e.g. a GGUF tensor.
    pub fn from_ggml_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        check_cols(cols)?;
        let num_blocks = rows * cols / QK8_0;
        if bytes.len() != num_blocks * GGML_BLOCK_BYTES {
            return Err(OpsError::InvalidArgument(format!(
                "Q8_0 [{rows}, {cols}] needs {} bytes, got {}",
                num_blocks * GGML_BLOCK_BYTES,
                bytes.len()
            )));
        }
        let kb = cols / QK8_0;
        let mut scales = vec![0f32; num_blocks];
        let mut quants = vec![0i8; rows * cols];
        // Loading a model is mostly this copy and the page faults of its fresh memory, so rows
        // are spread over the pool in chunks.
        const CHUNK_ROWS: usize = 64;
        let mut chunks: Vec<(&[u8], &mut [f32], &mut [i8])> = bytes
            .chunks(CHUNK_ROWS * kb * GGML_BLOCK_BYTES)
            .zip(scales.chunks_mut(CHUNK_ROWS * kb))
            .zip(quants.chunks_mut(CHUNK_ROWS * cols))
            .map(|((b, d), q)| (b, d, q))
            .collect();
        crate::pool::for_each_chunk_mut(&mut chunks, 1, |_, chunk| {
            let (bytes, scales, quants) = &mut chunk[0];
            let blocks = bytes.chunks_exact(GGML_BLOCK_BYTES);
            for ((block, d), q) in blocks
                .zip(scales.iter_mut())
                .zip(quants.chunks_exact_mut(QK8_0))
            {
                *d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                // GGML's quantizer rounds x / (max |x| / 127), so it never writes −128; a file
                // that holds one anyway gets −127, which AVX2's sign trick (it cannot negate
                // −128) and the other kernels then multiply alike.
                for (q, &b) in q.iter_mut().zip(&block[2..]) {
                    *q = (b as i8).max(-127);
                }
            }
        });
        Ok(Self {
            rows,
            cols,
            scales,
            quants,
        })
    }

    /// Quantize row-major f32 `values` (`[rows, cols]`) exactly as GGML's `quantize_row_q8_0`
    /// does: per block d = max |x| / 127, values rounded to nearest of x · (1/d), and d stored
    /// as f16. Matching GGML bit for bit keeps triage's products those of llama.cpp.
    pub fn quantize(rows: usize, cols: usize, values: &[f32]) -> Result<Self> {
        check_cols(cols)?;
        if values.len() != rows * cols {
            return Err(OpsError::InvalidArgument(format!(
                "{} values for a [{rows}, {cols}] matrix",
                values.len()
            )));
        }
        let kb = cols / QK8_0;
        let mut scales = vec![0f32; rows * kb];
        let mut quants = vec![0i8; rows * cols];
        let mut by_row: Vec<(&[f32], &mut [i8], &mut [f32])> = values
            .chunks_exact(cols)
            .zip(quants.chunks_exact_mut(cols))
            .zip(scales.chunks_exact_mut(kb))
            .map(|((x, q), d)| (x, q, d))
            .collect();
        let quantize_row =
            |(x, q, d): &mut (&[f32], &mut [i8], &mut [f32])| quantize_blocks(x, q, d);
        // A batch's rows are spread over the pool (one row is too little work to hand off).
        if rows >= 4 {
            crate::pool::for_each_chunk_mut(&mut by_row, 1, |_, row| quantize_row(&mut row[0]));
        } else {
            by_row.iter_mut().for_each(quantize_row);
        }
        Ok(Self {
            rows,
            cols,
            scales,
            quants,
        })
    }

    /// The rows of `parts`, one matrix after the other (e.g. Q, K and V projections run as one
    /// product). Each output element keeps its own accumulator, so the stacked product gives
    /// every part's bits.
    pub fn stack_rows(parts: &[&Q8Matrix]) -> Result<Self> {
        let cols = parts.first().map_or(0, |p| p.cols);
        if let Some(bad) = parts.iter().find(|p| p.cols != cols) {
            return Err(OpsError::InvalidArgument(format!(
                "stacking Q8_0 matrices of {cols} and {} columns",
                bad.cols
            )));
        }
        check_cols(cols)?;
        Ok(Self {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols,
            scales: concat(parts.iter().map(|p| p.scales.as_slice())),
            quants: concat(parts.iter().map(|p| p.quants.as_slice())),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The matrix as f32 (scale times value).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, values) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(row, values);
        }
        out
    }

    /// Row `row` (< `rows`) as f32 into `out` (`cols` values), as `dequantize` writes it: an
    /// embedding lookup in a table kept in Q8_0.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let kb = self.cols / QK8_0;
        let quants = &self.quants[row * self.cols..][..self.cols];
        let scales = &self.scales[row * kb..][..kb];
        for ((o, q), &d) in out
            .chunks_exact_mut(QK8_0)
            .zip(quants.chunks_exact(QK8_0))
            .zip(scales)
        {
            for (o, &v) in o.iter_mut().zip(q) {
                *o = d * v as f32;
            }
        }
    }
}

/// The slices one after the other.
fn concat<'a, T: Copy + Default + 'a>(parts: impl Iterator<Item = &'a [T]> + Clone) -> Vec<T> {
    let mut out = Vec::with_capacity(parts.clone().map(<[T]>::len).sum());
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

/// GGML's `quantize_row_q8_0` on one row: `x` into `quants`, one scale per 32 values.
fn quantize_blocks(x: &[f32], quants: &mut [i8], scales: &mut [f32]) {
    for ((x, q), scale) in x
        .chunks_exact(QK8_0)
        .zip(quants.chunks_exact_mut(QK8_0))
        .zip(scales.iter_mut())
    {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, v) in q.iter_mut().zip(x) {
            *q = round_half_away(v * inv) as i8;
        }
        *scale = half::f16::from_f32(d).to_f32();
    }
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
    let (m, values) = cpu_input("q8_matmul", x, w.cols)?;
    let a = Q8Matrix::quantize(m, w.cols, &values)?;
    let out = q8_matmul_quantized(&a, w, Q8Kernel::best());
    Ok(Tensor::from_vec(out, (m, w.rows), &Device::Cpu)?)
}

/// `a Wᵀ` for already quantized activations: `[a.rows, w.rows]` row-major, with `kernel` (one
/// of `Q8Kernel::available()`; another falls back to `Portable`).
pub fn q8_matmul_quantized(a: &Q8Matrix, w: &Q8Matrix, kernel: Q8Kernel) -> Vec<f32> {
    let kernel = if Q8Kernel::available().contains(&kernel) {
        kernel
    } else {
        Q8Kernel::Portable
    };
    let (m, n) = (a.rows, w.rows);
    // One row would leave half of each paired register empty.
    let kernel = if kernel == Q8Kernel::Avx512VnniPairs && m < 2 {
        Q8Kernel::Avx512Vnni
    } else {
        kernel
    };
    let acts = cpu::Activations::prepare(kernel, a);
    // Tasks are weight rows (output columns). They run on candle's own thread pool: a second
    // pool (rayon) would spin against candle's workers between the ops of a layer, which on 2
    // cores cost a sixth of single-stream decode.
    crate::pool::column_tasks(m, n, TASK_ROWS, ROW_CHUNK, |w0, num_w, a0, num_a, tile| {
        cpu::tiles(kernel, w, w0, num_w, &acts, a0, num_a, tile)
    })
}

/// Reference: the same quantization written with basic tensor ops, then a plain f32 matmul.
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
    let wf = Tensor::from_vec(w.dequantize(), (w.rows, w.cols), x.device())?;
    Ok(xq.matmul(&wf.t()?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: usize, cols: usize, seed: u32) -> Q8Matrix {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
            .collect();
        Q8Matrix::quantize(rows, cols, &values).unwrap()
    }

    #[test]
    fn every_kernel_agrees_with_the_portable_loop_and_the_simd_ones_bit_for_bit() {
        // 7 × 5 and 9 × 11 exercise every tile shape of the 256-bit kernels (2 × 4 and the 1-row
        // and 1-column edges) and of the paired one (4 × 4 pairs, 3 weight rows, 1 to 3 pairs,
        // an odd row paired with padding).
        for (wr, ar) in [(7, 5), (9, 11)] {
            let (w, a) = (matrix(wr, 96, 1), matrix(ar, 96, 2));
            let run = |kernel: Q8Kernel| {
                let mut dst = vec![0f32; w.rows * a.rows];
                let acts = cpu::Activations::prepare(kernel, &a);
                cpu::tiles(kernel, &w, 0, w.rows, &acts, 0, a.rows, &mut dst);
                dst
            };
            let portable = run(Q8Kernel::Portable);
            assert!(
                portable.iter().any(|v| v.abs() > 1e-3),
                "non-trivial products"
            );
            let simd: Vec<(Q8Kernel, Vec<f32>)> = Q8Kernel::available()
                .iter()
                .copied()
                .filter(|&k| k != Q8Kernel::Portable)
                .map(|k| (k, run(k)))
                .collect();
            for (kernel, out) in &simd {
                for (p, b) in portable.iter().zip(out) {
                    assert!(
                        (p - b).abs() <= 1e-5 * (1.0 + p.abs()),
                        "{kernel:?}: {p} vs {b}"
                    );
                }
                assert_eq!(out, &simd[0].1, "{kernel:?} vs {:?}", simd[0].0);
            }
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_alone_as_in_a_batch_with_every_kernel() {
        // 70 rows span two row chunks (64 + 6); 300 and 301 weight rows span many tasks and a
        // short tail, the odd one with a weight row that a decode step's paired kernel pairs
        // with itself; 896 columns (28 blocks) a scale run of 16 and a short one.
        for (n, k) in [(300, 128), (301, 896)] {
            let (w, a) = (matrix(n, k, 3), matrix(70, k, 4));
            let kb = k / QK8_0;
            for &kernel in Q8Kernel::available() {
                let batch = q8_matmul_quantized(&a, &w, kernel);
                for row in [0, 1, 63, 64, 69] {
                    let one = Q8Matrix {
                        rows: 1,
                        cols: a.cols,
                        scales: a.scales[row * kb..(row + 1) * kb].to_vec(),
                        quants: a.quants[row * k..(row + 1) * k].to_vec(),
                    };
                    let alone = q8_matmul_quantized(&one, &w, kernel);
                    assert_eq!(
                        alone,
                        batch[row * n..(row + 1) * n],
                        "{kernel:?}, row {row}, [{n}, {k}]"
                    );
                }
            }
        }
    }

    #[test]
    fn a_stacked_product_is_its_parts_side_by_side() {
        let (top, bottom, a) = (matrix(5, 64, 5), matrix(3, 64, 6), matrix(16, 64, 7));
        let stacked = Q8Matrix::stack_rows(&[&top, &bottom]).unwrap();
        let kernel = Q8Kernel::best();
        let (t, b) = (
            q8_matmul_quantized(&a, &top, kernel),
            q8_matmul_quantized(&a, &bottom, kernel),
        );
        let both = q8_matmul_quantized(&a, &stacked, kernel);
        for row in 0..16 {
            assert_eq!(both[row * 8..row * 8 + 5], t[row * 5..row * 5 + 5]);
            assert_eq!(both[row * 8 + 5..row * 8 + 8], b[row * 3..row * 3 + 3]);
        }
        assert!(Q8Matrix::stack_rows(&[&top, &matrix(2, 96, 1)]).is_err());
        assert!(Q8Matrix::stack_rows(&[]).is_err());
    }

    #[test]
    fn round_half_away_is_roundf() {
        let mut x = -130.0f32;
        while x <= 130.0 {
            // Quarter steps hit every tie exactly; the neighbours straddle them.
            for v in [x, x.next_down(), x.next_up()] {
                assert_eq!(round_half_away(v), v.round() as i32, "{v}");
            }
            x += 0.25;
        }
        assert_eq!(round_half_away(-0.0), 0);
    }

    #[test]
    fn extreme_values_do_not_saturate_any_kernel() {
        // ±127 in both operands, the largest partial sums the int8 paths see (AVX2's maddubs
        // saturates at ±32,767 per pair), and a stray −128 in the file, which loads as −127.
        let cols = 64;
        let mut bytes = Vec::new();
        for row in 0..3 {
            for block in 0..cols / QK8_0 {
                bytes.extend(half::f16::from_f32(0.5).to_le_bytes());
                bytes.extend((0..QK8_0).map(|i| match (row + block + i) % 3 {
                    0 => 127u8,
                    1 => 0x80,
                    _ => 0x81,
                }));
            }
        }
        let w = Q8Matrix::from_ggml_bytes(3, cols, &bytes).unwrap();
        assert_eq!(w.quants.iter().min(), Some(&-127));
        let values: Vec<f32> = (0..2 * cols)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let a = Q8Matrix::quantize(2, cols, &values).unwrap();
        let exact: Vec<f32> = (0..w.rows)
            .flat_map(|r| {
                let (w, a) = (&w, &a);
                (0..a.rows).map(move |c| {
                    (0..cols)
                        .map(|k| {
                            let b = k / QK8_0;
                            w.scales[r * 2 + b]
                                * a.scales[c * 2 + b]
                                * (w.quants[r * cols + k] as f32 * a.quants[c * cols + k] as f32)
                        })
                        .sum::<f32>()
                })
            })
            .collect();
        for &kernel in Q8Kernel::available() {
            let mut dst = vec![0f32; w.rows * a.rows];
            let acts = cpu::Activations::prepare(kernel, &a);
            cpu::tiles(kernel, &w, 0, w.rows, &acts, 0, a.rows, &mut dst);
            for (e, d) in exact.iter().zip(&dst) {
                assert!(
                    (e - d).abs() <= 1e-3 * (1.0 + e.abs()),
                    "{kernel:?}: {e} vs {d}"
                );
            }
        }
    }
}
