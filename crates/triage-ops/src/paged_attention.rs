//! Paged KV cache ops: `reshape_and_cache` writes new K/V rows into their slots of a
//! `[num_blocks, block_size, num_kv_heads, head_dim]` cache, and `paged_attention` runs causal
//! grouped-query attention for several sequences, each reading its keys through a block table.
//! Prefill over a cached prefix and batched decode are the same call (query length n ≥ 1).
//! CPU caches are f32, f16 or bf16.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(not(feature = "cuda"))]
use crate::cuda::paged_attention as cuda;

use candle_core::{CpuStorage, DType, Device, InplaceOp3, Layout, Tensor};

use crate::flash_attention::{flash_attention_tensors, SeqKeys};

use crate::{OpsError, Result};

/// Where each sequence's keys live and which of its positions this step queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagedAttentionMetadata {
    /// Tokens per block.
    pub block_size: usize,
    /// Per sequence: its blocks in order.
    pub block_tables: Vec<Vec<u32>>,
    /// Per sequence: tokens in the cache after this step's writes (the context length).
    pub seq_lens: Vec<usize>,
    /// Per sequence: how many of its last positions are queried this step; the queries of all
    /// sequences are concatenated in this order.
    pub query_lens: Vec<usize>,
}

impl PagedAttentionMetadata {
    /// Checks the metadata against `num_tokens` query rows and a cache of `num_blocks` blocks:
    /// a kernel cannot return an error, so a block id past the cache must be caught here.
    pub fn validate(&self, num_tokens: usize, num_blocks: usize) -> Result<()> {
        self.validate_rows(num_tokens)?;
        for (s, table) in self.block_tables.iter().enumerate() {
            let used = self.seq_lens[s].div_ceil(self.block_size);
            if let Some(&block) = table[..used].iter().find(|&&b| b as usize >= num_blocks) {
                return Err(OpsError::InvalidArgument(format!(
                    "sequence {s}: block id {block} outside a cache of {num_blocks} blocks"
                )));
            }
        }
        Ok(())
    }

    /// The flat inputs of the CUDA kernel (and of its simulator tests): every query row's
    /// sequence and position, and the block tables padded to one width. Call after `validate`.
    pub fn kernel_rows(&self) -> KernelRows {
        let max_blocks_per_seq = self
            .block_tables
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(0)
            .max(1);
        let mut block_tables = vec![0u32; self.block_tables.len() * max_blocks_per_seq];
        for (dst, table) in block_tables
            .chunks_mut(max_blocks_per_seq)
            .zip(&self.block_tables)
        {
            dst[..table.len()].copy_from_slice(table);
        }
        let (mut row_seq, mut row_pos) = (Vec::new(), Vec::new());
        for (s, (&qlen, &slen)) in self.query_lens.iter().zip(&self.seq_lens).enumerate() {
            row_seq.extend(std::iter::repeat_n(s as u32, qlen));
            row_pos.extend((slen - qlen..slen).map(|p| p as u32));
        }
        let max_context_len = row_pos.iter().map(|&p| p as usize + 1).max().unwrap_or(1);
        KernelRows {
            block_tables,
            max_blocks_per_seq,
            row_seq,
            row_pos,
            max_context_len,
        }
    }

    /// The query tiles of `prefill_attention` for `group` query heads per KV head and
    /// `tile_rows` (row, head) pairs a tile ([`crate::launch::prefill_tile_rows`]): each
    /// sequence's `query_len · group` pairs cut into tiles, each tile as three words (the
    /// sequence's first query row, its number of query rows, the tile's first pair). A
    /// sequence's tiles are listed last first: those attend the most keys, and blocks start in
    /// grid order, so the longest run first.
    pub fn prefill_tiles(&self, group: usize, tile_rows: usize) -> Vec<u32> {
        let mut tiles = Vec::new();
        let mut first_row = 0;
        for &qlen in &self.query_lens {
            let pairs = qlen * group;
            for tile in (0..pairs.div_ceil(tile_rows.max(1))).rev() {
                tiles.extend([first_row as u32, qlen as u32, (tile * tile_rows) as u32]);
            }
            first_row += qlen;
        }
        tiles
    }

