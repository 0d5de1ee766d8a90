//! Layers that hide the weight format: a `Linear` holds quantized blocks, a dense matrix, or both,
//! and picks per call the form that is fastest for the number of rows.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{DType, Device, Module, Tensor};
use triage_ops::{kquant_matmul, q8_matmul, KQuantMatrix, Q8Matrix};

use crate::config::{RopeScaling, RopeStyle};
use crate::fused_linear::FusedLinear;
use crate::weights::{PackedMatrix, Weight};
use crate::Result;

/// Row count from which a layer that keeps a dense f32 copy (`DenseLayout::dense_copy`, off by
/// default) uses it instead of its quantized blocks: below it the int8 kernels read a quarter of
/// the bytes (decode, batched decode). With VNNI the int8 kernels also match or beat the f32
/// GEMM above it (`triage-ops/benches/ops_q8_matmul.rs`, `ops_kquant_matmul.rs`).
pub const Q8_MAX_ROWS: usize = 64;

/// How a `Linear` keeps dense matrices: their dtype (f32 on CPU, bf16 on a GPU, where f32
/// copies would double the weights' memory) and whether quantized blocks also get an f32 copy
/// for multi-row products (CPU prefill only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseLayout {
    pub dtype: DType,
    pub dense_copy: bool,
}

impl DenseLayout {
    /// f32 matrices and no dense copy of quantized blocks.
    #[cfg(test)]
    pub const F32: DenseLayout = DenseLayout {
        dtype: DType::F32,
        dense_copy: false,
    };
}

/// `x` (f32) times `wᵀ` in `w`'s dtype: a bf16 matrix multiplies bf16 activations (the tensor
/// cores' input). The product comes back in `x`'s dtype (the residual stream stays f32), or in
/// `w`'s when `keep_weight_dtype` (the LM head's logits).
fn dense_matmul(x: &Tensor, w: &Tensor, keep_weight_dtype: bool) -> Result<Tensor> {
    if w.dtype() == x.dtype() {
        return Ok(x.matmul(&w.t()?)?);
    }
    let y = x.to_dtype(w.dtype())?.matmul(&w.t()?)?;
    match keep_weight_dtype {
        true => Ok(y),
        false => Ok(y.to_dtype(x.dtype())?),
    }
}

/// A linear layer `y = x Wᵀ + b` over rows of `x` (`[num_tokens, in]`).
#[derive(Debug, Clone)]
pub struct Linear {
    /// Q8_0 weights on CPU, for triage's batch-invariant int8 kernel.
    q8: Option<Arc<Q8Matrix>>,
    /// Q4_K and Q6_K weights on CPU, packed for triage's batch-invariant K-quant kernel.
    kquant: Option<Arc<KQuantMatrix>>,
    /// Other block-quantized weights (or any off CPU), through candle.
    quantized: Option<QMatMul>,
    dense: Option<Tensor>,
    bias: Option<Tensor>,
}

impl Linear {
    /// Build from a stored weight. A quantized weight keeps its blocks for decode and, when
    /// `layout.dense_copy` is set, also an f32 copy for multi-row (prefill) products; a dense
    /// weight is stored in `layout.dtype`.
    pub fn new(
        weight: Weight,
        bias: Option<Tensor>,
        layout: DenseLayout,
        device: &Device,
    ) -> Result<Self> {
        let (mut q8, mut kquant, mut quantized, mut dense) = (None, None, None, None);
        let packed = match weight {
            Weight::Quantized(q) if is_block_quantized(q.dtype()) => {
                let (rows, cols) = q.shape().dims2()?;
                let packed = match device.is_cpu() {
                    true => PackedMatrix::from_ggml(q.dtype(), rows, cols, &q.data()?)?,
                    false => None,
                };
                if packed.is_none() {
                    if layout.dense_copy {
                        dense = Some(q.dequantize(device)?);
                    }
                    quantized = Some(QMatMul::from_arc(q)?);
                }
                packed
            }
            Weight::Packed(p) => Some(p),
            other => {
                dense = Some(other.to_dense(device, layout.dtype)?);
                None
            }
        };
        if let Some(p) = packed {
            if layout.dense_copy {
                dense = Some(p.dequantize(device)?);
            }
            match p {
                PackedMatrix::Q8(m) => q8 = Some(m),
                PackedMatrix::KQuant(m) => kquant = Some(m),
            }
        }
        Ok(Self {
            q8,
            kquant,
            quantized,
            dense,
            bias,
        })
    }

    /// Hands over the Q8_0 weights (to a `FusedLinear` that stacks them); the layer keeps its
    /// dense copy and bias.
    pub(crate) fn take_q8(&mut self) -> Option<Arc<Q8Matrix>> {
        self.q8.take()
    }

