//! The CUDA forms of `reshape_and_cache` and paged attention: the decode kernel
//! (`kernels/paged_attention.cu`), the tensor-core prefill kernel (`kernels/prefill_attention.cu`)
//! and the merge of their partitions.
//!
//! Decode keeps the row kernel: one block per (KV head with up to 8 of its query heads, row,
//! 512-key partition), so each K/V row is read once for those heads. Steps with a prefill chunk
//! over f16 or bf16 caches at head dims 64 and 128 take the tensor-core `prefill_attention` (why
//! ours and not `candle-flash-attn`: ARCHITECTURE.md, "Prefill attention").
#![allow(unsafe_code)]

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Storage, Tensor, WithDType};

use super::{check_slots, DeviceRows, HostSlots, PrefillTiles};
use crate::cuda::{c_int, config, f32_tensor, kernel, tensor_view, view, wrap, Module};
use crate::launch::{self, LaunchGeometry};
use crate::{OpsError, Result};

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
