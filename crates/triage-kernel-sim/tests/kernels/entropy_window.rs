//! `entropy_window_f32` against the engine's `EntropyMonitor`, step for step.

use rand::{rngs::StdRng, Rng, SeedableRng};
use triage_engine::entropy_monitor::{Decision, EntropyEstimator, EntropyMonitor, EntropyUnit};
use triage_kernel_sim::entropy_window;
use triage_ops::entropy_window::{
    EntropyWindowParams, DECISION_ACCEPT, DECISION_CONTINUE, DECISION_ESCALATE, DECISION_INVALID,
};
use triage_ops::launch::{self, ENTROPY_WINDOW_THREADS, MIN_THREADS};
use triage_ops::{logits_reduce_packed, LogitsStats};

use crate::inputs::{normal, tensor};

const ESTIMATORS: [(EntropyEstimator, u32); 4] = [
    (EntropyEstimator::FullSoftmax, 0),
    (EntropyEstimator::TopKRenormalized, 1),
    (EntropyEstimator::TopKResidual, 2),
    (EntropyEstimator::SampledNll, 3),
];
const UNITS: [(EntropyUnit, u32); 2] = [(EntropyUnit::Nats, 0), (EntropyUnit::Bits, 1)];
const VOCAB: usize = 64;

/// The kernel's decision code for a monitor's result (invalid: the monitor returned an error).
fn code(result: &Result<Decision, triage_engine::EngineError>) -> (f64, Option<usize>) {
    match result {
        Ok(Decision::Continue) => (DECISION_CONTINUE, None),
        Ok(Decision::Accept) => (DECISION_ACCEPT, None),
        Ok(Decision::Escalate { at_step }) => (DECISION_ESCALATE, Some(*at_step)),
        Err(_) => (DECISION_INVALID, None),
    }
}

/// One decode step for every sequence: stats of fresh logits whose temperature differs per
/// sequence (so some accept and some escalate), a sampled token's logprob, and whether the step
/// counts (a tenth do not: the EOS step). `poison_seq` gets a NaN entropy.
fn step(
    rng: &mut StdRng,
    scales: &[f32],
    k: usize,
    poison_seq: Option<usize>,
) -> (Vec<f32>, Vec<f32>, Vec<u32>) {
    let n = scales.len();
    let logits: Vec<f32> = scales.iter().flat_map(|&s| normal(rng, VOCAB, s)).collect();
    let mut stats = logits_reduce_packed(&tensor(&logits, &[n, VOCAB]), k)
        .and_then(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
        .expect("cpu op");
    if let Some(seq) = poison_seq {
        stats[seq * (4 + 2 * k) + 2] = f32::NAN;
    }
    let sampled = (0..n)
        .map(|s| {
            let token = rng.random_range(0..VOCAB);
            logits[s * VOCAB + token] - stats[s * (4 + 2 * k) + 1]
        })
        .collect();
    let observe = (0..n).map(|_| u32::from(!rng.random_bool(0.1))).collect();
    (stats, sampled, observe)
}

fn run_case(
    rng: &mut StdRng,
    estimator: (EntropyEstimator, u32),
    unit: (EntropyUnit, u32),
    k: usize,
    threads: u32,
) {
    let n = 37; // not a multiple of any block size: threads past the last sequence exist
    let window = [30, 4][rng.random_range(0..2)];
    let tau = rng.random_range(0.2..3.0f32);
    let scales: Vec<f32> = (0..n).map(|_| rng.random_range(0.3..8.0)).collect();
    let mut monitors: Vec<EntropyMonitor> = (0..n)
        .map(|_| EntropyMonitor::new(tau, window, estimator.0, unit.0).expect("valid"))
        .collect();
    let mut last: Vec<(f64, Option<usize>)> = vec![(0.0, None); n];
    let mut state = vec![0f64; 4 * n];
    let params = EntropyWindowParams {
        tau,
        window,
        estimator: estimator.1,
        unit: unit.1,
    };
    let g = launch::entropy_window(n, threads).expect("geometry");
    let context =
        format!("{estimator:?} {unit:?} k {k} tau {tau} window {window} threads {threads}");
    for step_idx in 0..window + 3 {
        let poison = (step_idx == 2).then_some(5);
        let (stats, sampled, observe) = step(rng, &scales, k, poison);
        entropy_window(&g, &params, k, &stats, &sampled, &observe, &mut state).expect("launch");
        for s in 0..n {
            if observe[s] == 1 && last[s].0 == DECISION_CONTINUE {
                let row = &stats[s * (4 + 2 * k)..(s + 1) * (4 + 2 * k)];
                let stats = LogitsStats::from_packed_rows(&tensor(row, &[1, 4 + 2 * k]), k)
                    .expect("row")[0]
                    .clone();
                last[s] = code(&monitors[s].observe_step(&stats, sampled[s]));
            }
            let st = &state[4 * s..4 * s + 4];
            let at = format!(
                "{context}, step {step_idx}, sequence {s}: kernel {st:?}, monitor {:?}",
                last[s]
            );
            assert_eq!(st[2], last[s].0, "{at}");
            if last[s].0 == DECISION_INVALID {
                continue; // the monitor's state after an error is not specified
            }
            assert_eq!(st[1], monitors[s].num_steps() as f64, "{at}");
            assert_eq!(
                last[s].1.map(|a| a as f64).unwrap_or(0.0),
                if st[2] == DECISION_ESCALATE {
                    st[3]
                } else {
                    0.0
                },
                "{at}"
            );
            let mean = monitors[s].mean().map(f64::from);
            let kernel_mean = (st[1] > 0.0).then(|| (st[0] / st[1]) as f32 as f64);
            assert_eq!(kernel_mean, mean, "{at}");
        }
    }
}

#[test]
fn decisions_match_the_entropy_monitor_step_for_step() {
    let mut rng = StdRng::seed_from_u64(21);
    for estimator in ESTIMATORS {
        for unit in UNITS {
            for threads in [MIN_THREADS, ENTROPY_WINDOW_THREADS] {
                run_case(&mut rng, estimator, unit, 5, threads);
            }
        }
    }
}

/// Without top-k columns the top-k estimators are an error for the monitor and the
/// "invalid" state for the kernel; the other two work.
#[test]
fn top_k_estimators_without_top_k_are_invalid() {
    let mut rng = StdRng::seed_from_u64(22);
    for estimator in ESTIMATORS {
        run_case(&mut rng, estimator, UNITS[0], 0, ENTROPY_WINDOW_THREADS);
    }
}
