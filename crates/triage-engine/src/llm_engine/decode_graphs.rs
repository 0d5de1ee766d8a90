//! Decode steps through captured graphs (`EngineConfig::cuda_graphs`, vLLM's opposite of
//! `--enforce-eager`): a step whose rows are all single-token decodes is padded up to a batch
//! bucket and replayed from that bucket's capture, its inputs written to the bucket's step
//! buffer in one upload first. Prefill, mixed steps and steps that want hidden states run
//! eagerly. The graphs are made for one model and one KV pool and hold both, so a new pool or
//! model (a new engine) starts with none.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;
use triage_models::model::Model;
use triage_models::paged_kv_cache::{DeviceDecodeStep, PagedKvCache, SeqStep};
use triage_models::transformer::ForwardInputs;
use triage_ops::OpsError;
use triage_ops::{check_slots, slot_of, DeviceRows, PagedAttentionMetadata, PADDING_SLOT};
use triage_ops::{StepBuffer, StepGraph};

use crate::{EngineError, Result};

/// Row counts a decode step is padded up to: one capture each, made when first needed.
pub const DECODE_BUCKETS: [usize; 11] = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64];

/// The bucket `rows` decode rows run in, if any holds them.
pub fn bucket_for(rows: usize) -> Option<usize> {
    DECODE_BUCKETS.iter().copied().find(|&b| b >= rows)
}

/// One bucket's capture: its inputs, the graph that reads them and the logits it writes.
struct BucketGraph {
    buffer: StepBuffer,
    graph: StepGraph,
    /// `[bucket, vocab]` in the LM head's dtype, rewritten by every replay.
    logits: Tensor,
}

/// Where each input lives in a bucket's buffer: token ids, positions, slots and row sequences
/// (`bucket` each), then the block tables (`bucket × max_blocks_per_seq`).
#[derive(Debug, Clone, Copy)]
struct BufferLayout {
    bucket: usize,
    max_blocks_per_seq: usize,
}

impl BufferLayout {
    fn len(self) -> usize {
        self.bucket * (4 + self.max_blocks_per_seq)
    }

    fn views(
        self,
        buffer: &StepBuffer,
        block_size: usize,
    ) -> Result<(ForwardInputs, DeviceRows, Tensor)> {
        let b = self.bucket;
        let positions = buffer.view(b, b)?;
        let inputs = ForwardInputs {
            token_ids: buffer.view(0, b)?,
            positions: positions.clone(),
            logits_rows: None,
        };
        let rows = DeviceRows {
            block_tables: buffer.view(4 * b, b * self.max_blocks_per_seq)?,
            row_seq: buffer.view(3 * b, b)?,
            row_pos: positions,
            max_blocks_per_seq: self.max_blocks_per_seq,
            // The grid covers the longest context any row may have; shorter rows leave early.
            max_context_len: self.max_blocks_per_seq * block_size,
        };
        Ok((inputs, rows, buffer.view(2 * b, b)?))
    }

    /// The buffer's contents for `ids` (one per row) over `seqs`: padding rows take token 0 at
    /// position 0, write nothing and read block 0.
    fn fill(self, ids: &[u32], seqs: &[SeqStep], block_size: usize) -> Vec<u32> {
        let (b, w) = (self.bucket, self.max_blocks_per_seq);
        let mut data = vec![0u32; self.len()];
        for (r, (s, &id)) in seqs.iter().zip(ids).enumerate() {
            let pos = s.num_computed_tokens;
            data[r] = id;
            data[b + r] = pos as u32;
            data[2 * b + r] = slot_of(&s.block_table, block_size, pos);
            data[4 * b + r * w..4 * b + r * w + s.block_table.len()]
                .copy_from_slice(&s.block_table);
        }
        data[2 * b + seqs.len()..3 * b].fill(PADDING_SLOT);
        for (r, seq) in data[3 * b..4 * b].iter_mut().enumerate() {
            *seq = r as u32;
        }
        data
    }
}

/// The captured decode steps of one engine.
pub(super) struct DecodeGraphs {
    model: Arc<Model>,
    cache: PagedKvCache,
    /// Widest block table a captured step holds: the whole context, or the whole pool if less.
    max_blocks_per_seq: usize,
    captured: HashMap<usize, BucketGraph>,
}

impl DecodeGraphs {
    /// Graphs for `model` over `cache` (a clone sharing the engine's blocks).
    pub(super) fn new(model: Arc<Model>, cache: PagedKvCache) -> Self {
        let tokens = model
            .transformer
            .max_positions()
            .min(cache.num_blocks() * cache.block_size());
        Self {
            max_blocks_per_seq: tokens.div_ceil(cache.block_size()).max(1),
            model,
            cache,
            captured: HashMap::new(),
        }
    }

    /// Whether a step of `seqs` (each running `ids`' token at its end) can replay a capture.
    pub(super) fn fits(&self, seqs: &[SeqStep]) -> bool {
        bucket_for(seqs.len()).is_some()
            && seqs
                .iter()
                .all(|s| s.num_new_tokens == 1 && s.block_table.len() <= self.max_blocks_per_seq)
    }

    /// Buckets captured so far.
    pub(super) fn num_captured(&self) -> usize {
        self.captured.len()
    }