    pub(crate) fn has_q8(&self) -> bool {
        self.q8.is_some()
    }

    /// Hands over the K-quant weights, as `take_q8`.
    pub(crate) fn take_kquant(&mut self) -> Option<Arc<KQuantMatrix>> {
        self.kquant.take()
    }

    pub(crate) fn kquant(&self) -> Option<&KQuantMatrix> {
        self.kquant.as_deref()
    }

    pub(crate) fn has_dense(&self) -> bool {
        self.dense.is_some()
    }

    /// The dense matrix of a layer that has nothing else (no quantized blocks): what a stack of
    /// bf16 or f16 matrices is made from.
    pub(crate) fn plain_dense(&self) -> Option<&Tensor> {
        let quantized = self.q8.is_some() || self.kquant.is_some() || self.quantized.is_some();
        self.dense.as_ref().filter(|_| !quantized)
    }

    /// The dtype of a plain dense matrix (no quantized blocks beside it).
    pub(crate) fn dense_dtype(&self) -> Option<DType> {
        self.plain_dense().map(Tensor::dtype)
    }

    /// Hands over the dense matrix (to a `FusedLinear` that stacks it).
    pub(crate) fn take_dense(&mut self) -> Option<Tensor> {
        self.dense.take()
    }

    pub(crate) fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Output features.
    pub fn out_features(&self) -> Result<usize> {
        if let Some(k) = &self.kquant {
            return Ok(k.rows());
        }
        match (&self.q8, &self.dense, &self.quantized) {
            (Some(q), _, _) => Ok(q.rows()),
            (None, Some(d), _) => Ok(d.dim(0)?),
            (None, None, Some(QMatMul::QTensor(q))) => Ok(q.shape().dims()[0]),
            (None, None, Some(QMatMul::Tensor(t) | QMatMul::TensorF16(t))) => Ok(t.dim(0)?),
            (None, None, None) => Err(crate::ModelError::Invalid(
                "linear layer without weight".into(),
            )),
        }
    }

    /// `x`: `[rows, in]` f32 → `[rows, out]` f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.product(x, false)
    }

    /// [`Self::forward`], a dense product left in the weight's dtype (bf16 on a GPU) instead of
    /// converted back to f32: the LM head's, so the logits reduction reads half the bytes. See
    /// [`Self::output_dtype`].
    pub fn forward_in_weight_dtype(&self, x: &Tensor) -> Result<Tensor> {
        self.product(x, true)
    }

    /// What [`Self::forward_in_weight_dtype`] returns for f32 input: the dense matrix's dtype
    /// for a dense layer, f32 for quantized blocks (their kernels write f32).
    pub fn output_dtype(&self) -> DType {
        let quantized = self.q8.is_some() || self.kquant.is_some() || self.quantized.is_some();
        match (&self.dense, quantized) {
            (Some(w), false) => w.dtype(),
            _ => DType::F32,
        }
    }

    fn product(&self, x: &Tensor, keep: bool) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let quantized = self.q8.is_some() || self.kquant.is_some() || self.quantized.is_some();
        let y = match (&self.dense, &self.q8, &self.kquant, &self.quantized) {
            // A dense copy of quantized blocks is f32 (CPU prefill): `keep` changes nothing.
            (Some(w), ..) if quantized && rows >= Q8_MAX_ROWS => dense_matmul(x, w, false)?,
            (_, Some(q), _, _) => q8_matmul(x, q)?,
            (_, None, Some(k), _) => kquant_matmul(x, k)?,
            (_, None, None, Some(q)) => q.forward(x)?,
            (Some(w), None, None, None) => dense_matmul(x, w, keep)?,
            (None, None, None, None) => {
                return Err(crate::ModelError::Invalid(
                    "linear layer without weight".into(),
                ))
            }
        };
        match &self.bias {
            Some(b) => Ok(y.broadcast_add(b)?),
            None => Ok(y),
        }
    }
}

/// RMS normalisation over the last dimension.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Weight, eps: f64, device: &Device) -> Result<Self> {
        Ok(Self {
            weight: weight.to_dense_f32(device)?,
            eps: eps as f32,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }

    /// The norm of f32 `x` in `dtype` (the next GEMM's input), one kernel.
    pub fn forward_to(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        Ok(triage_ops::rms_norm_to(x, &self.weight, self.eps, dtype)?)
    }

    /// `residual += delta` in place, then the norm of it in `delta`'s dtype, one kernel.
    pub fn add_forward(&self, residual: &Tensor, delta: &Tensor) -> Result<Tensor> {
        Ok(triage_ops::add_rms_norm(
            residual,
            delta,
            &self.weight,
            self.eps,
        )?)
    }
}

