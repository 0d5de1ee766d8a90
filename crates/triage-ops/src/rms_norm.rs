//! RMS normalisation with the residual add before it, in one pass per row: `add_rms_norm` adds a
//! layer's output (`delta`, in the activations' dtype) to the f32 residual stream in place and
//! returns `rmsnorm(residual) · w` in `delta`'s dtype, ready for the next GEMM; `rms_norm_to`
//! is the same without the add (the first layer's norm, the final one).

#[cfg(feature = "cuda")]
mod cuda;

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp2, DType, Device, InplaceOp3, Layout, Shape, Tensor};

use crate::elem::Elem;
use crate::{OpsError, Result};

/// One row: `x += delta` (when given), then `x / sqrt(mean(x²) + eps) · w` into `out`.
fn cpu_row<T: Elem>(x: &mut [f32], delta: Option<&[T]>, w: &[f32], eps: f32, out: &mut Vec<T>) {
    if let Some(delta) = delta {
        x.iter_mut().zip(delta).for_each(|(x, d)| *x += d.widen());
    }
    let squares: f32 = x.iter().map(|v| v * v).sum();
    let scale = 1.0 / (squares / x.len() as f32 + eps).sqrt();
    out.extend(x.iter().zip(w).map(|(v, w)| T::narrow(v * scale * w)));
}

/// The in-place op on the residual; the normalised rows it makes are left in `out` (candle's
/// in-place ops return nothing).
struct AddRmsNorm {
    eps: f32,
    out: Mutex<Option<Tensor>>,
}

impl AddRmsNorm {
    fn keep(&self, out: Tensor) {
        // A poisoned lock only means another thread panicked holding it; the slot is still valid.
        *self.out.lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
    }
}

fn slice<'a, T>(xs: &'a [T], l: &Layout) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&xs[start..end]),
        None => candle_core::bail!("add_rms_norm: contiguous inputs only"),
    }
}

fn cpu_add<T: Elem>(x: &mut [f32], delta: &[T], w: &[f32], eps: f32, hidden: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for (row, d) in x.chunks_exact_mut(hidden).zip(delta.chunks_exact(hidden)) {
        cpu_row(row, Some(d), w, eps, &mut out);
    }
    out
}

impl InplaceOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        residual: &mut CpuStorage,
        rl: &Layout,
        delta: &CpuStorage,
        dl: &Layout,
        weight: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<()> {
        let (CpuStorage::F32(x), CpuStorage::F32(w)) = (residual, weight) else {
            candle_core::bail!("add_rms_norm: f32 residual and weight")
        };
        let Some((start, end)) = rl.contiguous_offsets() else {
            candle_core::bail!("add_rms_norm: contiguous residual only")
        };
        let (x, w) = (&mut x[start..end], slice(w, wl)?);
        let hidden = w.len();
        let out = match delta {
            CpuStorage::F32(d) => Tensor::from_vec(
                cpu_add(x, slice(d, dl)?, w, self.eps, hidden),
                dl.shape(),
                &Device::Cpu,
            )?,
            CpuStorage::F16(d) => Tensor::from_vec(
                cpu_add(x, slice(d, dl)?, w, self.eps, hidden),
                dl.shape(),
                &Device::Cpu,
            )?,
            CpuStorage::BF16(d) => Tensor::from_vec(
                cpu_add(x, slice(d, dl)?, w, self.eps, hidden),
                dl.shape(),
                &Device::Cpu,
            )?,
            _ => candle_core::bail!("add_rms_norm: f32, f16 or bf16 delta"),
        };
        self.keep(out);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        residual: &mut candle_core::CudaStorage,
        rl: &Layout,
        delta: &candle_core::CudaStorage,
        dl: &Layout,
        weight: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> candle_core::Result<()> {
        use candle_core::backend::BackendStorage;
        let dtype = delta.dtype();
        let out = cuda::add_rms_norm_fwd(residual, rl, (delta, dl), weight, wl, self.eps, dtype)?;
        self.keep(out);
        Ok(())
    }
}