    fn validate_rows(&self, num_tokens: usize) -> Result<()> {
        let bad = |m: String| Err(OpsError::InvalidArgument(m));
        let n = self.block_tables.len();
        if self.seq_lens.len() != n || self.query_lens.len() != n || self.block_size == 0 {
            return bad(format!(
                "metadata lengths {n}/{}/{}",
                self.seq_lens.len(),
                self.query_lens.len()
            ));
        }
        if self.query_lens.iter().sum::<usize>() != num_tokens {
            return bad(format!(
                "query lengths sum to {}, q has {num_tokens} rows",
                self.query_lens.iter().sum::<usize>()
            ));
        }
        for s in 0..n {
            if self.query_lens[s] > self.seq_lens[s]
                || self.seq_lens[s] > self.block_tables[s].len() * self.block_size
            {
                return bad(format!(
                    "sequence {s}: {} queries, {} tokens, {} blocks",
                    self.query_lens[s],
                    self.seq_lens[s],
                    self.block_tables[s].len()
                ));
            }
        }
        Ok(())
    }
}

/// [`PagedAttentionMetadata`] flattened for the CUDA kernel: one entry per query row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRows {
    /// `[num_seqs, max_blocks_per_seq]`, each table padded with block 0 (never read).
    pub block_tables: Vec<u32>,
    /// Width of `block_tables`.
    pub max_blocks_per_seq: usize,
    /// Per query row: its sequence.
    pub row_seq: Vec<u32>,
    /// Per query row: its position, so it attends keys `0..=pos`.
    pub row_pos: Vec<u32>,
    /// The longest context of any row (`max(pos) + 1`), which sets the number of partitions.
    pub max_context_len: usize,
}

/// A slot value that `reshape_and_cache` skips: the row is padding (vLLM uses -1 alike).
pub const PADDING_SLOT: u32 = u32::MAX;

/// Every slot is [`PADDING_SLOT`] or below `num_slots`. Checked on the host before any write,
/// on every device: a kernel could not report a bad slot, only write out of bounds.
pub fn check_slots(slots: &[u32], num_slots: usize) -> Result<()> {
    match slots
        .iter()
        .find(|&&s| s != PADDING_SLOT && s as usize >= num_slots)
    {
        Some(slot) => Err(OpsError::InvalidArgument(format!(
            "reshape_and_cache: slot {slot} outside {num_slots} slots"
        ))),
        None => Ok(()),
    }
}

/// Slot of token `pos` of a sequence: `block * block_size + pos % block_size`.
pub fn slot_of(block_table: &[u32], block_size: usize, pos: usize) -> u32 {
    block_table[pos / block_size] * block_size as u32 + (pos % block_size) as u32
}

/// The in-place op. `host_slots` are the slots tensor's values when the caller has them on the
/// host ([`SlotMapping`]); without them the CUDA form copies the slots back for its bounds check.
struct ReshapeAndCache<'a> {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    host_slots: HostSlots<'a>,
}

/// What the CUDA form knows of the slots on the host, for its bounds check.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum HostSlots<'a> {
    /// Nothing: it copies them back (a stream synchronisation).
    Unknown,
    /// Their values.
    Known(&'a [u32]),
    /// Checked by the caller against this cache before the step ran (a graph replay, whose
    /// slots live in a step buffer and are checked on the host before every replay).
    Checked,
}

