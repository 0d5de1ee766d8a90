//! CUDA plumbing the ops' CUDA forms share: opening a device, the PTX that `build.rs` compiled
//! from `kernels/` (loaded once per device), launch settings from [`crate::launch`]'s geometry,
//! and views of device buffers. Each op's CUDA forward lives next to its CPU forward
//! (`paged_attention/cuda.rs`, ...) and launches on candle's own stream.
//!
//! Compiled only with the `cuda` feature; `cuda_stub.rs` stands in for this module and for the
//! ops' CUDA forms without it. Every kernel argument is a contiguous device buffer: the callers
//! check shapes and bounds on the host first, since a kernel cannot report an error, only write
//! out of bounds.
#![allow(unsafe_code)]

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaSlice, CudaView, LaunchConfig};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Layout, Shape, Storage, Tensor};

use crate::launch::LaunchGeometry;
use crate::{OpsError, Result};

/// One `.cu` file of `kernels/`, compiled to PTX by `build.rs`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Module {
    LogitsReduce,
    EntropyWindow,
    ReshapeAndCache,
    PagedAttention,
    RmsNorm,
    SiluMul,
    RopeAndCache,
    PrefillAttention,
}

impl Module {
    /// Key of the loaded module in candle's per-device table (shared with other crates, hence
    /// the prefix).
    fn key(self) -> &'static str {
        match self {
            Self::LogitsReduce => "triage_ops/logits_reduce",
            Self::EntropyWindow => "triage_ops/entropy_window",
            Self::ReshapeAndCache => "triage_ops/reshape_and_cache",
            Self::PagedAttention => "triage_ops/paged_attention",
            Self::RmsNorm => "triage_ops/rms_norm",
            Self::SiluMul => "triage_ops/silu_mul",
            Self::RopeAndCache => "triage_ops/rope_and_cache",
            Self::PrefillAttention => "triage_ops/prefill_attention",
        }
    }

    fn ptx(self) -> &'static str {
        match self {
            Self::LogitsReduce => include_str!(concat!(env!("OUT_DIR"), "/logits_reduce.ptx")),
            Self::EntropyWindow => include_str!(concat!(env!("OUT_DIR"), "/entropy_window.ptx")),
            Self::ReshapeAndCache => {
                include_str!(concat!(env!("OUT_DIR"), "/reshape_and_cache.ptx"))
            }
            Self::PagedAttention => include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx")),
            Self::RmsNorm => include_str!(concat!(env!("OUT_DIR"), "/rms_norm.ptx")),
            Self::SiluMul => include_str!(concat!(env!("OUT_DIR"), "/silu_mul.ptx")),
            Self::RopeAndCache => include_str!(concat!(env!("OUT_DIR"), "/rope_and_cache.ptx")),
            Self::PrefillAttention => {
                include_str!(concat!(env!("OUT_DIR"), "/prefill_attention.ptx"))
            }
        }
    }
}

/// A kernel of `module`. Candle keeps the loaded module in the device's table, so the PTX is
/// JIT-compiled once per device and process; launches go on `dev.cuda_stream()`, the stream
/// candle's own kernels and copies use, never the default stream.
pub(crate) fn kernel(
    dev: &CudaDevice,
    module: Module,
    name: &str,
) -> candle_core::Result<CudaFunction> {
    let func = dev.get_or_load_custom_func(name, module.key(), module.ptx())?;
    Ok(func.into_cuda_function())
}

pub(crate) fn config(g: LaunchGeometry) -> LaunchConfig {
    LaunchConfig {
        grid_dim: g.grid,
        block_dim: g.block,
        shared_mem_bytes: g.shared_mem_bytes,
    }
}

/// A size as the kernels' `int`.
pub(crate) fn c_int(n: usize, what: &str) -> candle_core::Result<i32> {
    i32::try_from(n).map_err(|_| candle_core::Error::msg(format!("{what} {n} exceeds a C int")))
}

