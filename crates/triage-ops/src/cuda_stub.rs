//! Stands in for `cuda.rs` without the `cuda` feature: the same public API, each function
//! returning [`OpsError::NotCompiledWithCuda`], so callers need no `#[cfg]`.

use candle_core::Tensor;

use crate::paged_attention::PagedAttentionMetadata;
use crate::{OpsError, Result};

/// Settings of one `entropy_window_f32` step (see the CUDA build's documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntropyWindowParams {
    /// Escalate once the window's sum exceeds `tau · window`.
    pub tau: f32,
    /// Values the window covers; it accepts after this many.
    pub window: usize,
    /// 0 full softmax, 1 top-k renormalised, 2 top-k residual, 3 sampled NLL.
    pub estimator: u32,
    /// 0 nats, 1 bits.
    pub unit: u32,
}

/// Needs the `cuda` feature.
pub fn paged_attention_cuda(
    _q: &Tensor,
    _k_cache: &Tensor,
    _v_cache: &Tensor,
    _meta: &PagedAttentionMetadata,
) -> Result<Tensor> {
    Err(OpsError::NotCompiledWithCuda)
}

/// Needs the `cuda` feature.
pub fn entropy_window_cuda(
    _stats: &Tensor,
    _sampled_logprobs: &Tensor,
    _observe: &Tensor,
    _state: &Tensor,
    _params: &EntropyWindowParams,
) -> Result<Tensor> {
    Err(OpsError::NotCompiledWithCuda)
}