impl InplaceOp3 for ReshapeAndCache<'_> {
    fn name(&self) -> &'static str {
        "reshape-and-cache"
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        cache: &mut candle_core::CudaStorage,
        cl: &Layout,
        src: &candle_core::CudaStorage,
        sl: &Layout,
        slots: &candle_core::CudaStorage,
        ll: &Layout,
    ) -> candle_core::Result<()> {
        cuda::reshape_and_cache_fwd(cache, cl, src, sl, slots, ll, self.host_slots)
    }

    fn cpu_fwd(
        &self,
        cache: &mut CpuStorage,
        cl: &Layout,
        src: &CpuStorage,
        sl: &Layout,
        slots: &CpuStorage,
        ll: &Layout,
    ) -> candle_core::Result<()> {
        if !cl.is_contiguous() || !sl.is_contiguous() || !ll.is_contiguous() {
            candle_core::bail!("reshape_and_cache: contiguous inputs only")
        }
        let CpuStorage::U32(slots) = slots else {
            candle_core::bail!("reshape_and_cache: u32 slots")
        };
        let slots = &slots[ll.start_offset()..ll.start_offset() + ll.shape().elem_count()];
        match (cache, src) {
            (CpuStorage::F32(c), CpuStorage::F32(s)) => write_rows(c, cl, s, sl, slots),
            (CpuStorage::F16(c), CpuStorage::F16(s)) => write_rows(c, cl, s, sl, slots),
            (CpuStorage::BF16(c), CpuStorage::BF16(s)) => write_rows(c, cl, s, sl, slots),
            _ => candle_core::bail!("reshape_and_cache: cache and rows of one float dtype"),
        }
    }
}

/// Copies row `i` of `src` to slot `slots[i]` of `cache`, skipping padding slots.
fn write_rows<T: Copy>(
    cache: &mut [T],
    cl: &Layout,
    src: &[T],
    sl: &Layout,
    slots: &[u32],
) -> candle_core::Result<()> {
    let cache = &mut cache[cl.start_offset()..cl.start_offset() + cl.shape().elem_count()];
    let src = &src[sl.start_offset()..sl.start_offset() + sl.shape().elem_count()];
    let row = src.len() / slots.len().max(1);
    check_slots(slots, cache.len() / row.max(1)).map_err(candle_core::Error::wrap)?;
    for (i, &slot) in slots.iter().enumerate() {
        if slot != PADDING_SLOT {
            let slot = slot as usize;
            cache[slot * row..(slot + 1) * row].copy_from_slice(&src[i * row..(i + 1) * row]);
        }
    }
    Ok(())
}

fn check_cache_shapes(cache: &Tensor, rows: &Tensor) -> Result<(usize, usize)> {
    let (_, _, kv_heads, head_dim) = cache.dims4()?;
    let (_, rh, rd) = rows.dims3()?;
    let float = matches!(cache.dtype(), DType::F32 | DType::F16 | DType::BF16);
    if (rh, rd) != (kv_heads, head_dim) || !float {
        return Err(OpsError::InvalidArgument(format!(
            "cache {:?} {:?} vs rows {:?}",
            cache.dims(),
            cache.dtype(),
            rows.dims()
        )));
    }
    Ok((kv_heads, head_dim))
}

/// Write `rows` (`[n, num_kv_heads, head_dim]`, converted to the cache's dtype) into `cache`
/// (f32, f16 or bf16) at `slots` (`[n]` u32), in place. A [`PADDING_SLOT`] writes nothing; any
/// other slot past the cache is an error and nothing is written. On CUDA the slots are copied
/// back to the host for that check (a stream synchronisation); [`reshape_and_cache_mapped`]
/// avoids it.
pub fn reshape_and_cache(cache: &Tensor, rows: &Tensor, slots: &Tensor) -> Result<()> {
    check_cache_shapes(cache, rows)?;
    let rows = rows.to_dtype(cache.dtype())?.contiguous()?;
    let op = ReshapeAndCache {
        host_slots: HostSlots::Unknown,
    };
    Ok(cache.inplace_op3(&rows, &slots.contiguous()?, &op)?)
}

/// One step's slots, on the host for the bounds check and on the device for the kernel: built
/// once per step and used by every layer, so that no layer copies its slots back.
#[derive(Debug, Clone)]
pub struct SlotMapping {
    /// `None` for slots checked by the caller before each use ([`Self::prechecked`]).
    host: Option<Vec<u32>>,
    device: Tensor,
}

