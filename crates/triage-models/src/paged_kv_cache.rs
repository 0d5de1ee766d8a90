//! The paged KV cache as an `AttentionBackend`: per-layer `[num_blocks, block_size, kv_heads,
//! head_dim]` tensors in the cache's dtype, on the model's device; a `PagedStep` carries one
//! forward pass's block tables and slots, so several sequences (prefills over cached prefixes and
//! decodes) run in one batch. A step checks and uploads its metadata once, for every layer.

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use triage_ops::{
    paged_attention_planned, paged_attention_rows, reshape_and_cache_mapped, slot_of, DeviceRows,
    PagedAttentionMetadata, PagedAttentionPlan, SlotMapping,
};
use triage_ops::{rope_and_cache, QkvShape, RopeInputs};

use crate::attention::{attend_split, AttentionBackend};
use crate::config::ModelConfig;
use crate::layers::RopeAt;
use crate::Result;

/// K and V blocks for every layer of one model. A clone shares the blocks (candle tensors share
/// their storage): a captured decode step holds one to write and read the same memory.
#[derive(Debug, Clone)]
pub struct PagedKvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    block_size: usize,
    num_blocks: usize,
    dtype: DType,
    device: Device,
}

impl PagedKvCache {
    /// Allocate `num_blocks` blocks per layer in `dtype` on `device`, filled with `fill` (tests
    /// use NaN). Caches are f32, f16 or bf16, on the CPU as on a GPU.
    pub fn new(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        fill: f32,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        check_kv_dtype(dtype, device)?;
        let shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim);
        let mut k = Vec::with_capacity(config.num_layers);
        let mut v = Vec::with_capacity(config.num_layers);
        // Made in `dtype` directly: an f32 tensor first would briefly take twice a bf16 budget.
        // On the CPU the blocks are written now, even with zeros (see `written`).
        let num_elements = num_blocks * block_size * config.num_kv_heads * config.head_dim;
        let filled = || -> Result<Tensor> {
            if device.is_cpu() {
                return Ok(match dtype {
                    DType::F16 => {
                        Tensor::from_vec(written(num_elements, f16::from_f32(fill)), shape, device)?
                    }
                    DType::BF16 => Tensor::from_vec(
                        written(num_elements, bf16::from_f32(fill)),
                        shape,
                        device,
                    )?,
                    _ => Tensor::from_vec(written(num_elements, fill), shape, device)?,
                });
            }
            let zeros = Tensor::zeros(shape, dtype, device)?;
            Ok(if fill == 0.0 {
                zeros
            } else {
                zeros.affine(1.0, f64::from(fill))?
            })
        };
        for _ in 0..config.num_layers {
            k.push(filled()?);
            v.push(filled()?);
        }
        Ok(Self {
            k,
            v,
            block_size,
            num_blocks,
            dtype,
            device: device.clone(),
        })
    }

    /// Layer `layer_idx`'s K and V blocks.
    fn layer(&self, layer_idx: usize) -> Result<(&Tensor, &Tensor)> {
        match (self.k.get(layer_idx), self.v.get(layer_idx)) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(crate::ModelError::Invalid(format!(
                "layer {layer_idx} of a cache of {} layers",
                self.k.len()
            ))),
        }
    }

    /// The dtype K and V are stored in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the blocks live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Blocks per layer.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of layers (one K and one V tensor each).
    pub fn num_layers(&self) -> usize {
        self.k.len()
    }

    /// Copies of `blocks` from every layer: `(k, v)`, each `[blocks.len(), block_size, kv_heads,
    /// head_dim]` per layer, on the cache's device in its dtype (what a persisted prefix stores,
    /// after the caller copies it to the host).
    pub fn read_blocks(&self, blocks: &[u32]) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let ids = Tensor::new(blocks, &self.device)?;
        let read = |t: &Tensor| t.index_select(&ids, 0);
        let k = self
            .k
            .iter()
            .map(read)
            .collect::<candle_core::Result<_>>()?;
        let v = self
            .v
            .iter()
            .map(read)
            .collect::<candle_core::Result<_>>()?;
        Ok((k, v))
    }

    /// Overwrite `blocks` in every layer with `k[layer]` and `v[layer]`, shaped as
    /// [`Self::read_blocks`] returns them, from any device and dtype (a prefix read from disk is
    /// on the host; it is copied to the cache's device and dtype here).
    /// The shape one layer's K or V takes for `num_blocks` blocks in [`Self::write_blocks`]:
    /// `[num_blocks, block_size, kv_heads, head_dim]`.
    pub fn blocks_shape(&self, num_blocks: usize) -> Result<[usize; 4]> {
        let layer = self
            .k
            .first()
            .ok_or_else(|| crate::ModelError::Invalid("a KV cache without layers".into()))?;
        let (_, block_size, heads, dim) = layer.dims4()?;
        Ok([num_blocks, block_size, heads, dim])
    }

    pub fn write_blocks(&self, blocks: &[u32], k: &[Tensor], v: &[Tensor]) -> Result<()> {
        if k.len() != self.k.len() || v.len() != self.v.len() {
            return Err(crate::ModelError::Invalid(format!(
                "{} K and {} V layers given, the cache has {}",
                k.len(),
                v.len(),
                self.k.len()
            )));
        }
        let bs = self.block_size;
        let slots: Vec<u32> = blocks
            .iter()
            .flat_map(|&b| (0..bs as u32).map(move |i| b * bs as u32 + i))
            .collect();
        let slots = SlotMapping::new(slots, self.device())?;
        for (cache, src) in self.k.iter().chain(&self.v).zip(k.iter().chain(v)) {
            let (_, _, heads, dim) = cache.dims4()?;
            if src.dims() != [blocks.len(), bs, heads, dim] {
                return Err(crate::ModelError::Invalid(format!(
                    "blocks of shape {:?} do not fit a cache of {:?}",
                    src.dims(),
                    cache.dims()
                )));
            }
            let rows = src
                .reshape((blocks.len() * bs, heads, dim))?
                .to_device(cache.device())?;
            reshape_and_cache_mapped(cache, &rows, &slots)?;
        }
        Ok(())
    }

    /// Bytes one block takes across all layers (K and V) in `dtype`, for sizing pools from a
    /// memory budget.
    pub fn bytes_per_block(config: &ModelConfig, block_size: usize, dtype: DType) -> usize {
        2 * config.num_layers
            * block_size
            * config.num_kv_heads
            * config.head_dim
            * dtype.size_in_bytes()
    }
}

