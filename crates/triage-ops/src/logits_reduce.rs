//! Fused logits reduction: one pass over each row of `[batch, vocab]` logits gives max,
//! log-sum-exp, Shannon entropy (nats), argmax and the top-k token ids with their logprobs.
//!
//! The op is a candle [`CustomOp1`] whose output is one packed f32 tensor, so that a CUDA kernel
//! can later return exactly the same thing; [`logits_reduce`] unpacks it on the host.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor, D};

use crate::{OpsError, Result};

/// The largest `k` the fused reduction supports (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_K: usize = 20;

/// Largest vocabulary whose token ids are exact as f32 in the packed output (2^24).
pub const MAX_PACKED_VOCAB: usize = 1 << 24;

/// Per-row statistics of the raw model distribution `softmax(logits)`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitsStats {
    /// Largest logit.
    pub max: f32,
    /// `log(sum(exp(logits)))`.
    pub log_sum_exp: f32,
    /// Shannon entropy of `softmax(logits)` in nats.
    pub entropy: f32,
    /// Index of the largest logit (lowest index on ties).
    pub argmax: u32,
    /// The `k` most likely token ids with their logprobs, most likely first (lower id first on ties).
    pub top_k: Vec<(u32, f32)>,
}

impl LogitsStats {
    /// Unpacks the `[batch, 4 + 2k]` output of [`logits_reduce_packed`] (any device).
    pub fn from_packed_rows(packed: &Tensor, k: usize) -> Result<Vec<Self>> {
        let (_, width) = packed.dims2()?;
        if k > MAX_TOP_K || width != packed_width(k) {
            return Err(OpsError::InvalidArgument(format!(
                "packed logits stats of width {width} do not hold k = {k}"
            )));
        }
        let rows = packed.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        Ok(rows
            .iter()
            .map(|row| Self::from_packed_row(row, k))
            .collect())
    }

    fn from_packed_row(row: &[f32], k: usize) -> Self {
        let (ids, logprobs) = row[4..].split_at(k);
        Self {
            max: row[0],
            log_sum_exp: row[1],
            entropy: row[2],
            argmax: row[3] as u32,
            top_k: ids
                .iter()
                .map(|&id| id as u32)
                .zip(logprobs.iter().copied())
                .collect(),
        }
    }
}

/// Columns of one row of the packed output: `[max, lse, entropy, argmax, k ids, k logprobs]`.
pub fn packed_width(k: usize) -> usize {
    4 + 2 * k
}

/// The fused reduction as a candle op. Input: contiguous `[batch, vocab]` or `[vocab]` logits in
/// f32, f16 or bf16. Output: f32 `[batch, 4 + 2k]` laid out as
/// `[max, lse, entropy, argmax, k ids, k logprobs]`; ids are exact because `vocab <= 2^24`.
#[derive(Debug, Clone, Copy)]
pub struct FusedLogitsReduce {
    /// Number of top tokens per row, at most [`MAX_TOP_K`].
    pub k: usize,
}

impl CustomOp1 for FusedLogitsReduce {
    fn name(&self) -> &'static str {
        "fused-logits-reduce"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        use candle_core::backend::BackendStorage;

        let (num_rows, vocab) =
            check_args(layout.dims(), self.k).map_err(candle_core::Error::wrap)?;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{}: input has to be contiguous", self.name())
        };
        let k = self.k;
        let packed = match storage {
            CpuStorage::F32(xs) => cpu::reduce_rows(&xs[start..end], vocab, k),
            CpuStorage::F16(xs) => cpu::reduce_rows(&xs[start..end], vocab, k),
            CpuStorage::BF16(xs) => cpu::reduce_rows(&xs[start..end], vocab, k),
            other => candle_core::bail!("{}: unsupported dtype {:?}", self.name(), other.dtype()),
        };
        Ok((
            CpuStorage::F32(packed),
            Shape::from((num_rows, packed_width(k))),
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (num_rows, vocab) =
            check_args(layout.dims(), self.k).map_err(candle_core::Error::wrap)?;
        if !layout.is_contiguous() {
            candle_core::bail!("{}: input has to be contiguous", self.name())
        }
        let packed = cuda::logits_reduce_fwd(storage, layout, num_rows, vocab, self.k)?;
        Ok((packed, Shape::from((num_rows, packed_width(self.k)))))
    }
}

/// Fused reduction into the packed `[batch, 4 + 2k]` f32 tensor of [`FusedLogitsReduce`].
pub fn logits_reduce_packed(logits: &Tensor, k: usize) -> Result<Tensor> {
    check_args(logits.dims(), k)?;
    check_dtype(logits.dtype())?;
    let logits = logits.contiguous()?;
    Ok(logits.apply_op1_no_bwd(&FusedLogitsReduce { k })?)
}

