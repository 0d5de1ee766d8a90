//! `paged_attention_<dtype>` (with `paged_attention_merge_f32` past one partition) against
//! `triage_ops::paged_attention` on the same values in f32.

use half::{bf16, f16};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};
use triage_kernel_sim::{paged_attention, AttentionShape};
use triage_ops::launch::{MIN_THREADS, PAGED_ATTENTION_THREADS, PARTITION_SIZE};
use triage_ops::{self as ops, KernelRows, PagedAttentionMetadata};

use crate::inputs::{close, convert, normal, tensor, Dtype};

/// Both sides accumulate in f32 from the same values, in different orders (the CPU op: eight
/// lanes per dot product and one pass over the keys; the kernel: 32 lanes, per-partition sums
/// merged by log-sum-exp). Outputs are convex combinations of values of magnitude ~1; the CPU
/// op's own tolerance against its reference is 1e-4.
const ABS: f32 = 2e-4;
const REL: f32 = 1e-3;

/// Query heads sharing each KV head (grouped-query attention): 12 is more than one block serves.
const GROUPS: [usize; 4] = [1, 2, 7, 12];
pub(crate) const KV_HEADS: usize = 2;

/// The cache's row and block sizes of one case.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) head_dim: usize,
    pub(crate) block_size: usize,
    /// Offset the caches by one element from the allocation, so their rows are not 16-byte
    /// aligned and the kernel reads them element by element.
    pub(crate) misaligned: bool,
    /// Size the grid for this many keys and widen the block tables to match (padding with
    /// block 0), as a captured decode step does for the longest context it may meet.
    pub(crate) grid_context: Option<usize>,
}

const DIMS: Dims = Dims {
    head_dim: 64,
    block_size: 16,
    misaligned: false,
    grid_context: None,
};

/// One step: per sequence, (context length after the step, query rows this step).
pub(crate) struct Step {
    pub(crate) seqs: Vec<(usize, usize)>,
}

/// Block tables over shuffled block ids; every slot no sequence owns holds NaN, so a read past
/// a sequence's context poisons its output.
pub(crate) fn build(
    rng: &mut StdRng,
    step: &Step,
    groups: usize,
    dims: Dims,
) -> (
    AttentionShape,
    PagedAttentionMetadata,
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
) {
    let Dims {
        head_dim,
        block_size,
        ..
    } = dims;
    let blocks_per_seq: Vec<usize> = step
        .seqs
        .iter()
        .map(|&(len, _)| len.div_ceil(block_size))
        .collect();
    let num_blocks = blocks_per_seq.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut block_tables = Vec::new();
    let mut next = 0;
    for &n in &blocks_per_seq {
        block_tables.push(ids[next..next + n].to_vec());
        next += n;
    }
    let row = KV_HEADS * head_dim;
    let mut k_cache = vec![f32::NAN; num_blocks * block_size * row];
    let mut v_cache = k_cache.clone();
    for (s, &(len, _)) in step.seqs.iter().enumerate() {
        for pos in 0..len {
            let slot = ops::slot_of(&block_tables[s], block_size, pos) as usize;
            k_cache[slot * row..(slot + 1) * row].copy_from_slice(&normal(rng, row, 1.0));
            v_cache[slot * row..(slot + 1) * row].copy_from_slice(&normal(rng, row, 1.0));
        }
    }
    let num_heads = KV_HEADS * groups;
    let num_rows: usize = step.seqs.iter().map(|&(_, q)| q).sum();
    let q = normal(rng, num_rows * num_heads * head_dim, 1.0);
    let shape = AttentionShape {
        num_heads,
        kv_heads: KV_HEADS,
        head_dim,
        block_size,
        num_blocks,
    };
    let meta = PagedAttentionMetadata {
        block_size,
        block_tables,
        seq_lens: step.seqs.iter().map(|&(len, _)| len).collect(),
        query_lens: step.seqs.iter().map(|&(_, q)| q).collect(),
    };
    (shape, meta, q, k_cache, v_cache)
}

fn run_case<T: Dtype>(rng: &mut StdRng, step: &Step, groups: usize, threads: u32) {
    run_case_with::<T>(rng, step, groups, threads, DIMS);
}

fn run_case_with<T: Dtype>(rng: &mut StdRng, step: &Step, groups: usize, threads: u32, dims: Dims) {
    let Dims {
        head_dim,
        block_size,
        misaligned,
        grid_context,
    } = dims;
    let (shape, meta, q, k_cache, v_cache) = build(rng, step, groups, dims);
    // The kernel's dtype holds the values; the CPU op gets the same values in f32.
    let (q, k_cache, v_cache) = (
        convert::<T>(&q, 0),
        convert::<T>(&k_cache, 0),
        convert::<T>(&v_cache, 0),
    );
    let as_f32 = |xs: &[T]| xs.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
    let num_rows = q.len() / (shape.num_heads * head_dim);
    let cache_shape = [shape.num_blocks, block_size, KV_HEADS, head_dim];
    let want = ops::paged_attention(
        &tensor(&as_f32(&q), &[num_rows, shape.num_heads, head_dim]),
        &tensor(&as_f32(&k_cache), &cache_shape),
        &tensor(&as_f32(&v_cache), &cache_shape),
        &meta,
    )
    .and_then(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
    .expect("cpu op");
    meta.validate(num_rows, shape.num_blocks)
        .expect("valid metadata");
    let mut rows = meta.kernel_rows();
    if let Some(keys) = grid_context {
        rows = widened(&rows, keys.div_ceil(block_size));
        rows.max_context_len = keys;
    }
    let offset = usize::from(misaligned);
    let shifted = |cache: &[T]| {
        let mut buffer = vec![cache[0]; offset];
        buffer.extend_from_slice(cache);
        buffer
    };
    let (k_buffer, v_buffer) = (shifted(&k_cache), shifted(&v_cache));
    let (k_cache, v_cache) = (&k_buffer[offset..], &v_buffer[offset..]);
    let got = paged_attention(&shape, &rows, &q, k_cache, v_cache, threads).expect("launch");
    let context = format!(
        "{:?} seqs {:?} groups {groups} threads {threads} {dims:?}",
        T::DTYPE,
        step.seqs
    );
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(!w.is_nan(), "{context}: the CPU op read a NaN slot at {i}");
        assert!(
            close(g, w, ABS, REL),
            "{context}: element {i}: kernel {g}, cpu {w}"
        );
    }
}

