//! The CUDA side of step graphs: pinned host staging for the step buffers, and captured CUDA
//! graphs of a decode step.
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaGraph, PinnedHostSlice};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, Layout, Tensor};

use crate::{OpsError, Result};

/// Pinned host memory a [`crate::step_graph::StepBuffer`] is written from: one asynchronous
/// copy per step, which a pageable buffer would turn into a staged, synchronous one.
pub struct HostStaging {
    pinned: Option<PinnedHostSlice<u32>>,
}

impl HostStaging {
    /// Staging for `capacity` values on a CUDA `device`; nothing on the CPU.
    pub fn new(capacity: usize, device: &candle_core::Device) -> Result<Self> {
        let candle_core::Device::Cuda(dev) = device else {
            return Ok(Self { pinned: None });
        };
        let context = dev.cuda_stream().context().clone();
        // SAFETY: the memory is left unset; `upload` writes the values it copies first, and the
        // rest (never written) is copied only into the part of the buffer no view has been given
        // values for.
        let pinned = unsafe { context.alloc_pinned::<u32>(capacity.max(1)) }.w()?;
        Ok(Self {
            pinned: Some(pinned),
        })
    }

    /// `data` into the head of `dst` (a contiguous u32 CUDA tensor of the staging's capacity),
    /// by way of the pinned memory, in one copy on candle's stream. Writing the pinned memory
    /// first waits for the previous copy from it to finish.
    pub fn upload(&mut self, data: &[u32], dst: &Tensor) -> Result<()> {
        let pinned = self.pinned.as_mut().ok_or_else(|| {
            OpsError::InvalidArgument("a CPU step buffer's staging used for a CUDA one".into())
        })?;
        let host = pinned.as_mut_slice().w()?;
        host.get_mut(..data.len())
            .ok_or_else(|| OpsError::InvalidArgument("staging smaller than the step".into()))?
            .copy_from_slice(data);
        Ok(dst.inplace_op1(&UploadPinned {
            pinned,
            len: data.len(),
        })?)
    }
}

/// The in-place copy of `len` staged values into a CUDA tensor.
struct UploadPinned<'a> {
    pinned: &'a PinnedHostSlice<u32>,
    len: usize,
}

impl candle_core::InplaceOp1 for UploadPinned<'_> {
    fn name(&self) -> &'static str {
        "step-buffer-upload"
    }

    fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("step-buffer-upload: pinned staging is for CUDA tensors")
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        let stream = storage.device().cuda_stream();
        let start = layout.start_offset();
        let slice = storage.as_cuda_slice_mut::<u32>()?;
        let capacity = self.pinned.len().min(slice.len().saturating_sub(start));
        if self.len > capacity {
            candle_core::bail!("step-buffer-upload: {} values past the buffer", self.len)
        }
        let mut dst = slice
            .try_slice_mut(start..start + capacity)
            .ok_or_else(|| candle_core::Error::msg("step-buffer-upload: buffer layout"))?;
        // The whole staging buffer goes: values past `len` are what an earlier step wrote (or
        // unset, past anything a view was given), and a fixed size keeps it one plain copy.
        stream.memcpy_htod(self.pinned, &mut dst).w()?;
        Ok(())
    }
}

/// A captured CUDA graph of one decode step.
pub struct CapturedGraph {
    graph: CudaGraph,
}

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are serialised; a
// `CapturedGraph` is owned by one engine and replayed through `&self` only from the thread that
// holds that engine (`StepGraph` is not `Sync`, so no two threads share one).
unsafe impl Send for CapturedGraph {}

impl CapturedGraph {
    /// Run `step` once eagerly with candle's upload cache on (it records the shape and stride
    /// parameters the step's kernels upload, and loads every kernel), then capture it on
    /// candle's stream. Allocations inside the capture become the graph's own; those still held
    /// at a replay are freed by the next one (`AUTO_FREE_ON_LAUNCH`).
    pub fn capture(device: &candle_core::Device, step: impl Fn() -> Result<()>) -> Result<Self> {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let dev = device.as_cuda_device()?;
        let stream = dev.cuda_stream();
        let _cache = dev.enable_cuda_graph_htod_cache();
        step()?;
        stream.synchronize().w()?;
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .w()?;
        let ran = step();
        let ended = stream.end_capture(
            sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        );
        ran?;
        let graph = ended.w()?.ok_or_else(|| {
            OpsError::InvalidArgument("the captured step launched nothing".into())
        })?;
        graph.upload().w()?;
        Ok(Self { graph })
    }

    pub fn replay(&self) -> Result<()> {
        Ok(self.graph.launch().w()?)
    }

    /// Nodes in the graph: each a kernel launch, copy, memset or allocation of the step.
    pub fn num_nodes(&self) -> Result<usize> {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let mut n = 0usize;
        // SAFETY: the graph is alive (owned by `self.graph`); a null node array asks only for
        // the count, written to `n`.
        unsafe { sys::cuGraphGetNodes(self.graph.cu_graph(), std::ptr::null_mut(), &mut n) }
            .result()
            .w()?;
        Ok(n)
    }
}