impl SlotMapping {
    /// Uploads `slots` to `device` and keeps them.
    pub fn new(slots: Vec<u32>, device: &Device) -> Result<Self> {
        let device = crate::step_graph::upload_u32(&slots, device, "slots")?;
        Ok(Self {
            host: Some(slots),
            device,
        })
    }

    /// Slots that live on the device only (a view of a step buffer), which the caller checks on
    /// the host with [`check_slots`] before every step that writes through them.
    pub fn prechecked(device: Tensor) -> Self {
        Self { host: None, device }
    }

    /// The slots on the host, where this mapping has them.
    pub fn host(&self) -> Option<&[u32]> {
        self.host.as_deref()
    }

    /// The slots as a `[n]` u32 tensor on the device.
    pub fn tensor(&self) -> &Tensor {
        &self.device
    }
}

/// [`reshape_and_cache`] with slots whose host copy does the bounds check.
pub fn reshape_and_cache_mapped(cache: &Tensor, rows: &Tensor, slots: &SlotMapping) -> Result<()> {
    check_cache_shapes(cache, rows)?;
    let rows = rows.to_dtype(cache.dtype())?.contiguous()?;
    let op = ReshapeAndCache {
        host_slots: match &slots.host {
            Some(host) => HostSlots::Known(host),
            None => HostSlots::Checked,
        },
    };
    Ok(cache.inplace_op3(&rows, &slots.device, &op)?)
}

/// Reference: returns a new cache with each row scattered into its slot, one basic op per row
/// (padding slots skipped).
pub fn reshape_and_cache_slow(cache: &Tensor, rows: &Tensor, slots: &[u32]) -> Result<Tensor> {
    let (num_blocks, block_size, kv_heads, head_dim) = cache.dims4()?;
    let mut flat = cache.reshape((num_blocks * block_size, kv_heads * head_dim))?;
    for (i, &slot) in slots.iter().enumerate() {
        if slot == PADDING_SLOT {
            continue;
        }
        let row = rows.get(i)?.reshape((1, kv_heads * head_dim))?;
        flat = flat.slice_scatter0(&row, slot as usize)?;
    }
    Ok(flat.reshape((num_blocks, block_size, kv_heads, head_dim))?)
}

/// One step's [`PagedAttentionMetadata`], validated once against the cache and, on a GPU,
/// uploaded once (block tables, each query row's sequence and position): every layer of the
/// step attends through the same plan instead of copying its metadata again.
#[derive(Debug, Clone)]
pub struct PagedAttentionPlan {
    meta: PagedAttentionMetadata,
    num_blocks: usize,
    num_tokens: usize,
    device_rows: Option<DeviceRows>,
    /// The uploaded `prefill_attention` tiles, made by the first layer that runs the kernel.
    prefill_tiles: std::sync::OnceLock<PrefillTiles>,
}

/// [`PagedAttentionMetadata::prefill_tiles`] on the device, for one query-group size.
#[derive(Debug, Clone)]
pub struct PrefillTiles {
    /// Query heads per KV head the tiles were cut for.
    pub group: usize,
    /// `[num_tiles, 3]` u32.
    pub tiles: Tensor,
    pub num_tiles: usize,
}

/// Environment variable that picks the CUDA attention of prefill steps: `rows` runs the row
/// kernel (`paged_attention`, also used for decode) instead of the tensor-core
/// `prefill_attention`, for comparisons on the GPU.
pub const PREFILL_ATTENTION_ENV: &str = "TRIAGE_PREFILL_ATTENTION";

/// [`KernelRows`] as `u32` tensors on the device (what the CUDA kernel reads).
#[derive(Debug, Clone)]
pub struct DeviceRows {
    pub block_tables: Tensor,
    pub row_seq: Tensor,
    pub row_pos: Tensor,
    pub max_blocks_per_seq: usize,
    pub max_context_len: usize,
}

