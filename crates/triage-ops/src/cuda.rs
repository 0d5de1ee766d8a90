//! The CUDA forms of the ops: the PTX that `build.rs` compiled from `kernels/`, loaded once per
//! device and launched on candle's own stream with the geometry of [`crate::launch`].
//!
//! Compiled only with the `cuda` feature; `cuda_stub.rs` stands in for the public functions
//! without it. Every kernel argument is a contiguous device buffer: the callers check shapes and
//! bounds on the host first, since a kernel cannot report an error, only write out of bounds.
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaGraph, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Shape, Storage, Tensor, WithDType};

use crate::entropy_window::EntropyWindowParams;
use crate::launch::{self, LaunchGeometry};
use crate::paged_attention::{check_slots, DeviceRows, HostSlots, PrefillTiles};
use crate::{OpsError, Result};

/// One `.cu` file of `kernels/`, compiled to PTX by `build.rs`.
#[derive(Debug, Clone, Copy)]
enum Module {
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
fn kernel(dev: &CudaDevice, module: Module, name: &str) -> candle_core::Result<CudaFunction> {
    let func = dev.get_or_load_custom_func(name, module.key(), module.ptx())?;
    Ok(func.into_cuda_function())
}

fn config(g: LaunchGeometry) -> LaunchConfig {
    LaunchConfig {
        grid_dim: g.grid,
        block_dim: g.block,
        shared_mem_bytes: g.shared_mem_bytes,
    }
}

/// A size as the kernels' `int`.
fn c_int(n: usize, what: &str) -> candle_core::Result<i32> {
    i32::try_from(n).map_err(|_| candle_core::Error::msg(format!("{what} {n} exceeds a C int")))
}

fn wrap(e: OpsError) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// `len` elements of `slice` from `start`, or an error (cudarc's `slice` would panic).
fn view<T>(slice: &CudaSlice<T>, start: usize, len: usize) -> candle_core::Result<CudaView<'_, T>> {
    slice.try_slice(start..start + len).ok_or_else(|| {
        candle_core::Error::msg(format!("{start}+{len} past a {} slice", slice.len()))
    })
}

/// The device buffer of a contiguous CUDA tensor's storage, from its layout's start offset.
fn tensor_view<'a, T: CudaDType>(
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
fn f32_tensor(slice: CudaSlice<f32>, dev: &CudaDevice, shape: impl Into<Shape>) -> Tensor {
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

// ---------------------------------------------------------------------------------------------
// logits_reduce

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

// ---------------------------------------------------------------------------------------------
// reshape_and_cache

/// `ReshapeAndCache::cuda_fwd`: `reshape_and_cache_<dtype>` writing row `i` of `src` to slot
/// `slots[i]` of `cache`. The bounds check, which must happen before the launch, reads
/// `host_slots` when the caller has them on the host, copies them back when it has not (a stream
/// synchronisation), and is skipped for slots the caller checked before the step (a graph
/// replay's).
pub(crate) fn reshape_and_cache_fwd(
    cache: &mut CudaStorage,
    cl: &Layout,
    src: &CudaStorage,
    sl: &Layout,
    slots: &CudaStorage,
    ll: &Layout,
    host_slots: HostSlots<'_>,
) -> candle_core::Result<()> {
    if !cl.is_contiguous() || !sl.is_contiguous() || !ll.is_contiguous() {
        candle_core::bail!("reshape_and_cache: contiguous inputs only")
    }
    let dev = cache.device.clone();
    let num_tokens = ll.shape().elem_count();
    if num_tokens == 0 {
        return Ok(());
    }
    let device_slots = view(slots.as_cuda_slice::<u32>()?, ll.start_offset(), num_tokens)?;
    let copied;
    let host_slots = match host_slots {
        HostSlots::Known(h) if h.len() == num_tokens => Some(h),
        HostSlots::Known(h) => {
            candle_core::bail!("reshape_and_cache: {} host slots for {num_tokens}", h.len())
        }
        HostSlots::Unknown => {
            copied = dev.clone_dtoh(&device_slots)?;
            Some(&copied[..])
        }
        HostSlots::Checked => None,
    };
    let row_elems = sl.shape().elem_count() / num_tokens;
    if row_elems == 0 || row_elems * num_tokens != sl.shape().elem_count() {
        candle_core::bail!(
            "reshape_and_cache: {:?} rows for {num_tokens} slots",
            sl.dims()
        )
    }
    if let Some(host_slots) = host_slots {
        check_slots(host_slots, cl.shape().elem_count() / row_elems).map_err(wrap)?;
    }
    let g =
        launch::reshape_and_cache(num_tokens, launch::RESHAPE_AND_CACHE_THREADS).map_err(wrap)?;
    let rows = RowsArgs {
        slots: &device_slots,
        row_elems: c_int(row_elems, "row length")?,
        g,
    };
    match (&mut cache.slice, &src.slice) {
        (CudaStorageSlice::F32(c), CudaStorageSlice::F32(s)) => rows.launch(&dev, c, cl, s, sl),
        (CudaStorageSlice::F16(c), CudaStorageSlice::F16(s)) => rows.launch(&dev, c, cl, s, sl),
        (CudaStorageSlice::BF16(c), CudaStorageSlice::BF16(s)) => rows.launch(&dev, c, cl, s, sl),
        _ => candle_core::bail!("reshape_and_cache: cache and rows of one float dtype"),
    }
}

/// What a `reshape_and_cache` launch needs besides the typed buffers.
struct RowsArgs<'a> {
    slots: &'a CudaView<'a, u32>,
    row_elems: i32,
    g: LaunchGeometry,
}