/// `n` copies of `value` in memory that is written now: zeroed memory is mapped lazily, and the
/// block pool cycles through every block, so resident memory would otherwise creep up by the
/// whole budget under load (it looked like a leak in the soak benchmark). `resize` writes every
/// element, unlike `vec![0.0; n]`.
fn written<T: Copy>(n: usize, value: T) -> Vec<T> {
    let mut data = Vec::with_capacity(n);
    data.resize(n, value);
    data
}

/// The KV dtype a device gets unless configured: bf16 on a GPU (half the bytes, the models' own
/// precision); f16 on the CPU (half the bytes of f32, and three more mantissa bits than bf16;
/// what llama.cpp keeps too).
pub fn default_kv_dtype(device: &Device) -> DType {
    match device {
        Device::Cpu => DType::F16,
        _ => DType::BF16,
    }
}

/// A KV dtype the attention kernels read: f32, f16 or bf16, on the CPU and on a GPU.
pub fn check_kv_dtype(dtype: DType, device: &Device) -> Result<()> {
    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Ok(());
    }
    Err(crate::ModelError::Invalid(format!(
        "a {dtype:?} KV cache on {device:?}: caches are f32, f16 or bf16"
    )))
}

/// One sequence's part of a step.
#[derive(Debug, Clone)]
pub struct SeqStep {
    pub block_table: Vec<u32>,
    /// Tokens already in the cache before this step.
    pub num_computed_tokens: usize,
    /// Tokens run this step (appended after the computed ones).
    pub num_new_tokens: usize,
}

/// A forward pass over several sequences through the paged cache: its slots and attention plan
/// are checked and uploaded once, when the step is made, and read by every layer.
#[derive(Debug)]
pub struct PagedStep<'a> {
    cache: &'a PagedKvCache,
    plan: PagedAttentionPlan,
    slots: SlotMapping,
}

impl<'a> PagedStep<'a> {
    pub fn new(cache: &'a PagedKvCache, seqs: &[SeqStep]) -> Result<Self> {
        let bs = cache.block_size;
        let mut slots = Vec::new();
        for s in seqs {
            let end = s.num_computed_tokens + s.num_new_tokens;
            if end > s.block_table.len() * bs {
                return Err(crate::ModelError::Invalid(format!(
                    "{end} tokens do not fit {} blocks",
                    s.block_table.len()
                )));
            }
            slots.extend((s.num_computed_tokens..end).map(|p| slot_of(&s.block_table, bs, p)));
        }
        let meta = PagedAttentionMetadata {
            block_size: bs,
            block_tables: seqs.iter().map(|s| s.block_table.clone()).collect(),
            seq_lens: seqs
                .iter()
                .map(|s| s.num_computed_tokens + s.num_new_tokens)
                .collect(),
            query_lens: seqs.iter().map(|s| s.num_new_tokens).collect(),
        };
        let device = cache.device();
        Ok(Self {
            cache,
            plan: PagedAttentionPlan::new(meta, cache.num_blocks(), device)?,
            slots: SlotMapping::new(slots, device)?,
        })
    }