impl PagedAttentionPlan {
    /// Validates `meta` for a cache of `num_blocks` blocks; on a CUDA `device` also uploads its
    /// kernel rows (one host-to-device copy per step).
    pub fn new(meta: PagedAttentionMetadata, num_blocks: usize, device: &Device) -> Result<Self> {
        let num_tokens = meta.query_lens.iter().sum();
        meta.validate(num_tokens, num_blocks)?;
        let device_rows = if device.is_cuda() {
            let rows = meta.kernel_rows();
            let upload = crate::step_graph::upload_u32;
            Some(DeviceRows {
                block_tables: upload(&rows.block_tables, device, "block tables")?,
                row_seq: upload(&rows.row_seq, device, "row sequences")?,
                row_pos: upload(&rows.row_pos, device, "row positions")?,
                max_blocks_per_seq: rows.max_blocks_per_seq,
                max_context_len: rows.max_context_len,
            })
        } else {
            None
        };
        Ok(Self {
            meta,
            num_blocks,
            num_tokens,
            device_rows,
            prefill_tiles: std::sync::OnceLock::new(),
        })
    }

    /// The tiles for `prefill_attention` when a CUDA step should run it: some sequence queries
    /// more than one row (a prefill chunk), the caches are f16 or bf16 with a head dim the
    /// kernel is built for and start on a 16-byte boundary, and [`PREFILL_ATTENTION_ENV`] does
    /// not ask for the row kernel. Uploaded once per plan.
    fn prefill_tiles_for(&self, q: &Tensor, k_cache: &Tensor) -> Result<Option<&PrefillTiles>> {
        let (_, num_heads, head_dim) = q.dims3()?;
        let (_, _, kv_heads, _) = k_cache.dims4()?;
        let group = num_heads / kv_heads;
        let half = matches!(k_cache.dtype(), DType::F16 | DType::BF16);
        let aligned = k_cache.layout().start_offset().is_multiple_of(8);
        // Read once per process: every layer of every prefill step asks.
        static CHOSEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let chosen = *CHOSEN.get_or_init(|| {
            std::env::var(PREFILL_ATTENTION_ENV).map_or(true, |v| v.trim() != "rows")
        });
        if !self.meta.query_lens.iter().any(|&n| n > 1)
            || !half
            || !aligned
            || !crate::launch::PREFILL_HEAD_DIMS.contains(&head_dim)
            || !chosen
        {
            return Ok(None);
        }
        if let Some(tiles) = self.prefill_tiles.get() {
            return if tiles.group == group {
                Ok(Some(tiles))
            } else {
                Err(OpsError::InvalidArgument(format!(
                    "a plan tiled for groups of {} used with groups of {group}",
                    tiles.group
                )))
            };
        }
        let rows = crate::launch::prefill_tile_rows(crate::launch::PREFILL_ATTENTION_THREADS);
        let words = self.meta.prefill_tiles(group, rows);
        let tiles = PrefillTiles {
            group,
            num_tiles: words.len() / 3,
            tiles: crate::step_graph::upload_u32(&words, q.device(), "prefill tiles")?,
        };
        Ok(Some(self.prefill_tiles.get_or_init(|| tiles)))
    }

    pub fn metadata(&self) -> &PagedAttentionMetadata {
        &self.meta
    }

    /// The uploaded kernel rows (a plan made for a CUDA device only).
    pub fn device_rows(&self) -> Option<&DeviceRows> {
        self.device_rows.as_ref()
    }
}

/// Causal attention of `q` (`[num_tokens, num_heads, head_dim]`) over paged `k_cache`/`v_cache`
/// (already holding this step's K/V). Returns `[num_tokens, num_heads, head_dim]` f32. Makes a
/// one-off [`PagedAttentionPlan`]; a forward pass over many layers makes one per step and calls
/// [`paged_attention_planned`].
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttentionMetadata,
) -> Result<Tensor> {
    check_inputs(q, k_cache, v_cache, meta)?;
    let plan = PagedAttentionPlan::new(meta.clone(), k_cache.dim(0)?, q.device())?;
    paged_attention_planned(q, k_cache, v_cache, &plan)
}

