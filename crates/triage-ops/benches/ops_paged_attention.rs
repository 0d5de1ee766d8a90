//! Paged attention (CPU) against its naive reference: a batched decode step (16 sequences of
//! 1,024 cached tokens) and a 256-token prefill over a 768-token cached prefix, 0.5B-like heads
//! (14 query heads over 2 KV heads of 64). Prints the slow/fast ratio of the same process last.

use std::hint::black_box;
use std::time::Instant;

use candle_core::{Device, Tensor};
use criterion::Criterion;
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_ops::{paged_attention, paged_attention_slow, PagedAttentionMetadata};

const BLOCK_SIZE: usize = 16;
const HEADS: usize = 14;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;

struct Case {
    name: &'static str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    meta: PagedAttentionMetadata,
}

fn case(name: &'static str, num_seqs: usize, seq_len: usize, query_len: usize) -> Case {
    let mut rng = StdRng::seed_from_u64(1);
    let blocks_per_seq = seq_len.div_ceil(BLOCK_SIZE);
    let num_blocks = num_seqs * blocks_per_seq + 1;
    let mut randn =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let cache_len = num_blocks * BLOCK_SIZE * KV_HEADS * HEAD_DIM;
    let shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM);
    let k = Tensor::from_vec(randn(cache_len), shape, &Device::Cpu).expect("shape");
    let v = Tensor::from_vec(randn(cache_len), shape, &Device::Cpu).expect("shape");
    let n = num_seqs * query_len;
    let q = Tensor::from_vec(
        randn(n * HEADS * HEAD_DIM),
        (n, HEADS, HEAD_DIM),
        &Device::Cpu,
    )
    .expect("shape");
    let meta = PagedAttentionMetadata {
        block_size: BLOCK_SIZE,
        block_tables: (0..num_seqs)
            .map(|s| {
                (0..blocks_per_seq)
                    .map(|b| (1 + b * num_seqs + s) as u32)
                    .collect()
            })
            .collect(),
        seq_lens: vec![seq_len; num_seqs],
        query_lens: vec![query_len; num_seqs],
    };
    Case {
        name,
        q,
        k,
        v,
        meta,
    }
}

fn main() {
    let cases = [
        case("decode/16x1024", 16, 1024, 1),
        case("prefill/256_after_768", 1, 1024, 256),
    ];
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("paged_attention_cpu");
    group.sample_size(10);
    for case in &cases {
        group.bench_function(format!("fast_cpu/{}", case.name), |b| {
            b.iter(|| {
                paged_attention(black_box(&case.q), &case.k, &case.v, &case.meta).expect("valid")
            })
        });
        group.bench_function(format!("slow_cpu/{}", case.name), |b| {
            b.iter(|| {
                paged_attention_slow(black_box(&case.q), &case.k, &case.v, &case.meta)
                    .expect("valid")
            })
        });
    }
    group.finish();
    for case in &cases {
        let time = |f: &dyn Fn()| {
            let start = Instant::now();
            for _ in 0..3 {
                f();
            }
            start.elapsed().as_secs_f64() / 3.0
        };
        let fast =
            time(&|| drop(paged_attention(&case.q, &case.k, &case.v, &case.meta).expect("valid")));
        let slow = time(&|| {
            drop(paged_attention_slow(&case.q, &case.k, &case.v, &case.meta).expect("valid"))
        });
        println!(
            "{}: fast {:.2} ms, slow {:.2} ms, slow/fast {:.2}x",
            case.name,
            fast * 1e3,
            slow * 1e3,
            slow / fast
        );
    }
}