/// Fused reduction: one pass over each row of `[batch, vocab]` (or `[vocab]`) logits.
///
/// Logits may be `-inf` (masked tokens); a NaN logit counts as `-inf`. A row with no finite
/// logit gives `max = lse = -inf`, argmax 0, the lowest ids as its top-k, NaN entropy and NaN
/// logprobs. `+inf` logits are not supported. Errors with
/// [`OpsError::InvalidArgument`] for a rank other than 1 or 2, a vocabulary outside
/// `1..=2^24`, `k > min(vocab, MAX_TOP_K)` or a dtype other than f32, f16 and bf16.
pub fn logits_reduce(logits: &Tensor, k: usize) -> Result<Vec<LogitsStats>> {
    LogitsStats::from_packed_rows(&logits_reduce_packed(logits, k)?, k)
}

/// Naive reference from basic tensor ops in f32; the top-k comes from sorting each row on the host.
pub fn logits_reduce_slow(logits: &Tensor, k: usize) -> Result<Vec<LogitsStats>> {
    check_args(logits.dims(), k)?;
    check_dtype(logits.dtype())?;
    let xs = logits.to_dtype(DType::F32)?;
    let xs = if xs.rank() == 1 { xs.unsqueeze(0)? } else { xs };
    let max = xs.max_keepdim(D::Minus1)?;
    let shifted = xs.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let lse = (&max + &log_sum)?;
    // `(x - max) - log_sum` rather than `x - lse`: near ±3e38 the ulp of lse is ~1e31.
    let logprobs = shifted.broadcast_sub(&log_sum)?;
    let probs = logprobs.exp()?;
    // p·log p is 0 where p underflows to 0, but the tensor product would be 0·(-inf) = NaN.
    let plogp = probs
        .gt(0.0)?
        .where_cond(&(&probs * &logprobs)?, &probs.zeros_like()?)?;
    let entropy = plogp.sum(D::Minus1)?.neg()?;
    let (max, lse, entropy) = (
        max.squeeze(D::Minus1)?.to_vec1::<f32>()?,
        lse.squeeze(D::Minus1)?.to_vec1::<f32>()?,
        entropy.to_vec1::<f32>()?,
    );
    let rows = xs.to_vec2::<f32>()?;
    let logprobs = logprobs.to_vec2::<f32>()?;
    Ok((0..rows.len())
        .map(|row_idx| LogitsStats {
            max: max[row_idx],
            log_sum_exp: lse[row_idx],
            entropy: entropy[row_idx],
            argmax: first_index_of(&rows[row_idx], max[row_idx]),
            top_k: top_k_by_sorting(&rows[row_idx], &logprobs[row_idx], k),
        })
        .collect())
}

/// The lowest column holding `max` (0 when none does: a row of NaN). Not candle's `argmax`,
/// whose CUDA kernel returns any of several equal maxima.
fn first_index_of(row: &[f32], max: f32) -> u32 {
    row.iter().position(|&x| x == max).unwrap_or(0) as u32
}

/// Sorted by logit, not logprob: distinct logits can round to equal logprobs.
fn top_k_by_sorting(row: &[f32], logprobs: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    ids.iter()
        .take(k)
        .map(|&id| (id, logprobs[id as usize]))
        .collect()
}

/// `(num_rows, vocab)` for valid arguments.
fn check_args(dims: &[usize], k: usize) -> Result<(usize, usize)> {
    let (num_rows, vocab) = match *dims {
        [vocab] => (1, vocab),
        [num_rows, vocab] => (num_rows, vocab),
        _ => {
            return Err(OpsError::InvalidArgument(format!(
                "logits must be [batch, vocab] or [vocab], got shape {dims:?}"
            )))
        }
    };
    if vocab == 0 || vocab > MAX_PACKED_VOCAB {
        return Err(OpsError::InvalidArgument(format!(
            "vocab size {vocab} is outside 1..={MAX_PACKED_VOCAB}"
        )));
    }
    if k > MAX_TOP_K || k > vocab {
        return Err(OpsError::InvalidArgument(format!(
            "top-k {k} exceeds min(vocab {vocab}, {MAX_TOP_K})"
        )));
    }
    Ok((num_rows, vocab))
}

fn check_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        other => Err(OpsError::InvalidArgument(format!(
            "logits must be f32, f16 or bf16, got {other:?}"
        ))),
    }
}
