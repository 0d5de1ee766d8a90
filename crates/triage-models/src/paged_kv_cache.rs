//! The paged KV cache as an `AttentionBackend`: per-layer `[num_blocks, block_size, kv_heads,
//! head_dim]` tensors; a `PagedStep` carries one forward pass's block tables and slots, so
//! several sequences (prefills over cached prefixes and decodes) run in one batch.

use candle_core::{DType, Device, Tensor};
use triage_ops::paged_attention::{
    paged_attention, reshape_and_cache, slot_of, PagedAttentionMetadata,
};

use crate::attention::AttentionBackend;
use crate::config::ModelConfig;
use crate::Result;

/// K and V blocks for every layer of one model.
#[derive(Debug)]
pub struct PagedKvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    block_size: usize,
}

impl PagedKvCache {
    /// Allocate `num_blocks` blocks per layer (f32 on CPU), filled with `fill` (tests use NaN).
    pub fn new(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        fill: f32,
        device: &Device,
    ) -> Result<Self> {
        let shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim);
        let mut k = Vec::with_capacity(config.num_layers);
        let mut v = Vec::with_capacity(config.num_layers);
        for _ in 0..config.num_layers {
            k.push(Tensor::full(fill, shape, device)?.to_dtype(DType::F32)?);
            v.push(Tensor::full(fill, shape, device)?.to_dtype(DType::F32)?);
        }
        Ok(Self { k, v, block_size })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of layers (one K and one V tensor each).
    pub fn num_layers(&self) -> usize {
        self.k.len()
    }

    /// Copies of `blocks` from every layer: `(k, v)`, each `[blocks.len(), block_size, kv_heads,
    /// head_dim]` per layer (what a persisted prefix stores).
    pub fn read_blocks(&self, blocks: &[u32]) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let ids = Tensor::new(blocks, self.k[0].device())?;
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
    /// [`Self::read_blocks`] returns them.
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
        let slots = Tensor::new(slots.as_slice(), self.k[0].device())?;
        for (cache, src) in self.k.iter().chain(&self.v).zip(k.iter().chain(v)) {
            let (_, _, heads, dim) = cache.dims4()?;
            if src.dims() != [blocks.len(), bs, heads, dim] {
                return Err(crate::ModelError::Invalid(format!(
                    "blocks of shape {:?} do not fit a cache of {:?}",
                    src.dims(),
                    cache.dims()
                )));
            }
            let rows = src.reshape((blocks.len() * bs, heads, dim))?;
            reshape_and_cache(cache, &rows, &slots)?;
        }
        Ok(())
    }

    /// Bytes one block takes across all layers (K and V), for sizing pools from a memory budget.
    pub fn bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
        2 * config.num_layers
            * block_size
            * config.num_kv_heads
            * config.head_dim
            * std::mem::size_of::<f32>()
    }
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

/// A forward pass over several sequences through the paged cache.
#[derive(Debug)]
pub struct PagedStep<'a> {
    cache: &'a PagedKvCache,
    meta: PagedAttentionMetadata,
    slots: Tensor,
}

impl<'a> PagedStep<'a> {
    pub fn new(cache: &'a PagedKvCache, seqs: &[SeqStep], device: &Device) -> Result<Self> {
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
        Ok(Self {
            cache,
            meta,
            slots: Tensor::new(slots.as_slice(), device)?,
        })
    }

    /// Positions of this step's tokens, in batch order (what `Transformer::forward` takes).
    pub fn positions(&self) -> Vec<u32> {
        self.meta
            .seq_lens
            .iter()
            .zip(&self.meta.query_lens)
            .flat_map(|(&len, &q)| (len - q) as u32..len as u32)
            .collect()
    }
}

impl AttentionBackend for PagedStep<'_> {
    fn attend(&mut self, layer_idx: usize, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (k_cache, v_cache) = (&self.cache.k[layer_idx], &self.cache.v[layer_idx]);
        reshape_and_cache(k_cache, &k.transpose(0, 1)?.contiguous()?, &self.slots)?;
        reshape_and_cache(v_cache, &v.transpose(0, 1)?.contiguous()?, &self.slots)?;
        let q = q.transpose(0, 1)?.contiguous()?; // [n, heads, d]
        let (n, heads, d) = q.dims3()?;
        let out = paged_attention(&q, k_cache, v_cache, &self.meta)?;
        Ok(out.reshape((n, heads * d))?)
    }
}