pub(crate) fn wrap(e: OpsError) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// `len` elements of `slice` from `start`, or an error (cudarc's `slice` would panic).
pub(crate) fn view<T>(
    slice: &CudaSlice<T>,
    start: usize,
    len: usize,
) -> candle_core::Result<CudaView<'_, T>> {
    slice.try_slice(start..start + len).ok_or_else(|| {
        candle_core::Error::msg(format!("{start}+{len} past a {} slice", slice.len()))
    })
}

/// The device buffer of a contiguous CUDA tensor's storage, from its layout's start offset.
pub(crate) fn tensor_view<'a, T: CudaDType>(
    storage: &'a Storage,
    layout: &Layout,
    what: &str,
) -> candle_core::Result<CudaView<'a, T>> {
    let Storage::Cuda(storage) = storage else {
        candle_core::bail!("{what}: expected a CUDA tensor")
    };
    if !layout.is_contiguous() {
        candle_core::bail!("{what}: expected a contiguous tensor")
    }
    view(
        storage.as_cuda_slice::<T>()?,
        layout.start_offset(),
        layout.shape().elem_count(),
    )
}

/// A fresh f32 tensor on `dev` owning `slice`.
pub(crate) fn f32_tensor(
    slice: CudaSlice<f32>,
    dev: &CudaDevice,
    shape: impl Into<Shape>,
) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()));
    Tensor::from_storage(storage, shape, BackpropOp::none(), false)
}

// ---------------------------------------------------------------------------------------------
// devices

/// CUDA device `ordinal`, with candle's own stream (the one every kernel here launches on).
/// Opened once per process and ordinal: every later call returns the same device (a cheap
/// clone), so the models that share a GPU share one candle device, one stream and one table of
/// loaded kernels, and their tensors count as on the same device.
pub fn open_device(ordinal: usize) -> Result<candle_core::Device> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static OPENED: OnceLock<Mutex<HashMap<usize, candle_core::Device>>> = OnceLock::new();
    let opened = OPENED.get_or_init(|| Mutex::new(HashMap::new()));
    // A poisoned lock only means another thread panicked while opening; the map is still valid.
    let mut opened = opened.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(device) = opened.get(&ordinal) {
        return Ok(device.clone());
    }
    let device = candle_core::Device::new_cuda(ordinal)?;
    prepare_device(device.as_cuda_device()?)?;
    opened.insert(ordinal, device.clone());
    Ok(device)
}

/// Settings made once, before any tensor exists on the device:
/// - cudarc's per-slice event tracking is turned off. Candle makes its device in multi-stream
///   mode, so every read and write of a slice would record and wait on events, which costs host
///   time each launch and cannot be captured in a graph. Triage runs every kernel, copy and
///   cuBLAS call on candle's one stream of the device, so stream order already orders them.
/// - The stream-ordered memory pool keeps what it has allocated (release threshold at its
///   maximum) instead of handing it back at each synchronisation, so eager steps and graph
///   captures reuse the same memory rather than asking the driver again every step.
///
/// Both cut host time per step: eager decode on the H200 was bound by launches, not bytes
/// (12.5 ms a token against about 0.7 ms to read the 1.5B's bf16 weights; benches/RESULTS.md,
/// "The first H200 run"). CUDA graphs (`step_graph`) and the models' fused pass exist for that.
fn prepare_device(dev: &CudaDevice) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    // SAFETY: no tensor has been made on this device yet (it was just opened), and triage creates
    // no second stream: candle's stream is the only one its slices are used on.
    unsafe { dev.disable_event_tracking() };
    let stream = dev.cuda_stream();
    let cu_device = stream.context().cu_device();
    stream.context().bind_to_thread().w()?;
    // SAFETY: `cu_device` is the context's own device; the attribute takes a pointer to a u64.
    unsafe {
        let pool = result::device::get_mem_pool(cu_device).w()?;
        let mut keep_all = u64::MAX;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep_all as *mut u64).cast(),
        )
        .result()
        .w()?;
    }
    Ok(())
}

/// `(free, total)` bytes of `device`'s memory now (the driver's `cuMemGetInfo`).
pub fn memory_info(device: &candle_core::Device) -> Result<(usize, usize)> {
    let dev = device.as_cuda_device()?;
    Ok(dev.cuda_stream().context().mem_get_info().w()?)
}
