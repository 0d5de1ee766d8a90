//! The CUDA form of the entropy window's step (`kernels/entropy_window.cu`).
#![allow(unsafe_code)]

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Storage, Tensor};

use super::EntropyWindowParams;
use crate::cuda::{c_int, config, kernel, tensor_view, Module};
use crate::launch::{self};
use crate::{OpsError, Result};

/// One step of every sequence's entropy window on the device: `stats` is the packed
/// `[n, 4 + 2k]` output of [`crate::logits_reduce_packed`], `sampled_logprobs` f32 `[n]`,
/// `observe` u32 `[n]` (0 keeps a sequence's state) and `state` f64 `[n, 4]`
/// (`[sum, num_steps, decision, at_step]`, see `kernels/entropy_window.cu`). Returns the next
/// state as a new tensor; `state` is left as it was.
pub fn entropy_window_cuda(
    stats: &Tensor,
    sampled_logprobs: &Tensor,
    observe: &Tensor,
    state: &Tensor,
    params: &EntropyWindowParams,
) -> Result<Tensor> {
    let (num_seqs, width) = stats.dims2()?;
    let k = width.checked_sub(4).map(|w| w / 2).unwrap_or(0);
    let bad = stats.dtype() != DType::F32
        || width != crate::packed_width(k)
        || sampled_logprobs.dims() != [num_seqs]
        || sampled_logprobs.dtype() != DType::F32
        || observe.dims() != [num_seqs]
        || observe.dtype() != DType::U32
        || state.dims() != [num_seqs, 4]
        || state.dtype() != DType::F64
        || params.estimator > 3
        || params.unit > 1;
    if bad {
        return Err(OpsError::InvalidArgument(format!(
            "entropy_window: stats {:?} {:?}, logprobs {:?}, observe {:?}, state {:?} {:?}, {params:?}",
            stats.dims(),
            stats.dtype(),
            sampled_logprobs.dims(),
            observe.dims(),
            state.dims(),
            state.dtype()
        )));
    }
    let dev = stats.device().as_cuda_device()?.clone();
    let mut next = dev.alloc_zeros::<f64>(num_seqs * 4)?;
    {
        let (s, l) = state.storage_and_layout();
        dev.memcpy_dtod(
            &tensor_view::<f64>(&s, l, "entropy_window state")?,
            &mut next,
        )?;
    }
    if num_seqs > 0 {
        entropy_window_launch(
            &dev,
            (stats, sampled_logprobs, observe),
            &mut next,
            k,
            params,
        )?;
    }
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(next, dev));
    Ok(Tensor::from_storage(
        storage,
        (num_seqs, 4),
        BackpropOp::none(),
        false,
    ))
}

fn entropy_window_launch(
    dev: &CudaDevice,
    (stats, logprobs, observe): (&Tensor, &Tensor, &Tensor),
    state: &mut CudaSlice<f64>,
    k: usize,
    p: &EntropyWindowParams,
) -> Result<()> {
    let num_seqs = observe.dim(0)?;
    let g = launch::entropy_window(num_seqs, launch::ENTROPY_WINDOW_THREADS)?;
    let (ss, sl) = stats.storage_and_layout();
    let (ls, ll) = logprobs.storage_and_layout();
    let (os, ol) = observe.storage_and_layout();
    let stats = tensor_view::<f32>(&ss, sl, "entropy_window stats")?;
    let logprobs = tensor_view::<f32>(&ls, ll, "entropy_window logprobs")?;
    let observe = tensor_view::<u32>(&os, ol, "entropy_window observe")?;
    let k = c_int(k, "k")?;
    let (n, window) = (c_int(num_seqs, "sequences")?, c_int(p.window, "window")?);
    let (estimator, unit) = (p.estimator as i32, p.unit as i32);
    let func = kernel(dev, Module::EntropyWindow, "entropy_window_f32")?;
    let stream = dev.cuda_stream();
    let mut builder = stream.launch_builder(&func);
    builder
        .arg(&stats)
        .arg(&k)
        .arg(&logprobs)
        .arg(&observe)
        .arg(state);
    builder
        .arg(&n)
        .arg(&p.tau)
        .arg(&window)
        .arg(&estimator)
        .arg(&unit);
    // SAFETY: the arguments match `entropy_window_f32` (kernels/README.md); thread `seq` below
    // `num_seqs` reads row `seq` of `stats` (`4 + 2k` wide), `logprobs` and `observe`, and writes
    // the four doubles of its state, all inside the buffers whose shapes were checked.
    unsafe { builder.launch(config(g)) }.w()?;
    Ok(())
}