/// [`paged_attention`] through a plan made for this cache. On the CPU (caches in f32, f16 or
/// bf16) prefill and decode rows alike run [`crate::flash_attention`], which reads each key
/// through the block table in place. CUDA tensors run, for a step with a prefill chunk over f16
/// or bf16 caches, the tensor-core kernel of `kernels/prefill_attention.cu`
/// (`cuda::prefill_attention_cuda`); otherwise (decode steps, f32 caches, other head
/// dims) the row kernel of `kernels/paged_attention.cu`
/// (`cuda::paged_attention_cuda`), both on the plan's uploaded rows.
pub fn paged_attention_planned(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    plan: &PagedAttentionPlan,
) -> Result<Tensor> {
    check_shapes(q, k_cache, v_cache, plan.meta.block_size)?;
    if k_cache.dim(0)? != plan.num_blocks || q.dim(0)? != plan.num_tokens {
        return Err(OpsError::InvalidArgument(format!(
            "a plan for {} rows over {} blocks used for {} rows over {}",
            plan.num_tokens,
            plan.num_blocks,
            q.dim(0)?,
            k_cache.dim(0)?
        )));
    }
    if q.device().is_cuda() {
        let rows = plan.device_rows.as_ref().ok_or_else(|| {
            OpsError::InvalidArgument("paged_attention: a CPU plan for CUDA tensors".into())
        })?;
        if let Some(tiles) = plan.prefill_tiles_for(q, k_cache)? {
            return cuda::prefill_attention_cuda(q, k_cache, v_cache, rows, tiles);
        }
        return cuda::paged_attention_cuda(q, k_cache, v_cache, rows);
    }
    let meta = &plan.meta;
    let seqs: Vec<SeqKeys> = (0..meta.block_tables.len())
        .map(|s| SeqKeys {
            block_table: &meta.block_tables[s],
            block_size: meta.block_size,
            seq_len: meta.seq_lens[s],
            query_len: meta.query_lens[s],
        })
        .collect();
    flash_attention_tensors(q, k_cache, v_cache, &seqs)
}

/// Attention of decode rows read entirely from device tensors (a captured step's buffer):
/// row `r` of `q` (`[rows, num_heads, head_dim]`) is the last token of sequence
/// `rows.row_seq[r]`, at position `rows.row_pos[r]`, whose blocks are row `row_seq[r]` of
/// `rows.block_tables` (`[.., max_blocks_per_seq]`). The CUDA grid covers
/// `rows.max_context_len` keys and rows with shorter contexts leave early, so one launch serves
/// any step whose contexts fit. On a GPU the caller checks block ids and positions on the host
/// first (a kernel cannot report them); the CPU form reads the rows and checks them itself.
pub fn paged_attention_rows(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    rows: &DeviceRows,
) -> Result<Tensor> {
    let block_size = k_cache.dim(1)?;
    check_shapes(q, k_cache, v_cache, block_size)?;
    if q.device().is_cuda() {
        return cuda::paged_attention_cuda(q, k_cache, v_cache, rows);
    }
    let width = rows.max_blocks_per_seq;
    let tables = rows.block_tables.to_vec1::<u32>()?;
    let (row_seq, row_pos) = (
        rows.row_seq.to_vec1::<u32>()?,
        rows.row_pos.to_vec1::<u32>()?,
    );
    let meta = PagedAttentionMetadata {
        block_size,
        block_tables: row_seq
            .iter()
            .map(|&s| {
                let start = s as usize * width;
                tables.get(start..start + width).map(<[u32]>::to_vec)
            })
            .collect::<Option<_>>()
            .ok_or_else(|| OpsError::InvalidArgument("a row's sequence past the tables".into()))?,
        seq_lens: row_pos.iter().map(|&p| p as usize + 1).collect(),
        query_lens: vec![1; row_seq.len()],
    };
    check_inputs(q, k_cache, v_cache, &meta)?;
    let plan = PagedAttentionPlan::new(meta, k_cache.dim(0)?, q.device())?;
    paged_attention_planned(q, k_cache, v_cache, &plan)
}