/// Shapes and dtypes: `residual` `[rows, hidden]` f32, `delta` the same shape, `weight`
/// `[hidden]` f32, all on one device.
fn check(residual: &Tensor, delta: Option<&Tensor>, weight: &Tensor) -> Result<()> {
    let (_, hidden) = residual.dims2()?;
    let delta_ok = delta.is_none_or(|d| {
        d.dims() == residual.dims()
            && matches!(d.dtype(), DType::F32 | DType::F16 | DType::BF16)
            && d.device().same_device(residual.device())
    });
    if residual.dtype() != DType::F32
        || weight.dtype() != DType::F32
        || weight.dims() != [hidden]
        || !delta_ok
        || !weight.device().same_device(residual.device())
    {
        return Err(OpsError::InvalidArgument(format!(
            "add_rms_norm: residual {:?} {:?}, delta {:?}, weight {:?} {:?}",
            residual.dims(),
            residual.dtype(),
            delta.map(|d| (d.dims().to_vec(), d.dtype())),
            weight.dims(),
            weight.dtype()
        )));
    }
    Ok(())
}

/// `residual += delta` in place (f32 `[rows, hidden]`; `delta` f32, f16 or bf16, same shape),
/// then `residual / sqrt(mean(residual²) + eps) · weight` (`[hidden]` f32) in `delta`'s dtype.
/// `residual` must be contiguous and own its storage: other tensors sharing it see the add.
pub fn add_rms_norm(
    residual: &Tensor,
    delta: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    check(residual, Some(delta), weight)?;
    if !residual.is_contiguous() {
        return Err(OpsError::InvalidArgument(
            "add_rms_norm: contiguous residual only".into(),
        ));
    }
    let op = AddRmsNorm {
        eps,
        out: Mutex::new(None),
    };
    residual.inplace_op3(&delta.contiguous()?, &weight.contiguous()?, &op)?;
    let out = op.out.into_inner().unwrap_or_else(|e| e.into_inner());
    out.ok_or_else(|| OpsError::InvalidArgument("add_rms_norm: no output".into()))
}

/// The norm without the add, as a new tensor of `dtype`.
struct RmsNormTo {
    eps: f32,
    dtype: DType,
}

fn rows_to<T: Elem>(x: &[f32], w: &[f32], eps: f32) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    let mut row = vec![0.0; w.len()];
    for src in x.chunks_exact(w.len().max(1)) {
        row.copy_from_slice(src);
        cpu_row::<T>(&mut row, None, w, eps, &mut out);
    }
    out
}

impl CustomOp2 for RmsNormTo {
    fn name(&self) -> &'static str {
        "rms-norm-to"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        weight: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(w)) = (x, weight) else {
            candle_core::bail!("rms_norm_to: f32 input and weight")
        };
        let (x, w) = (slice(x, xl)?, slice(w, wl)?);
        let out = match self.dtype {
            DType::F16 => CpuStorage::F16(rows_to(x, w, self.eps)),
            DType::BF16 => CpuStorage::BF16(rows_to(x, w, self.eps)),
            _ => CpuStorage::F32(rows_to(x, w, self.eps)),
        };
        Ok((out, xl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        xl: &Layout,
        weight: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let out = cuda::rms_norm_fwd(x, xl, weight, wl, self.eps, self.dtype)?;
        Ok((out, xl.shape().clone()))
    }
}

/// `x / sqrt(mean(x²) + eps) · weight` of f32 `x` (`[rows, hidden]`) in `dtype`.
pub fn rms_norm_to(x: &Tensor, weight: &Tensor, eps: f32, dtype: DType) -> Result<Tensor> {
    check(x, None, weight)?;
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(OpsError::InvalidArgument(format!(
            "rms_norm_to: {dtype:?} output"
        )));
    }
    let op = RmsNormTo { eps, dtype };
    Ok(x.contiguous()?
        .apply_op2_no_bwd(&weight.contiguous()?, &op)?)
}

/// Reference: `(residual + delta, candle_nn's rms_norm_slow of it in `delta`'s dtype)`, from
/// basic ops in f32.
pub fn add_rms_norm_slow(
    residual: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let x = match delta {
        Some(d) => (residual + d.to_dtype(DType::F32)?)?,
        None => residual.clone(),
    };
    let h = candle_nn::ops::rms_norm_slow(&x, weight, eps)?;
    Ok((x, h.to_dtype(dtype)?))
}
