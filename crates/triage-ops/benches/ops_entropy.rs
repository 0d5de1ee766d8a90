//! Fused logits reduction (max, lse, entropy, argmax, top-20) against its naive reference, on CPU.
//!
//! Criterion measures both; afterwards a short same-process timing prints slow/fused ratios, since
//! criterion does not hand its estimates back to the bench.

use std::hint::black_box;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use criterion::{Criterion, Throughput};
use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_ops::{logits_reduce, logits_reduce_slow, LogitsStats, Result};

const VOCAB: usize = 151_936;
const K: usize = 20;
const BATCHES: [usize; 2] = [1, 16];

type Reduce = fn(&Tensor, usize) -> Result<Vec<LogitsStats>>;
const FORMS: [(&str, Reduce); 2] = [("fused", logits_reduce), ("slow", logits_reduce_slow)];

fn random_logits(num_rows: usize) -> Tensor {
    let mut rng = StdRng::seed_from_u64(42);
    let data: Vec<f32> = (0..num_rows * VOCAB)
        .map(|_| rng.random_range(-12.0..12.0))
        .collect();
    Tensor::from_vec(data, (num_rows, VOCAB), &Device::Cpu).expect("shape matches the data")
}

fn bench_reduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("logits_reduce_cpu");
    for num_rows in BATCHES {
        let logits = random_logits(num_rows);
        group.throughput(Throughput::Elements((num_rows * VOCAB) as u64));
        for (form, reduce) in FORMS {
            // Results are host vectors, so the device is synchronised before the clock stops.
            group.bench_function(format!("{form}_cpu/f32/{num_rows}x{VOCAB}/k{K}"), |b| {
                b.iter(|| reduce(black_box(&logits), K).expect("valid arguments"))
            });
        }
    }
    group.finish();
}

/// Median wall time of `reduce` over a second's worth of calls (at least 5).
fn median_time(reduce: Reduce, logits: &Tensor) -> Duration {
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || start.elapsed() < Duration::from_secs(1) {
        let t = Instant::now();
        black_box(reduce(black_box(logits), K).expect("valid arguments"));
        times.push(t.elapsed());
    }
    times.sort_unstable();
    times[times.len() / 2]
}

fn print_ratios() {
    println!("\nslow / fused (median of same-process runs, cpu, f32, k = {K}):");
    for num_rows in BATCHES {
        let logits = random_logits(num_rows);
        let fused = median_time(logits_reduce, &logits);
        let slow = median_time(logits_reduce_slow, &logits);
        println!(
            "  [{num_rows}, {VOCAB}]: fused {fused:?}, slow {slow:?}, ratio {:.1}x",
            slow.as_secs_f64() / fused.as_secs_f64()
        );
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench_reduce(&mut criterion);
    criterion.final_summary();
    // `cargo bench` passes `--bench`; `cargo test --benches` only smoke-runs each function.
    if std::env::args().any(|arg| arg == "--bench") {
        print_ratios();
    }
}
