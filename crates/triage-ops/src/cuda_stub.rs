//! Stands in for `cuda.rs` without the `cuda` feature: the same public API, each function
//! returning [`OpsError::NotCompiledWithCuda`], so callers need no `#[cfg]`.

use candle_core::{Device, Tensor};

use crate::entropy_window::EntropyWindowParams;
use crate::paged_attention::DeviceRows;
use crate::{OpsError, Result};

/// Needs the `cuda` feature.
pub(crate) fn paged_attention_cuda(
    _q: &Tensor,
    _k_cache: &Tensor,
    _v_cache: &Tensor,
    _rows: &DeviceRows,
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

/// Needs the `cuda` feature.
pub fn open_device(_ordinal: usize) -> Result<Device> {
    Err(OpsError::NotCompiledWithCuda)
}

/// Needs the `cuda` feature.
pub fn memory_info(_device: &Device) -> Result<(usize, usize)> {
    Err(OpsError::NotCompiledWithCuda)
}
