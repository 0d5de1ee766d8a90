//! `prefill_attention_d<dim>_<dtype>` (tensor cores; with `paged_attention_merge_f32` when split)
//! against `triage_ops::paged_attention` on the same values in f32.

use half::{bf16, f16};
use rand::{rngs::StdRng, SeedableRng};
use triage_kernel_sim::{prefill_attention, HalfElem};
use triage_ops as ops;
use triage_ops::launch::{
    self, MIN_THREADS, PARTITION_SIZE, PREFILL_ATTENTION_THREADS, PREFILL_HEAD_DIMS,
};

use crate::inputs::{close, convert, tensor, Dtype};
use crate::paged_attention::{build, Dims, Step, KV_HEADS};

/// The kernel rounds the softmax weights P to the input type before the PV product (as
/// FlashAttention does), while the CPU op keeps them in f32: an output, a weighted mean of values
/// of magnitude up to ~4, moves by up to the type's relative step (2^-8 for bf16, 2^-11 for f16)
/// times that magnitude. Scores and sums are f32 on both sides.
fn tolerance<T: Dtype>() -> (f32, f32) {
    let step = if T::DTYPE == candle_core::DType::BF16 {
        2f32.powi(-8)
    } else {
        2f32.powi(-11)
    };
    (4.0 * step, 1e-3)
}

/// How a case picks its partitions.
#[derive(Clone, Copy, Debug)]
enum Split {
    /// What the launch picks (`launch::prefill_attention_partitions`): split when few tiles
    /// meet a long context, as every small test does past 512 keys.
    Shipped,
    /// One partition whatever the context (what a large grid gets).
    Never,
}

fn run_case<T: Dtype + HalfElem>(
    rng: &mut StdRng,
    step: &Step,
    groups: usize,
    threads: u32,
    dims: Dims,
    split: Split,
) {
    let (shape, meta, q, k_cache, v_cache) = build(rng, step, groups, dims);
    let (q, k_cache, v_cache) = (
        convert::<T>(&q, 0),
        convert::<T>(&k_cache, 0),
        convert::<T>(&v_cache, 0),
    );
    let as_f32 = |xs: &[T]| xs.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
    let head_dim = dims.head_dim;
    let num_rows = q.len() / (shape.num_heads * head_dim);
    let cache_shape = [shape.num_blocks, dims.block_size, KV_HEADS, head_dim];
    let want = ops::paged_attention(
        &tensor(&as_f32(&q), &[num_rows, shape.num_heads, head_dim]),
        &tensor(&as_f32(&k_cache), &cache_shape),
        &tensor(&as_f32(&v_cache), &cache_shape),
        &meta,
    )
    .and_then(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
    .expect("cpu op");
    let rows = meta.kernel_rows();
    let tiles = meta.prefill_tiles(groups, launch::prefill_tile_rows(threads));
    let partitions = match split {
        Split::Shipped => launch::prefill_attention_partitions(
            tiles.len() / 3,
            KV_HEADS,
            num_rows,
            shape.num_heads,
            head_dim,
            rows.max_context_len,
        ),
        Split::Never => 1,
    };
    let got = prefill_attention(
        &shape, &rows, &tiles, &q, &k_cache, &v_cache, threads, partitions,
    )
    .expect("launch");
    let (abs, rel) = tolerance::<T>();
    let context = format!(
        "{:?} seqs {:?} groups {groups} threads {threads} {dims:?} {partitions} partitions",
        T::DTYPE,
        step.seqs
    );
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(!w.is_nan(), "{context}: the CPU op read a NaN slot at {i}");
        assert!(
            close(g, w, abs, rel),
            "{context}: element {i}: kernel {g}, cpu {w}"
        );
    }
}

/// A prefill chunk of 37 rows over a cached prefix that crosses a partition (and key tiles of 64
/// mid-block), beside a decode row and a whole 20-token prompt.
fn prefill_chunk() -> Step {
    Step {
        seqs: vec![(700 + 37, 37), (45, 1), (20, 20)],
    }
}

fn dims(head_dim: usize, block_size: usize) -> Dims {
    Dims {
        head_dim,
        block_size,
        misaligned: false,
        grid_context: None,
    }
}

/// Query groups of 1, 2, 6 (the 1.5B) and 7 (the 0.5B): a tile of 16 or 64 (row, head) pairs
/// then ends mid-row, and a group's heads straddle warps.
fn every_case<T: Dtype + HalfElem>(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for (groups, threads, head_dim, block_size) in [
        (1, MIN_THREADS, 64, 16),
        (2, PREFILL_ATTENTION_THREADS, 128, 16),
        (6, PREFILL_ATTENTION_THREADS, 128, 32),
        (7, MIN_THREADS, 64, 64),
        (7, PREFILL_ATTENTION_THREADS, 64, 16),
    ] {
        let d = dims(head_dim, block_size);
        run_case::<T>(
            &mut rng,
            &prefill_chunk(),
            groups,
            threads,
            d,
            Split::Shipped,
        );
    }
}

#[test]
fn f16_prefill_matches_the_cpu_op() {
    every_case::<f16>(51);
}

#[test]
fn bf16_prefill_matches_the_cpu_op() {
    every_case::<bf16>(52);
}

/// The same contexts unsplit, as a grid of many tiles runs them: one block walks all 737 keys.
#[test]
fn an_unsplit_long_context_matches_the_cpu_op() {
    let mut rng = StdRng::seed_from_u64(53);
    for head_dim in PREFILL_HEAD_DIMS {
        let d = dims(head_dim, 16);
        run_case::<bf16>(
            &mut rng,
            &prefill_chunk(),
            6,
            PREFILL_ATTENTION_THREADS,
            d,
            Split::Never,
        );
    }
}

/// A question over a cached prefix of 3 partitions and a bit, the case the split is for, and
/// chunk rows that start exactly on partition and tile boundaries.
#[test]
fn a_short_chunk_over_a_long_prefix_splits_and_matches_the_cpu_op() {
    let mut rng = StdRng::seed_from_u64(54);
    let p = PARTITION_SIZE as usize;
    let step = Step {
        seqs: vec![(3 * p + 100 + 9, 9), (p + 64, 64), (2 * p, 1)],
    };
    run_case::<bf16>(
        &mut rng,
        &step,
        6,
        PREFILL_ATTENTION_THREADS,
        dims(128, 16),
        Split::Shipped,
    );
    run_case::<f16>(
        &mut rng,
        &step,
        7,
        MIN_THREADS,
        dims(64, 32),
        Split::Shipped,
    );
}
