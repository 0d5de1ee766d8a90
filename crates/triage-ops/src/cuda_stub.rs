//! Stands in for `cuda.rs` and for the ops' CUDA forms (each op's `cuda.rs`) without the `cuda`
//! feature: the same API, each function returning [`OpsError::NotCompiledWithCuda`], so callers
//! need no `#[cfg]`. An op takes its stand-in as its `cuda` module (`use crate::cuda::<op> as
//! cuda`); ops whose CUDA forward is only reached from candle's `cuda_fwd` need none.

use candle_core::Device;

use crate::{OpsError, Result};

/// Needs the `cuda` feature.
pub fn open_device(_ordinal: usize) -> Result<Device> {
    Err(OpsError::NotCompiledWithCuda)
}

/// Needs the `cuda` feature.
pub fn memory_info(_device: &Device) -> Result<(usize, usize)> {
    Err(OpsError::NotCompiledWithCuda)
}

/// `paged_attention/cuda.rs`'s stand-ins.
pub(crate) mod paged_attention {
    use candle_core::Tensor;

    use crate::paged_attention::{DeviceRows, PrefillTiles};
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
    pub(crate) fn prefill_attention_cuda(
        _q: &Tensor,
        _k_cache: &Tensor,
        _v_cache: &Tensor,
        _rows: &DeviceRows,
        _tiles: &PrefillTiles,
    ) -> Result<Tensor> {
        Err(OpsError::NotCompiledWithCuda)
    }
}

/// `rope_and_cache/cuda.rs`'s stand-in.
pub(crate) mod rope_and_cache {
    use candle_core::Tensor;

    use crate::paged_attention::SlotMapping;
    use crate::rope_and_cache::{QkvShape, RopeInputs};
    use crate::{OpsError, Result};

    /// Needs the `cuda` feature.
    pub(crate) fn rope_and_cache_cuda(
        _x: &RopeInputs<'_>,
        _k_cache: &Tensor,
        _v_cache: &Tensor,
        _slots: &SlotMapping,
        _shape: QkvShape,
    ) -> Result<Tensor> {
        Err(OpsError::NotCompiledWithCuda)
    }
}

/// `entropy_window/cuda.rs`'s stand-in.
pub(crate) mod entropy_window {
    use candle_core::Tensor;

    use crate::entropy_window::EntropyWindowParams;
    use crate::{OpsError, Result};

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
}

/// `step_graph/cuda.rs`'s stand-ins.
pub(crate) mod step_graph {
    use candle_core::{Device, Tensor};

    use crate::{OpsError, Result};

    /// No staging without the `cuda` feature: CPU step buffers are written in place.
    #[derive(Debug)]
    pub struct HostStaging;

    impl HostStaging {
        /// Nothing on the CPU; a CUDA device needs the `cuda` feature.
        pub fn new(_capacity: usize, device: &Device) -> Result<Self> {
            match device {
                Device::Cpu => Ok(Self),
                _ => Err(OpsError::NotCompiledWithCuda),
            }
        }

        /// Needs the `cuda` feature.
        pub fn upload(&mut self, _data: &[u32], _dst: &Tensor) -> Result<()> {
            Err(OpsError::NotCompiledWithCuda)
        }
    }

    /// Needs the `cuda` feature.
    #[derive(Debug)]
    pub struct CapturedGraph;

    impl CapturedGraph {
        /// Needs the `cuda` feature.
        pub fn capture(_device: &Device, _step: impl Fn() -> Result<()>) -> Result<Self> {
            Err(OpsError::NotCompiledWithCuda)
        }

        /// Needs the `cuda` feature.
        pub fn replay(&self) -> Result<()> {
            Err(OpsError::NotCompiledWithCuda)
        }

        /// Needs the `cuda` feature.
        pub fn num_nodes(&self) -> Result<usize> {
            Err(OpsError::NotCompiledWithCuda)
        }
    }
}