/// Token embedding table, quantized rows dequantized on lookup, dense ones kept in the layout's
/// dtype; lookups return f32.
#[derive(Debug, Clone)]
pub struct Embedding {
    weight: Weight,
    hidden_size: usize,
}

impl Embedding {
    pub fn new(weight: Weight, dtype: DType, device: &Device) -> Result<Self> {
        let weight = match weight {
            Weight::Quantized(q) if is_block_quantized(q.dtype()) => Weight::Quantized(q),
            Weight::Packed(p) => Weight::Packed(p),
            other => Weight::Dense(other.to_dense(device, dtype)?),
        };
        let dims = weight.dims();
        let hidden_size = dims.get(1).copied().ok_or_else(|| {
            crate::ModelError::Invalid(format!("embedding must be 2-D, got {dims:?}"))
        })?;
        Ok(Self {
            weight,
            hidden_size,
        })
    }

    /// Rows of the table (the vocabulary size).
    pub fn vocab_size(&self) -> usize {
        self.weight.dims()[0]
    }

    /// The stored weight (shared with a tied LM head).
    pub fn weight(&self) -> &Weight {
        &self.weight
    }

    /// `ids`: `[n]` u32 → `[n, hidden]` f32.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let out = match &self.weight {
            Weight::Quantized(q) => q.embedding(ids)?,
            Weight::Dense(t) => t.embedding(ids)?,
            Weight::Packed(p) => p.rows(&ids.to_vec1::<u32>()?)?,
        };
        Ok(out
            .reshape((ids.dim(0)?, self.hidden_size))?
            .to_dtype(DType::F32)?)
    }
}

/// Precomputed rotary tables for positions `0..max_positions`.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    cos: Tensor,
    sin: Tensor,
    style: RopeStyle,
}

impl RotaryEmbedding {
    pub fn new(
        head_dim: usize,
        max_positions: usize,
        theta: f32,
        style: RopeStyle,
        scaling: &RopeScaling,
        device: &Device,
    ) -> Result<Self> {
        let half = head_dim / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32))
            .collect();
        scaling.apply(&mut inv_freq)?;
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let positions = Tensor::arange(0u32, max_positions as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((max_positions, 1))?;
        let freqs = positions.broadcast_mul(&inv_freq)?;
        Ok(Self {
            cos: freqs.cos()?,
            sin: freqs.sin()?,
            style,
        })
    }

    /// The rows of the tables at `positions` (`[n]` u32), gathered once for a forward pass and
    /// applied by every layer (two gathers a step instead of four a layer).
    pub fn at(&self, positions: &Tensor) -> Result<RopeAt> {
        Ok(RopeAt {
            cos: self.cos.index_select(positions, 0)?,
            sin: self.sin.index_select(positions, 0)?,
            style: self.style,
        })
    }
}

/// The rotary tables of one forward pass's positions (`[n, head_dim / 2]` each).
#[derive(Debug, Clone)]
pub struct RopeAt {
    cos: Tensor,
    sin: Tensor,
    style: RopeStyle,
}

impl RopeAt {
    /// The tables in `dtype` (what rotating activations of that dtype takes), converted once
    /// for the pass.
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            cos: self.cos.to_dtype(dtype)?,
            sin: self.sin.to_dtype(dtype)?,
            style: self.style,
        })
    }

    /// The tables, `[n, head_dim / 2]` each.
    pub fn cos(&self) -> &Tensor {
        &self.cos
    }

    pub fn sin(&self) -> &Tensor {
        &self.sin
    }

    /// Whether rope pairs element `i` with `i + head_dim / 2` (else `2i` with `2i + 1`).
    pub fn is_neox(&self) -> bool {
        self.style == RopeStyle::Neox
    }

    /// Rotate `x`: `[1, heads, n, head_dim]`, row `i` at the pass's `i`-th position.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        Ok(match self.style {
            RopeStyle::Neox => candle_nn::rotary_emb::rope(&x, &self.cos, &self.sin)?,
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &self.cos, &self.sin)?,
        })
    }
}

/// SiLU-gated feed-forward block.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Gate and up projections, in that order.
    pub gate_up: FusedLinear,
    pub down: Linear,
}

impl Mlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [gate, up]: [Tensor; 2] =
            self.gate_up.forward(x)?.try_into().map_err(|_| {
                crate::ModelError::Invalid("the MLP's gate_up has two parts".into())
            })?;
        self.down.forward(&(candle_nn::ops::silu(&gate)? * up)?)
    }
}

/// Whether a GGUF type stores quantized blocks (as opposed to plain F32/F16/BF16 values).
pub fn is_block_quantized(dtype: GgmlDType) -> bool {
    !matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}