impl RowsArgs<'_> {
    fn launch<T: DeviceRepr + WithDType>(
        &self,
        dev: &CudaDevice,
        cache: &mut CudaSlice<T>,
        cl: &Layout,
        src: &CudaSlice<T>,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        let rows = view(src, sl.start_offset(), sl.shape().elem_count())?;
        let (start, len) = (cl.start_offset(), cl.shape().elem_count());
        let mut cache = cache
            .try_slice_mut(start..start + len)
            .ok_or_else(|| candle_core::Error::msg("reshape_and_cache: cache layout"))?;
        let name = format!("reshape_and_cache_{}", T::DTYPE.as_str());
        let func = kernel(dev, Module::ReshapeAndCache, &name)?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder
            .arg(&rows)
            .arg(&mut cache)
            .arg(self.slots)
            .arg(&self.row_elems);
        // SAFETY: the arguments match `reshape_and_cache_<dtype>(const T*, T*, const unsigned*,
        // int)`; block i copies row i (`row_elems` elements of `rows`) to slot `slots[i]`, and
        // every slot was checked on the host to be padding (skipped) or inside `cache`.
        unsafe { builder.launch(config(self.g)) }.w()?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// paged_attention

/// CUDA form of [`crate::paged_attention::paged_attention_planned`], which calls it for CUDA
/// tensors after its input checks, with the plan's uploaded rows:
/// `q` `[num_tokens, num_heads, head_dim]` (converted to the caches' dtype) over caches
/// `[num_blocks, block_size, kv_heads, head_dim]` in f32, f16 or bf16. Returns
/// `[num_tokens, num_heads, head_dim]` f32. Contexts longer than [`launch::PARTITION_SIZE`]
/// keys run in partitions that `paged_attention_merge_f32` combines.
pub(crate) fn paged_attention_cuda(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    rows: &DeviceRows,
) -> Result<Tensor> {
    let (num_tokens, num_heads, head_dim) = q.dims3()?;
    let (_, block_size, kv_heads, _) = k_cache.dims4()?;
    // `paged_attention_planned` checked shapes, dtypes and devices, and the plan the metadata.
    let dev = q.device().as_cuda_device()?.clone();
    if num_tokens == 0 {
        return Ok(Tensor::zeros(
            (0, num_heads, head_dim),
            DType::F32,
            q.device(),
        )?);
    }
    let q = q.to_dtype(k_cache.dtype())?.contiguous()?;
    let shape = AttentionShape {
        num_rows: num_tokens,
        num_heads,
        kv_heads,
        head_dim,
        block_size,
    };
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k_cache.storage_and_layout();
    let (vs, vl) = v_cache.storage_and_layout();
    let out = match k_cache.dtype() {
        DType::F32 => shape.run::<f32>(&dev, rows, (&*qs, ql), (&*ks, kl), (&*vs, vl))?,
        DType::F16 => shape.run::<half::f16>(&dev, rows, (&*qs, ql), (&*ks, kl), (&*vs, vl))?,
        DType::BF16 => shape.run::<half::bf16>(&dev, rows, (&*qs, ql), (&*ks, kl), (&*vs, vl))?,
        other => {
            return Err(OpsError::InvalidArgument(format!(
                "paged_attention: caches of dtype {other:?}"
            )))
        }
    };
    Ok(f32_tensor(out, &dev, (num_tokens, num_heads, head_dim)))
}

/// The sizes of one paged-attention launch.
struct AttentionShape {
    num_rows: usize,
    num_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
}

type Input<'a> = (&'a Storage, &'a Layout);

impl AttentionShape {
    /// The output `[rows, heads, head_dim]` f32 and, past one partition, the partial results
    /// the merge combines (the kernels never touch them otherwise).
    fn outputs(
        &self,
        dev: &CudaDevice,
        num_partitions: usize,
    ) -> Result<(CudaSlice<f32>, Option<Partials>)> {
        let per_row = self.num_rows * self.num_heads;
        // SAFETY: left unset, no memset: with one partition the kernel writes every element
        // (paged_attention: each row's first partition holds key 0 and its blocks cover every
        // head and dim; prefill_attention: every (row, head) pair belongs to one tile, whose
        // block writes all its dims), and past one the merge does. The simulator tests fill
        // `out` with a poison first and find none.
        let out = unsafe { dev.alloc::<f32>(per_row * self.head_dim) }?;
        let parts = if num_partitions > 1 {
            Some(Partials::new(dev, per_row * num_partitions, self.head_dim)?)
        } else {
            None
        };
        Ok((out, parts))
    }

    /// Runs the partition kernel over the uploaded rows and, past one partition, the merge.
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        dev: &CudaDevice,
        rows: &DeviceRows,
        q: Input<'_>,
        k: Input<'_>,
        v: Input<'_>,
    ) -> Result<CudaSlice<f32>> {
        let g = launch::paged_attention(
            self.num_heads,
            self.kv_heads,
            self.num_rows,
            rows.max_context_len,
            self.head_dim,
            std::mem::size_of::<T>(),
            launch::PAGED_ATTENTION_THREADS,
        )?;
        let num_partitions = g.grid.2 as usize;
        let (mut out, mut parts) = self.outputs(dev, num_partitions)?;
        let (bs, bl) = rows.block_tables.storage_and_layout();
        let (ss, sl) = rows.row_seq.storage_and_layout();
        let (ps, pl) = rows.row_pos.storage_and_layout();
        let block_tables = tensor_view::<u32>(&bs, bl, "paged_attention block tables")?;
        let row_seq = tensor_view::<u32>(&ss, sl, "paged_attention row sequences")?;
        let row_pos = tensor_view::<u32>(&ps, pl, "paged_attention row positions")?;
        let q = tensor_view::<T>(q.0, q.1, "paged_attention q")?;
        let k = tensor_view::<T>(k.0, k.1, "paged_attention k cache")?;
        let v = tensor_view::<T>(v.0, v.1, "paged_attention v cache")?;
        let ints = [
            c_int(self.num_heads, "heads")?,
            c_int(self.kv_heads, "kv heads")?,
            c_int(self.head_dim, "head dim")?,
            c_int(self.block_size, "block size")?,
            c_int(rows.max_blocks_per_seq, "blocks per sequence")?,
            c_int(num_partitions, "partitions")?,
        ];
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let null = 0u64;
        let name = format!("paged_attention_{}", T::DTYPE.as_str());
        let func = kernel(dev, Module::PagedAttention, &name)?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(&mut out);
        match &mut parts {
            Some(p) => builder.arg(&mut p.out).arg(&mut p.max).arg(&mut p.sum),
            None => builder.arg(&null).arg(&null).arg(&null),
        };
        builder.arg(&q).arg(&k).arg(&v);
        builder.arg(&block_tables).arg(&row_seq).arg(&row_pos);
        for n in &ints {
            builder.arg(n);
        }
        builder.arg(&scale);
        // SAFETY: the arguments match `paged_attention_<dtype>` (kernels/README.md). The plan's
        // metadata was validated against this cache (`PagedAttentionPlan::new`), so every block id a row reads is
        // inside the caches and every position is inside its block table; `out` holds
        // `[rows, heads, head_dim]` and, with several partitions, the partial buffers hold
        // `[rows, heads, partitions(, head_dim)]`; with one partition they are null and unused.
        unsafe { builder.launch(config(g)) }.w()?;
        drop(builder);
        if let Some(p) = &parts {
            p.merge(dev, &mut out, &row_pos, self, num_partitions)?;
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// prefill_attention

/// CUDA form of [`crate::paged_attention::paged_attention_planned`] for a step with a prefill
/// chunk over f16 or bf16 caches (the plan chose it and made `tiles`): `q`
/// `[num_tokens, num_heads, head_dim]` (converted to the caches' dtype) over caches
/// `[num_blocks, block_size, kv_heads, head_dim]`, on tensor cores. Returns
/// `[num_tokens, num_heads, head_dim]` f32. A short chunk over a long context is split into
/// partitions ([`launch::prefill_attention_partitions`]) that `paged_attention_merge_f32`
/// combines.
pub(crate) fn prefill_attention_cuda(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    rows: &DeviceRows,
    tiles: &PrefillTiles,
) -> Result<Tensor> {
    let (num_tokens, num_heads, head_dim) = q.dims3()?;
    let (_, block_size, kv_heads, _) = k_cache.dims4()?;
    let dev = q.device().as_cuda_device()?.clone();
    let q = q.to_dtype(k_cache.dtype())?.contiguous()?;
    let shape = AttentionShape {
        num_rows: num_tokens,
        num_heads,
        kv_heads,
        head_dim,
        block_size,
    };
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k_cache.storage_and_layout();
    let (vs, vl) = v_cache.storage_and_layout();
    let out = match k_cache.dtype() {
        DType::F16 => {
            shape.run_prefill::<half::f16>(&dev, rows, tiles, (&*qs, ql), (&*ks, kl), (&*vs, vl))?
        }
        DType::BF16 => shape.run_prefill::<half::bf16>(
            &dev,
            rows,
            tiles,
            (&*qs, ql),
            (&*ks, kl),
            (&*vs, vl),
        )?,
        other => {
            return Err(OpsError::InvalidArgument(format!(
                "prefill_attention: caches of dtype {other:?}"
            )))
        }
    };
    Ok(f32_tensor(out, &dev, (num_tokens, num_heads, head_dim)))
}

impl AttentionShape {
    /// Runs `prefill_attention_d<head_dim>_<dtype>` over the plan's tiles and, when split, the
    /// merge.
    fn run_prefill<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        dev: &CudaDevice,
        rows: &DeviceRows,
        tiles: &PrefillTiles,
        q: Input<'_>,
        k: Input<'_>,
        v: Input<'_>,
    ) -> Result<CudaSlice<f32>> {
        let num_partitions = launch::prefill_attention_partitions(
            tiles.num_tiles,
            self.kv_heads,
            self.num_rows,
            self.num_heads,
            self.head_dim,
            rows.max_context_len,
        );
        let g = launch::prefill_attention(
            tiles.num_tiles,
            self.kv_heads,
            num_partitions,
            self.head_dim,
            std::mem::size_of::<T>(),
            launch::PREFILL_ATTENTION_THREADS,
        )?;
        let (mut out, mut parts) = self.outputs(dev, num_partitions)?;
        let (bs, bl) = rows.block_tables.storage_and_layout();
        let (ss, sl) = rows.row_seq.storage_and_layout();
        let (ps, pl) = rows.row_pos.storage_and_layout();
        let (ts, tl) = tiles.tiles.storage_and_layout();
        let block_tables = tensor_view::<u32>(&bs, bl, "prefill_attention block tables")?;
        let row_seq = tensor_view::<u32>(&ss, sl, "prefill_attention row sequences")?;
        let row_pos = tensor_view::<u32>(&ps, pl, "prefill_attention row positions")?;
        let tile_words = tensor_view::<u32>(&ts, tl, "prefill_attention tiles")?;
        let q = tensor_view::<T>(q.0, q.1, "prefill_attention q")?;
        let k = tensor_view::<T>(k.0, k.1, "prefill_attention k cache")?;
        let v = tensor_view::<T>(v.0, v.1, "prefill_attention v cache")?;
        let ints = [
            c_int(self.num_heads, "heads")?,
            c_int(self.kv_heads, "kv heads")?,
            c_int(self.block_size, "block size")?,
            c_int(rows.max_blocks_per_seq, "blocks per sequence")?,
            c_int(num_partitions, "partitions")?,
        ];
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let null = 0u64;
        let name = format!("prefill_attention_d{}_{}", self.head_dim, T::DTYPE.as_str());
        let func = kernel(dev, Module::PrefillAttention, &name)?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(&mut out);
        match &mut parts {
            Some(p) => builder.arg(&mut p.out).arg(&mut p.max).arg(&mut p.sum),
            None => builder.arg(&null).arg(&null).arg(&null),
        };
        builder.arg(&q).arg(&k).arg(&v);
        builder
            .arg(&block_tables)
            .arg(&row_seq)
            .arg(&row_pos)
            .arg(&tile_words);
        for n in &ints {
            builder.arg(n);
        }
        builder.arg(&scale);
        // SAFETY: the arguments match `prefill_attention_d<dim>_<dtype>` (kernels/README.md).
        // The plan validated its metadata against this cache, so every block id a tile reads is
        // inside the caches; the tiles were cut from the same metadata for this query group, so
        // every (row, head) pair they name is inside `q` and `out`; the caches start on a
        // 16-byte boundary (checked by the plan) as the 16-byte copies need; with several
        // partitions the partial buffers hold `[rows, heads, partitions(, head_dim)]`.
        unsafe { builder.launch(config(g)) }.w()?;
        drop(builder);
        if let Some(p) = &parts {
            p.merge(dev, &mut out, &row_pos, self, num_partitions)?;
        }
        Ok(out)
    }
}

/// The per-partition results that `paged_attention_merge_f32` combines.
struct Partials {
    out: CudaSlice<f32>,
    max: CudaSlice<f32>,
    sum: CudaSlice<f32>,
}

impl Partials {
    fn new(dev: &CudaDevice, num_parts: usize, head_dim: usize) -> candle_core::Result<Self> {
        // SAFETY: left unset, no memsets: every partition's max and sum are written (a partition
        // past its row's context writes -inf and 0), and the merge reads the outputs of only the
        // partitions that hold keys, which write all of theirs.
        Ok(Self {
            out: unsafe { dev.alloc(num_parts * head_dim) }?,
            max: unsafe { dev.alloc(num_parts) }?,
            sum: unsafe { dev.alloc(num_parts) }?,
        })
    }

    fn merge(
        &self,
        dev: &CudaDevice,
        out: &mut CudaSlice<f32>,
        row_pos: &CudaView<'_, u32>,
        shape: &AttentionShape,
        num_partitions: usize,
    ) -> Result<()> {
        let g = launch::paged_attention_merge(
            shape.num_heads,
            shape.num_rows,
            launch::PAGED_ATTENTION_THREADS,
        )?;
        let ints = [
            c_int(shape.num_heads, "heads")?,
            c_int(shape.head_dim, "head dim")?,
            c_int(num_partitions, "partitions")?,
        ];
        let func = kernel(dev, Module::PagedAttention, "paged_attention_merge_f32")?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder
            .arg(out)
            .arg(&self.out)
            .arg(&self.max)
            .arg(&self.sum)
            .arg(row_pos);
        for n in &ints {
            builder.arg(n);
        }
        // SAFETY: the arguments match `paged_attention_merge_f32`; block (head, row) reads that
        // row's partitions from the buffers the partition kernel filled (same shapes) and writes
        // `head_dim` outputs of `out`. It runs after that kernel on the same stream.
        unsafe { builder.launch(config(g)) }.w()?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// entropy_window

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

// ---------------------------------------------------------------------------------------------
// step graphs

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

// ---------------------------------------------------------------------------------------------
// silu_mul and add_rms_norm

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

// ---------------------------------------------------------------------------------------------
// rope_and_cache

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
