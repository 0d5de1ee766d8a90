//! The CUDA form of `silu_mul` (`kernels/silu_mul.cu`).
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, WithDType};

use crate::cuda::{c_int, config, kernel, view, wrap, Module};
use crate::launch::{self, LaunchGeometry};

/// `SiluMul::cuda_fwd`: `silu_mul_<dtype>` over `rows` rows of `[gate | up]` (`2 · inter` wide).
pub(crate) fn silu_mul_fwd(
    storage: &CudaStorage,
    layout: &Layout,
    rows: usize,
    inter: usize,
) -> candle_core::Result<CudaStorage> {
    let dev = storage.device();
    let g = launch::silu_mul(rows, inter, launch::SILU_MUL_THREADS).map_err(wrap)?;
    let inter_arg = c_int(inter, "intermediate size")?;
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        dev: &CudaDevice,
        s: &CudaSlice<T>,
        layout: &Layout,
        g: LaunchGeometry,
        inter: i32,
    ) -> candle_core::Result<CudaStorage> {
        let x = view(s, layout.start_offset(), layout.shape().elem_count())?;
        // SAFETY: left unset: thread (r, c·threads + t) writes output element (r, c·threads + t)
        // for every column below `inter`, so every element is written.
        let mut out = unsafe { dev.alloc::<T>(layout.shape().elem_count() / 2) }?;
        let func = kernel(
            dev,
            Module::SiluMul,
            &format!("silu_mul_{}", T::DTYPE.as_str()),
        )?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(&x).arg(&mut out).arg(&inter);
        // SAFETY: the arguments match `silu_mul_<dtype>(const T*, T*, int)`; the grid covers
        // `rows` rows of `inter` outputs, each reading two of the `rows · 2 · inter` inputs.
        unsafe { builder.launch(config(g)) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    match &storage.slice {
        CudaStorageSlice::F32(s) => run(dev, s, layout, g, inter_arg),
        CudaStorageSlice::F16(s) => run(dev, s, layout, g, inter_arg),
        CudaStorageSlice::BF16(s) => run(dev, s, layout, g, inter_arg),
        _ => candle_core::bail!("silu_mul: unsupported dtype {:?}", storage.dtype()),
    }
}