/// Shapes, dtypes and devices of the query and caches agree with each other and with the
/// metadata; block ids lie inside the cache.
pub(crate) fn check_inputs(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttentionMetadata,
) -> Result<()> {
    check_shapes(q, k_cache, v_cache, meta.block_size)?;
    meta.validate(q.dim(0)?, k_cache.dim(0)?)
}

/// Shapes, dtypes and devices of the query and caches agree with each other and the block size.
fn check_shapes(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, block_size: usize) -> Result<()> {
    let (_, num_heads, head_dim) = q.dims3()?;
    let (_, cache_block_size, kv_heads, kd) = k_cache.dims4()?;
    let same_device = |t: &Tensor| t.device().same_device(q.device());
    if kd != head_dim
        || cache_block_size != block_size
        || kv_heads == 0
        || num_heads % kv_heads != 0
        || v_cache.dims() != k_cache.dims()
        || v_cache.dtype() != k_cache.dtype()
        || !same_device(k_cache)
        || !same_device(v_cache)
    {
        return Err(OpsError::InvalidArgument(format!(
            "q {:?}, k cache {:?}, v cache {:?}",
            q.dims(),
            k_cache.dims(),
            v_cache.dims()
        )));
    }
    Ok(())
}

/// Reference: per sequence, gather K/V token by token through the block table, then plain
/// softmax(QKᵀ/√d + causal mask)·V per head.
pub fn paged_attention_slow(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttentionMetadata,
) -> Result<Tensor> {
    let (num_tokens, num_heads, head_dim) = q.dims3()?;
    let (num_blocks, block_size, kv_heads, _) = k_cache.dims4()?;
    meta.validate(num_tokens, num_blocks)?;
    let k_flat = k_cache.reshape((num_blocks * block_size, kv_heads, head_dim))?;
    let v_flat = v_cache.reshape((num_blocks * block_size, kv_heads, head_dim))?;
    let groups = num_heads / kv_heads;
    let mut outputs = Vec::new();
    let mut start = 0;
    for s in 0..meta.block_tables.len() {
        let (qlen, slen) = (meta.query_lens[s], meta.seq_lens[s]);
        let slots: Vec<u32> = (0..slen)
            .map(|p| slot_of(&meta.block_tables[s], block_size, p))
            .collect();
        let slots = Tensor::new(slots.as_slice(), q.device())?;
        let k = k_flat.index_select(&slots, 0)?; // [slen, kv_heads, d]
        let v = v_flat.index_select(&slots, 0)?;
        let mask: Vec<f32> = (0..qlen)
            .flat_map(|i| {
                (0..slen).map(move |j| {
                    if j <= slen - qlen + i {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (qlen, slen), q.device())?;
        let mut heads = Vec::with_capacity(num_heads);
        for h in 0..num_heads {
            let qh = q
                .narrow(0, start, qlen)?
                .narrow(1, h, 1)?
                .squeeze(1)?
                .to_dtype(DType::F32)?;
            let kh = k.narrow(1, h / groups, 1)?.squeeze(1)?;
            let vh = v.narrow(1, h / groups, 1)?.squeeze(1)?;
            let scores = ((qh.matmul(&kh.t()?)? / (head_dim as f64).sqrt())? + &mask)?;
            let max = scores.max_keepdim(1)?;
            let e = scores.broadcast_sub(&max)?.exp()?;
            let p = e.broadcast_div(&e.sum_keepdim(1)?)?;
            heads.push(p.matmul(&vh)?);
        }
        outputs.push(Tensor::stack(&heads, 1)?); // [qlen, heads, d]
        start += qlen;
    }
    Ok(Tensor::cat(&outputs, 0)?)
}
