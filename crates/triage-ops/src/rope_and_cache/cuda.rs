//! The CUDA form of `rope_and_cache` (`kernels/rope_and_cache.cu`).
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, Layout, Storage, Tensor, WithDType};

use crate::cuda::{c_int, config, kernel, tensor_view, view, wrap, Module};
use crate::launch::{self};
use crate::paged_attention::check_slots;
use crate::{OpsError, Result};

/// [`crate::rope_and_cache::rope_and_cache`] on CUDA tensors (checked by the caller): one
/// `rope_and_cache_<dtype>` launch, in place on the K cache (candle's in-place op holds its
/// storage for writing), writing the V cache through the device pointer of its storage and Q
/// into a new tensor.
pub(crate) fn rope_and_cache_cuda(
    x: &crate::rope_and_cache::RopeInputs<'_>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &crate::paged_attention::SlotMapping,
    shape: crate::rope_and_cache::QkvShape,
) -> Result<Tensor> {
    let num_slots = k_cache.elem_count() / (shape.kv_heads * shape.head_dim).max(1);
    if let Some(host) = slots.host() {
        check_slots(host, num_slots)?;
    }
    let op = RopeAndCache {
        bias: x.bias.map(Tensor::contiguous).transpose()?,
        cos: x.cos.contiguous()?,
        sin: x.sin.contiguous()?,
        v_cache: v_cache.clone(),
        slots: slots.tensor().contiguous()?,
        shape,
        q: std::sync::Mutex::new(None),
    };
    k_cache.inplace_op2(&x.qkv.contiguous()?, &op)?;
    let q = op.q.into_inner().unwrap_or_else(|e| e.into_inner());
    q.ok_or_else(|| OpsError::InvalidArgument("rope_and_cache: no output".into()))
}

/// The in-place op on the K cache; Q is left in `q`.
struct RopeAndCache {
    bias: Option<Tensor>,
    cos: Tensor,
    sin: Tensor,
    v_cache: Tensor,
    slots: Tensor,
    shape: crate::rope_and_cache::QkvShape,
    q: std::sync::Mutex<Option<Tensor>>,
}

impl candle_core::InplaceOp2 for RopeAndCache {
    fn name(&self) -> &'static str {
        "rope-and-cache"
    }

    fn cpu_fwd(
        &self,
        _: &mut candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        candle_core::bail!("rope-and-cache: the CPU form is rope_and_cache's own loop")
    }

    fn cuda_fwd(
        &self,
        k: &mut CudaStorage,
        kl: &Layout,
        qkv: &CudaStorage,
        ql: &Layout,
    ) -> candle_core::Result<()> {
        let q = match &qkv.slice {
            CudaStorageSlice::F32(_) => self.launch::<f32>(k, kl, qkv, ql)?,
            CudaStorageSlice::F16(_) => self.launch::<half::f16>(k, kl, qkv, ql)?,
            CudaStorageSlice::BF16(_) => self.launch::<half::bf16>(k, kl, qkv, ql)?,
            _ => candle_core::bail!("rope-and-cache: f32, f16 or bf16 projections"),
        };
        *self.q.lock().unwrap_or_else(|e| e.into_inner()) = Some(q);
        Ok(())
    }
}

impl RopeAndCache {
    fn launch<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        k: &mut CudaStorage,
        kl: &Layout,
        qkv: &CudaStorage,
        ql: &Layout,
    ) -> candle_core::Result<Tensor> {
        let s = self.shape;
        let dev = k.device().clone();
        let rows = ql.shape().elem_count() / ((s.num_heads + 2 * s.kv_heads) * s.head_dim).max(1);
        let g =
            launch::rope_and_cache(rows, s.num_heads + 2 * s.kv_heads, s.head_dim).map_err(wrap)?;
        let qkv = view(
            qkv.as_cuda_slice::<T>()?,
            ql.start_offset(),
            ql.shape().elem_count(),
        )?;
        let (cs, cl) = self.cos.storage_and_layout();
        let (ss, sl) = self.sin.storage_and_layout();
        let (vs, vl) = self.v_cache.storage_and_layout();
        let (slot_s, slot_l) = self.slots.storage_and_layout();
        let cos = tensor_view::<f32>(&cs, cl, "rope_and_cache cos")?;
        let sin = tensor_view::<f32>(&ss, sl, "rope_and_cache sin")?;
        let v_cache = tensor_view::<T>(&vs, vl, "rope_and_cache v cache")?;
        let slots = tensor_view::<u32>(&slot_s, slot_l, "rope_and_cache slots")?;
        let bias = self.bias.as_ref().map(Tensor::storage_and_layout);
        let bias = match &bias {
            Some((bs, bl)) => Some(tensor_view::<T>(bs, bl, "rope_and_cache bias")?),
            None => None,
        };
        let (start, len) = (kl.start_offset(), kl.shape().elem_count());
        let mut k_cache = k
            .as_cuda_slice_mut::<T>()?
            .try_slice_mut(start..start + len)
            .ok_or_else(|| candle_core::Error::msg("rope_and_cache: k cache layout"))?;
        // SAFETY: left unset: the blocks of the Q heads write both elements of every pair of
        // every Q row.
        let mut q = unsafe { dev.alloc::<T>(rows * s.num_heads * s.head_dim) }?;
        let ints = [
            c_int(s.num_heads, "heads")?,
            c_int(s.kv_heads, "kv heads")?,
            c_int(s.head_dim, "head dim")?,
            i32::from(s.neox),
        ];
        let null = 0u64;
        let name = format!("rope_and_cache_{}", T::DTYPE.as_str());
        let func = kernel(&dev, Module::RopeAndCache, &name)?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(&qkv);
        match &bias {
            Some(b) => builder.arg(b),
            None => builder.arg(&null),
        };
        builder
            .arg(&cos)
            .arg(&sin)
            .arg(&mut q)
            .arg(&mut k_cache)
            .arg(&v_cache)
            .arg(&slots);
        for n in &ints {
            builder.arg(n);
        }
        // SAFETY: the arguments match `rope_and_cache_<dtype>` (kernels/rope_and_cache.cu);
        // `rope_and_cache` checked every shape against the stacked projection and every slot
        // (here, or before the step for a graph replay's) to be padding or inside the caches, so
        // block (r, h) reads row r's head h, the bias and row r's angles, and writes Q row r's
        // head h or one cache row. The V cache is written through the device pointer of a
        // storage this op only borrows: device memory holds no Rust values, every access to it
        // is a kernel or copy on candle's one stream (which orders this write after earlier
        // reads and before later ones), and the borrow keeps the allocation alive.
        unsafe { builder.launch(config(g)) }.w()?;
        drop(builder);
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(q, dev.clone()));
        Ok(Tensor::from_storage(
            storage,
            (rows, s.num_heads, s.head_dim),
            BackpropOp::none(),
            false,
        ))
    }
}
