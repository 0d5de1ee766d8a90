//! The CUDA forms of `add_rms_norm` and `rms_norm_to` (`kernels/rms_norm.cu`).
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Storage, Tensor, WithDType};

use crate::cuda::{c_int, config, kernel, view, wrap, Module};
use crate::launch::{self, LaunchGeometry};

/// The residual argument of `add_rms_norm_<dtype>`: written with a delta, only read without.
enum Residual<'a> {
    Write(candle_core::cuda_backend::cudarc::driver::CudaViewMut<'a, f32>),
    Read(CudaView<'a, f32>),
}

/// `add_rms_norm_<dtype>` over `residual` (`[rows, hidden]` f32, updated in place when `delta`
/// is given) into a new `[rows, hidden]` tensor of `dtype`. Shapes were checked by the caller.
pub(crate) fn add_rms_norm_fwd(
    residual: &mut CudaStorage,
    rl: &Layout,
    delta: (&CudaStorage, &Layout),
    weight: &CudaStorage,
    wl: &Layout,
    eps: f32,
    dtype: DType,
) -> candle_core::Result<Tensor> {
    let dev = residual.device().clone();
    let (start, len) = (rl.start_offset(), rl.shape().elem_count());
    let x = residual
        .as_cuda_slice_mut::<f32>()?
        .try_slice_mut(start..start + len)
        .ok_or_else(|| candle_core::Error::msg("add_rms_norm: residual layout"))?;
    let (slice, shape) = norm_launch(
        &dev,
        Residual::Write(x),
        Some(delta),
        (weight, wl),
        eps,
        dtype,
    )?;
    Ok(tensor_of_storage(slice, shape))
}

/// `rms_norm_to` on CUDA: the kernel without a delta, the rows only read.
pub(crate) fn rms_norm_fwd(
    x: &CudaStorage,
    xl: &Layout,
    weight: &CudaStorage,
    wl: &Layout,
    eps: f32,
    dtype: DType,
) -> candle_core::Result<CudaStorage> {
    let dev = x.device().clone();
    let x = view(
        x.as_cuda_slice::<f32>()?,
        xl.start_offset(),
        xl.shape().elem_count(),
    )?;
    Ok(norm_launch(&dev, Residual::Read(x), None, (weight, wl), eps, dtype)?.0)
}

/// One `add_rms_norm_<dtype>` launch: the output's storage and shape.
fn norm_launch(
    dev: &CudaDevice,
    residual: Residual<'_>,
    delta: Option<(&CudaStorage, &Layout)>,
    (weight, wl): (&CudaStorage, &Layout),
    eps: f32,
    dtype: DType,
) -> candle_core::Result<(CudaStorage, (usize, usize))> {
    let hidden = wl.shape().elem_count();
    let len = match &residual {
        Residual::Write(x) => x.len(),
        Residual::Read(x) => x.len(),
    };
    let rows = len / hidden.max(1);
    let args = NormArgs {
        hidden: c_int(hidden, "hidden size")?,
        eps,
        g: launch::rms_norm(rows, launch::RMS_NORM_THREADS).map_err(wrap)?,
        w: view(weight.as_cuda_slice::<f32>()?, wl.start_offset(), hidden)?,
    };
    let out = match dtype {
        DType::F32 => args.run::<f32>(dev, residual, delta, len)?,
        DType::F16 => args.run::<half::f16>(dev, residual, delta, len)?,
        DType::BF16 => args.run::<half::bf16>(dev, residual, delta, len)?,
        other => candle_core::bail!("add_rms_norm: {other:?} output"),
    };
    Ok((out, (rows, hidden)))
}

fn tensor_of_storage(storage: CudaStorage, shape: (usize, usize)) -> Tensor {
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// The sizes and weights of one `add_rms_norm` launch.
struct NormArgs<'a> {
    hidden: i32,
    eps: f32,
    g: LaunchGeometry,
    w: CudaView<'a, f32>,
}

impl NormArgs<'_> {
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        dev: &CudaDevice,
        mut residual: Residual<'_>,
        delta: Option<(&CudaStorage, &Layout)>,
        len: usize,
    ) -> candle_core::Result<CudaStorage> {
        // SAFETY: left unset: block r writes every element of output row r.
        let mut out = unsafe { dev.alloc::<T>(len) }?;
        let delta = match delta {
            Some((d, dl)) => Some(view(d.as_cuda_slice::<T>()?, dl.start_offset(), len)?),
            None => None,
        };
        let null = 0u64;
        let func = kernel(
            dev,
            Module::RmsNorm,
            &format!("add_rms_norm_{}", T::DTYPE.as_str()),
        )?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        match &mut residual {
            Residual::Write(x) => builder.arg(x),
            Residual::Read(x) => builder.arg(&*x),
        };
        match &delta {
            Some(d) => builder.arg(d),
            None => builder.arg(&null),
        };
        builder
            .arg(&self.w)
            .arg(&mut out)
            .arg(&self.hidden)
            .arg(&self.eps);
        // SAFETY: the arguments match `add_rms_norm_<dtype>(float*, const T*, const float*, T*,
        // int, float)`; block r reads row r of the residual and, with a delta (same length),
        // reads its row r and writes the residual's; with a null delta the residual, passed
        // through a read-only view, is never written. It reads the `hidden` weights and writes
        // row r of `out`.
        unsafe { builder.launch(config(self.g)) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}
