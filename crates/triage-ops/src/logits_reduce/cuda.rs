//! The CUDA form of `logits_reduce`: `logits_reduce_<dtype>` and, for rows split over several
//! blocks, `logits_reduce_merge_f32` (`kernels/logits_reduce.cu`).
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, WithDType};

use crate::cuda::{c_int, config, kernel, view, wrap, Module};
use crate::launch::{self, LaunchGeometry};

/// `FusedLogitsReduce::cuda_fwd`: `logits_reduce_<dtype>` over `num_rows` rows of `vocab`
/// logits into the packed `[num_rows, 4 + 2k]` f32 output; a row longer than one chunk
/// (`launch::logits_reduce_splits`) is reduced by several blocks and merged by
/// `logits_reduce_merge_f32`. Arguments were checked by the caller.
pub(crate) fn logits_reduce_fwd(
    storage: &CudaStorage,
    layout: &Layout,
    num_rows: usize,
    vocab: usize,
    k: usize,
) -> candle_core::Result<CudaStorage> {
    let dev = storage.device();
    // SAFETY: left unset, no memset: every row is written, by its one block or by the merge.
    let mut out = unsafe { dev.alloc::<f32>(num_rows * crate::packed_width(k)) }?;
    if num_rows > 0 {
        let g = launch::logits_reduce(num_rows, vocab, k, launch::LOGITS_REDUCE_THREADS)
            .map_err(wrap)?;
        let (splits, chunk) = launch::logits_reduce_splits(vocab);
        let mut parts = ReducePartials::new(dev, num_rows * splits, k, splits > 1)?;
        let args = ReduceArgs {
            vocab: c_int(vocab, "vocab")?,
            k: c_int(k, "k")?,
            chunk: c_int(chunk, "chunk")?,
            g,
        };
        match &storage.slice {
            CudaStorageSlice::F32(s) => args.launch(dev, s, layout, &mut out, &mut parts)?,
            CudaStorageSlice::F16(s) => args.launch(dev, s, layout, &mut out, &mut parts)?,
            CudaStorageSlice::BF16(s) => args.launch(dev, s, layout, &mut out, &mut parts)?,
            _ => candle_core::bail!("logits_reduce: unsupported dtype {:?}", storage.dtype()),
        }
        if let Some((f, u)) = &parts.buffers {
            let g = launch::logits_reduce_merge(num_rows, k).map_err(wrap)?;
            let func = kernel(dev, Module::LogitsReduce, "logits_reduce_merge_f32")?;
            let stream = dev.cuda_stream();
            let mut builder = stream.launch_builder(&func);
            let splits = c_int(splits, "splits")?;
            builder
                .arg(f)
                .arg(u)
                .arg(&mut out)
                .arg(&splits)
                .arg(&args.k);
            // SAFETY: the arguments match `logits_reduce_merge_f32(const float*, const unsigned*,
            // float*, int, int)`; block r reads the `splits` partial slots of row r, which the
            // first launch wrote, and writes row r of `out` (`num_rows` packed rows).
            unsafe { builder.launch(config(g)) }.w()?;
        }
    }
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// The per-(row, split) partial results of a split reduction: `3 + k` floats and `1 + k` ids
/// each; absent with one split a row.
struct ReducePartials {
    buffers: Option<(CudaSlice<f32>, CudaSlice<u32>)>,
}

impl ReducePartials {
    fn new(dev: &CudaDevice, slots: usize, k: usize, split: bool) -> candle_core::Result<Self> {
        if !split {
            return Ok(Self { buffers: None });
        }
        // SAFETY: left unset: thread 0 of each (row, split) block writes its whole slot before
        // the merge, launched after it on the same stream, reads it.
        let f = unsafe { dev.alloc::<f32>(slots * (3 + k)) }?;
        // SAFETY: as above.
        let u = unsafe { dev.alloc::<u32>(slots * (1 + k)) }?;
        Ok(Self {
            buffers: Some((f, u)),
        })
    }
}

/// The sizes of one `logits_reduce` launch.
struct ReduceArgs {
    vocab: i32,
    k: i32,
    chunk: i32,
    g: LaunchGeometry,
}

impl ReduceArgs {
    fn launch<T: DeviceRepr + WithDType>(
        &self,
        dev: &CudaDevice,
        logits: &CudaSlice<T>,
        layout: &Layout,
        out: &mut CudaSlice<f32>,
        parts: &mut ReducePartials,
    ) -> candle_core::Result<()> {
        // The kernel takes a pointer to the first logit; it reads an unaligned head by scalars.
        let logits = view(logits, layout.start_offset(), layout.shape().elem_count())?;
        let func = kernel(
            dev,
            Module::LogitsReduce,
            &format!("logits_reduce_{}", T::DTYPE.as_str()),
        )?;
        let stream = dev.cuda_stream();
        let null = 0u64;
        let mut builder = stream.launch_builder(&func);
        builder.arg(&logits).arg(out);
        match &mut parts.buffers {
            Some((f, u)) => builder.arg(f).arg(u),
            None => builder.arg(&null).arg(&null),
        };
        builder.arg(&self.vocab).arg(&self.k).arg(&self.chunk);
        // SAFETY: the arguments match `logits_reduce_<dtype>(const T*, float*, float*, unsigned*,
        // int, int, int)`; block (r, s) reads logits [s·chunk, (s+1)·chunk) ∩ [0, vocab) of row r
        // (`logits` is `num_rows · vocab` long) and writes row r of `out` (one split) or its
        // partial slot (several; the buffers hold `num_rows · splits` slots). With one split the
        // partial pointers are null and unused.
        unsafe { builder.launch(config(self.g)) }.w()?;
        Ok(())
    }
}