/// `rows` with block tables `width` blocks wide, padded with block 0.
fn widened(rows: &KernelRows, width: usize) -> KernelRows {
    let old = rows.max_blocks_per_seq;
    let mut block_tables = vec![0; rows.block_tables.len() / old * width];
    for (dst, src) in block_tables
        .chunks_mut(width)
        .zip(rows.block_tables.chunks(old))
    {
        dst[..old].copy_from_slice(src);
    }
    KernelRows {
        block_tables,
        max_blocks_per_seq: width,
        ..rows.clone()
    }
}

/// Decode of 16 sequences whose contexts sit on and around block and partition boundaries.
fn decode_batch(rng: &mut StdRng) -> Step {
    let p = PARTITION_SIZE as usize;
    let mut lens = vec![
        1,
        DIMS.block_size,
        DIMS.block_size + 1,
        p - 1,
        p,
        p + 1,
        2 * p,
        2 * p + 1,
    ];
    lens.extend((0..8).map(|_| rng.random_range(1..=3 * p)));
    Step {
        seqs: lens.into_iter().map(|len| (len, 1)).collect(),
    }
}

/// A prefill chunk of 37 rows over a cached prefix that crosses a partition, next to a decode
/// row and a whole 20-token prompt.
fn prefill_chunk() -> Step {
    Step {
        seqs: vec![(700 + 37, 37), (45, 1), (20, 20)],
    }
}

fn every_case<T: Dtype>(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for groups in GROUPS {
        for threads in [MIN_THREADS, PAGED_ATTENTION_THREADS] {
            let step = decode_batch(&mut rng);
            run_case::<T>(&mut rng, &step, groups, threads);
            run_case::<T>(&mut rng, &prefill_chunk(), groups, threads);
        }
    }
}

#[test]
fn f32_decode_and_prefill_match_the_cpu_op() {
    every_case::<f32>(41);
}

#[test]
fn f16_decode_and_prefill_match_the_cpu_op() {
    every_case::<f16>(42);
}

#[test]
fn bf16_decode_and_prefill_match_the_cpu_op() {
    every_case::<bf16>(43);
}

/// Long contexts: 8k + 1 and 32k tokens, 17 and 64 partitions merged by the second kernel.
#[test]
fn long_contexts_split_into_partitions_match_the_cpu_op() {
    let mut rng = StdRng::seed_from_u64(44);
    let step = Step {
        seqs: vec![(8 * 1024 + 1, 1), (32 * 1024, 1)],
    };
    run_case::<bf16>(&mut rng, &step, 7, PAGED_ATTENTION_THREADS);
    run_case::<f32>(&mut rng, &step, 1, MIN_THREADS);
}

/// Head dims of 16 (the tiny test models: two bf16 vectors, four f32) and 128 (the 1.5B: sixteen
/// bf16 vectors, 32 f32), cache blocks of 4 and of 24 (a block that straddles partitions), and
/// caches that are not 16-byte aligned.
#[test]
fn other_head_dims_block_sizes_and_unaligned_caches_match_the_cpu_op() {
    let mut rng = StdRng::seed_from_u64(45);
    let p = PARTITION_SIZE as usize;
    let step = Step {
        seqs: vec![(p + 7, 1), (3, 1), (2 * p + 30, 30), (40, 40)],
    };
    // Each shape once, with one warp or the shipped block size in turn (the simulator runs a
    // thread at a time, so every case costs seconds).
    for (head_dim, block_size, misaligned, threads) in [
        (16, 4, false, MIN_THREADS),
        (16, 4, false, PAGED_ATTENTION_THREADS),
        (128, 24, false, PAGED_ATTENTION_THREADS),
        (64, 16, true, MIN_THREADS),
        (128, 16, true, PAGED_ATTENTION_THREADS),
    ] {
        let dims = Dims {
            head_dim,
            block_size,
            misaligned,
            grid_context: None,
        };
        run_case_with::<bf16>(&mut rng, &step, 7, threads, dims);
        run_case_with::<f32>(&mut rng, &step, 12, threads, dims);
        run_case_with::<f16>(&mut rng, &step, 2, threads, dims);
    }
}

/// A captured decode step's launch: the grid sized for 4 partitions more than the longest row
/// needs and the block tables widened to match. Rows whose context ends before a partition leave
/// it at once (writing the identities the merge skips), so each row is what its own grid gives;
/// a row of one key beside them exercises the widest gap.
#[test]
fn a_grid_sized_for_longer_contexts_gives_each_row_its_own() {
    let mut rng = StdRng::seed_from_u64(46);
    let p = PARTITION_SIZE as usize;
    let step = Step {
        seqs: vec![(1, 1), (p + 3, 1), (40, 1), (2 * p, 1)],
    };
    for (threads, groups) in [(MIN_THREADS, 7), (PAGED_ATTENTION_THREADS, 2)] {
        let dims = Dims {
            grid_context: Some(6 * p),
            ..DIMS
        };
        run_case_with::<bf16>(&mut rng, &step, groups, threads, dims);
        run_case_with::<f32>(&mut rng, &step, groups, threads, dims);
    }
}