    /// Positions of this step's tokens, in batch order (what `Transformer::forward` takes).
    pub fn positions(&self) -> Vec<u32> {
        let meta = self.plan.metadata();
        meta.seq_lens
            .iter()
            .zip(&meta.query_lens)
            .flat_map(|(&len, &q)| (len - q) as u32..len as u32)
            .collect()
    }
}

impl PagedAttend for PagedStep<'_> {
    fn cache(&self) -> &PagedKvCache {
        self.cache
    }

    fn slots(&self) -> &SlotMapping {
        &self.slots
    }

    fn attention(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> Result<Tensor> {
        Ok(paged_attention_planned(q, k_cache, v_cache, &self.plan)?)
    }
}

impl AttentionBackend for PagedStep<'_> {
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        attend_paged(self, layer_idx, (q, k, v))
    }

    fn attend_stacked(
        &mut self,
        layer_idx: usize,
        qkv: &Tensor,
        bias: Option<&Tensor>,
        rope: &RopeAt,
        shape: QkvShape,
    ) -> Result<Tensor> {
        let stacked = Stacked {
            qkv,
            bias,
            rope,
            shape,
        };
        attend_stacked_paged(self, layer_idx, stacked)
    }
}

/// What tells the paged backends apart: the cache and slots a step writes, and how Q attends.
trait PagedAttend {
    fn cache(&self) -> &PagedKvCache;
    fn slots(&self) -> &SlotMapping;
    /// Attention of `q` (`[n, heads, d]`) over one layer's caches, as `[n, heads, d]` f32.
    fn attention(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> Result<Tensor>;
}

/// [`AttentionBackend::attend`] for a paged backend.
fn attend_paged<B: PagedAttend>(
    b: &B,
    layer_idx: usize,
    qkv: (&Tensor, &Tensor, &Tensor),
) -> Result<Tensor> {
    write_and_attend(b.cache(), layer_idx, b.slots(), qkv, |q, kc, vc| {
        b.attention(q, kc, vc)
    })
}

/// [`AttentionBackend::attend_stacked`] for a paged backend: the fused kernel where the cache
/// shares the projection's dtype, the ops one by one otherwise.
fn attend_stacked_paged<B: PagedAttend + AttentionBackend>(
    b: &mut B,
    layer_idx: usize,
    stacked: Stacked<'_>,
) -> Result<Tensor> {
    let fused = stacked.rope_into_cache(b.cache(), layer_idx, b.slots(), |q, kc, vc| {
        b.attention(q, kc, vc)
    })?;
    match fused {
        Some(out) => Ok(out),
        None => {
            let Stacked {
                qkv,
                bias,
                rope,
                shape,
            } = stacked;
            attend_split(b, layer_idx, qkv, bias, rope, shape)
        }
    }
}

/// A layer's stacked projection with what rotates it.
struct Stacked<'a> {
    qkv: &'a Tensor,
    bias: Option<&'a Tensor>,
    rope: &'a RopeAt,
    shape: QkvShape,
}

impl Stacked<'_> {
    /// Bias, rope and the cache write in one kernel, then `attend` over Q (`[n, heads, d]`) and
    /// the layer's caches; `None` when the caches' dtype is not the projection's (the caller
    /// then runs the ops one by one).
    fn rope_into_cache(
        &self,
        cache: &PagedKvCache,
        layer_idx: usize,
        slots: &SlotMapping,
        attend: impl FnOnce(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        let (k_cache, v_cache) = cache.layer(layer_idx)?;
        if k_cache.dtype() != self.qkv.dtype() {
            return Ok(None);
        }
        let inputs = RopeInputs {
            qkv: self.qkv,
            bias: self.bias,
            cos: self.rope.cos(),
            sin: self.rope.sin(),
        };
        let q = rope_and_cache(inputs, k_cache, v_cache, slots, self.shape)?;
        let (n, heads, d) = q.dims3()?;
        Ok(Some(attend(&q, k_cache, v_cache)?.reshape((n, heads * d))?))
    }
}