    /// `[bucket, nodes]` of each CUDA graph, by bucket (none on the CPU).
    pub(super) fn node_counts(&self) -> Result<Vec<[usize; 2]>> {
        let mut counts = Vec::new();
        for (&bucket, graph) in &self.captured {
            if let Some(nodes) = graph.graph.num_nodes()? {
                counts.push([bucket, nodes]);
            }
        }
        counts.sort_unstable();
        Ok(counts)
    }

    /// The logits (`[seqs.len(), vocab]`, the LM head's dtype) of one decode step: its inputs are checked on the
    /// host, written to the bucket's buffer, and the bucket's graph replays (captured first if
    /// this is the bucket's first step). The tensor is the bucket's output, valid until the next
    /// step.
    pub(super) fn run(&mut self, ids: &[u32], seqs: &[SeqStep]) -> Result<Tensor> {
        if !self.fits(seqs) || ids.len() != seqs.len() {
            return Err(EngineError::Invalid(format!(
                "a step of {} rows and {} tokens replayed from a decode graph",
                seqs.len(),
                ids.len()
            )));
        }
        self.check(ids, seqs)?;
        let bucket = bucket_for(seqs.len()).unwrap_or(seqs.len()); // `fits` found one.
        let layout = BufferLayout {
            bucket,
            max_blocks_per_seq: self.max_blocks_per_seq,
        };
        let data = layout.fill(ids, seqs, self.cache.block_size());
        match self.captured.get_mut(&bucket) {
            Some(graph) => graph.buffer.write(&data)?,
            None => {
                let graph = self.capture(layout, &data)?;
                self.captured.insert(bucket, graph);
            }
        }
        let graph = self.captured.get(&bucket).ok_or_else(|| {
            EngineError::Invalid(format!("decode bucket {bucket} was not captured"))
        })?;
        graph.graph.replay()?;
        Ok(graph.logits.narrow(0, 0, seqs.len())?)
    }

    /// Host checks a replay cannot make: token ids and positions for the model, block ids,
    /// context lengths and slots for the pool.
    fn check(&self, ids: &[u32], seqs: &[SeqStep]) -> Result<()> {
        let bs = self.cache.block_size();
        let positions: Vec<u32> = seqs.iter().map(|s| s.num_computed_tokens as u32).collect();
        self.model.transformer.check_tokens(ids, &positions)?;
        let meta = PagedAttentionMetadata {
            block_size: bs,
            block_tables: seqs.iter().map(|s| s.block_table.clone()).collect(),
            seq_lens: seqs.iter().map(|s| s.num_computed_tokens + 1).collect(),
            query_lens: vec![1; seqs.len()],
        };
        meta.validate(seqs.len(), self.cache.num_blocks())?;
        let slots: Vec<u32> = seqs
            .iter()
            .map(|s| slot_of(&s.block_table, bs, s.num_computed_tokens))
            .collect();
        check_slots(&slots, self.cache.num_blocks() * bs)?;
        Ok(())
    }

    /// A new bucket: its buffer written with this step's inputs, and the step captured over it.
    fn capture(&self, layout: BufferLayout, data: &[u32]) -> Result<BucketGraph> {
        let device = self.model.transformer.device();
        let mut buffer = StepBuffer::new(layout.len(), device)?;
        buffer.write(data)?;
        let transformer = &self.model.transformer;
        let vocab = transformer.config().vocab_size;
        let logits = Tensor::zeros((layout.bucket, vocab), transformer.logits_dtype(), device)?;
        let (inputs, rows, slots) = layout.views(&buffer, self.cache.block_size())?;
        let (model, cache, out) = (Arc::clone(&self.model), self.cache.clone(), logits.clone());
        let graph = StepGraph::capture(device, move || {
            let step = || -> Result<()> {
                let mut attn = DeviceDecodeStep::new(&cache, &rows, slots.clone());
                let (step_logits, _) = model.transformer.forward_inputs(&inputs, &[], &mut attn)?;
                out.slice_set(&step_logits, 0, 0)?;
                Ok(())
            };
            step().map_err(|e| OpsError::Step(e.to_string()))
        })?;
        Ok(BucketGraph {
            buffer,
            graph,
            logits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_pad_up_to_the_next_bucket() {
        assert_eq!(bucket_for(0), Some(1));
        assert_eq!(bucket_for(1), Some(1));
        assert_eq!(bucket_for(8), Some(8));
        assert_eq!(bucket_for(9), Some(16));
        assert_eq!(bucket_for(33), Some(64));
        assert_eq!(bucket_for(64), Some(64));
        assert_eq!(bucket_for(65), None);
    }

    #[test]
    fn padding_rows_write_nothing_and_read_block_zero() {
        let layout = BufferLayout {
            bucket: 4,
            max_blocks_per_seq: 3,
        };
        let seqs = [
            SeqStep {
                block_table: vec![5, 9],
                num_computed_tokens: 17,
                num_new_tokens: 1,
            },
            SeqStep {
                block_table: vec![2],
                num_computed_tokens: 0,
                num_new_tokens: 1,
            },
        ];
        let data = layout.fill(&[11, 12], &seqs, 16);
        assert_eq!(data.len(), layout.len());
        assert_eq!(&data[0..4], [11, 12, 0, 0]); // token ids
        assert_eq!(&data[4..8], [17, 0, 0, 0]); // positions
        assert_eq!(
            &data[8..12],
            [9 * 16 + 1, 2 * 16, PADDING_SLOT, PADDING_SLOT]
        );
        assert_eq!(&data[12..16], [0, 1, 2, 3]); // each row its own table
        assert_eq!(&data[16..], [5, 9, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
}