/// One layer's attention through the paged cache: `k` and `v` (`[kv_heads, n, d]`) written to
/// `slots`, then `attend` over `q` as `[n, heads, d]` and the layer's caches; returns
/// `[n, heads · d]`.
fn write_and_attend(
    cache: &PagedKvCache,
    layer_idx: usize,
    slots: &SlotMapping,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    attend: impl FnOnce(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let (k_cache, v_cache) = cache.layer(layer_idx)?;
    reshape_and_cache_mapped(k_cache, &k.transpose(0, 1)?.contiguous()?, slots)?;
    reshape_and_cache_mapped(v_cache, &v.transpose(0, 1)?.contiguous()?, slots)?;
    let q = q.transpose(0, 1)?.contiguous()?; // [n, heads, d]
    let (n, heads, d) = q.dims3()?;
    let out = attend(&q, k_cache, v_cache)?;
    Ok(out.reshape((n, heads * d))?)
}

/// A decode step whose every input is a device tensor (views of a captured step's buffer): row
/// `r` writes its K/V to `slots[r]` and attends through `rows`. The caller checks slots, block
/// ids and positions on the host before each run, since neither the cache write nor the
/// attention kernel can report them.
#[derive(Debug)]
pub struct DeviceDecodeStep<'a> {
    cache: &'a PagedKvCache,
    rows: &'a DeviceRows,
    slots: SlotMapping,
}

impl<'a> DeviceDecodeStep<'a> {
    /// `slots`: `[rows]` u32, [`triage_ops::PADDING_SLOT`] for padding rows.
    pub fn new(cache: &'a PagedKvCache, rows: &'a DeviceRows, slots: Tensor) -> Self {
        Self {
            cache,
            rows,
            slots: SlotMapping::prechecked(slots),
        }
    }
}

impl PagedAttend for DeviceDecodeStep<'_> {
    fn cache(&self) -> &PagedKvCache {
        self.cache
    }

    fn slots(&self) -> &SlotMapping {
        &self.slots
    }

    fn attention(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> Result<Tensor> {
        Ok(paged_attention_rows(q, k_cache, v_cache, self.rows)?)
    }
}

impl AttentionBackend for DeviceDecodeStep<'_> {
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        attend_paged(self, layer_idx, (q, k, v))
    }

    fn attend_stacked(
        &mut self,
        layer_idx: usize,
        qkv: &Tensor,
        bias: Option<&Tensor>,
        rope: &RopeAt,
        shape: QkvShape,
    ) -> Result<Tensor> {
        let stacked = Stacked {
            qkv,
            bias,
            rope,
            shape,
        };
        attend_stacked_paged(self, layer_idx, stacked)
    }
}

/// One sequence through the paged cache, for callers with no scheduler (model tests, a device
/// check): the cache's blocks in order hold positions from 0, and each layer appends after the
/// tokens it already holds, so a prompt may be run in one pass, in chunks, or token by token.
#[derive(Debug)]
pub struct PagedSequence {
    cache: PagedKvCache,
    block_table: Vec<u32>,
    /// Tokens each layer holds.
    layer_lens: Vec<usize>,
}

impl PagedSequence {
    /// Room for `capacity` tokens of a model with `config`, in `dtype` on `device` (unused slots
    /// hold NaN, so a read past the sequence shows).
    pub fn new(
        config: &ModelConfig,
        capacity: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let block_size = 16;
        let num_blocks = capacity.div_ceil(block_size).max(1);
        let cache = PagedKvCache::new(config, num_blocks, block_size, f32::NAN, dtype, device)?;
        Ok(Self {
            block_table: (0..num_blocks as u32).collect(),
            layer_lens: vec![0; config.num_layers],
            cache,
        })
    }

    /// Tokens stored (in layer 0).
    pub fn len(&self) -> usize {
        self.layer_lens.first().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AttentionBackend for PagedSequence {
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let stored = *self
            .layer_lens
            .get(layer_idx)
            .ok_or_else(|| crate::ModelError::Invalid(format!("layer {layer_idx} out of range")))?;
        let seq = SeqStep {
            block_table: self.block_table.clone(),
            num_computed_tokens: stored,
            num_new_tokens: k.dim(1)?,
        };
        let out = PagedStep::new(&self.cache, &[seq])?.attend(layer_idx, q, k, v)?;
        self.layer_lens[layer_idx] += k.dim(1)?;
        Ok(out)
    }
}
