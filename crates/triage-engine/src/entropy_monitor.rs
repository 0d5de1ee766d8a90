//! Entropy monitor: per-step uncertainty values and the accept/escalate decision on their mean.
//!
//! The mean runs over the first `window` generated tokens.
//!
//! Every value is computed from the RAW model distribution (before penalties and temperature), so
//! a threshold τ calibrated for a model holds whatever sampling settings a request uses. A τ only
//! means something together with the model, the estimator and the unit it was calibrated with,
//! which is why [`Threshold`] stores all of them.

use serde::{Deserialize, Serialize};
use triage_ops::LogitsStats;

use crate::{EngineError, Result};

/// The number of first generated tokens whose mean decides, unless a threshold says otherwise.
pub const DEFAULT_WINDOW: usize = 30;

pub use triage_types::{EntropyEstimator, EntropyUnit};

/// The engine's side of an estimator: one step's value from the raw logits statistics. A trait
/// because the estimator is plain data in `triage-types`, which knows no logits.
pub trait StepValue {
    /// One decode step's value in `unit`, from the step's raw statistics and the raw logprob of the
    /// token that was sampled (`logits[token] - stats.log_sum_exp`).
    ///
    /// Values are never negative: float rounding below zero is clamped to 0. NaN inputs, and an
    /// empty `top_k` for the top-k estimators, are errors.
    fn step_value(
        self,
        stats: &LogitsStats,
        sampled_logprob: f32,
        unit: EntropyUnit,
    ) -> Result<f32>;
}

impl StepValue for EntropyEstimator {
    fn step_value(
        self,
        stats: &LogitsStats,
        sampled_logprob: f32,
        unit: EntropyUnit,
    ) -> Result<f32> {
        let nats = match self {
            Self::FullSoftmax => not_nan(f64::from(stats.entropy), "entropy")?,
            Self::TopKRenormalized => top_k_renormalized(&top_k_logprobs(stats)?),
            Self::TopKResidual => top_k_residual(&top_k_logprobs(stats)?),
            Self::SampledNll => -not_nan(f64::from(sampled_logprob), "sampled logprob")?,
        };
        Ok(unit.convert_nats(nats.max(0.0)) as f32)
    }
}

fn not_nan(value: f64, what: &str) -> Result<f64> {
    if value.is_nan() {
        return Err(EngineError::Invalid(format!("{what} is NaN")));
    }
    Ok(value)
}

fn top_k_logprobs(stats: &LogitsStats) -> Result<Vec<f64>> {
    if stats.top_k.is_empty() {
        let message = "top-k entropy estimators need LogitsStats with top_k > 0".to_string();
        return Err(EngineError::Invalid(message));
    }
    let logprobs = stats
        .top_k
        .iter()
        .map(|&(_, lp)| not_nan(f64::from(lp), "top-k logprob"));
    logprobs.collect()
}

/// `H(q)` with `q_i = p_i / Σp`, computed as `ln Σp - Σ q_i ln p_i`.
fn top_k_renormalized(logprobs: &[f64]) -> f64 {
    let max = logprobs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return 0.0;
    }
    let log_z = max + logprobs.iter().map(|lp| (lp - max).exp()).sum::<f64>().ln();
    let cross: f64 = logprobs
        .iter()
        .map(|&lp| ((lp - log_z).exp(), lp))
        .filter(|&(q, _)| q > 0.0)
        .map(|(q, lp)| q * lp)
        .sum();
    log_z - cross
}

/// `-Σ p_i ln p_i - r ln r` with the residual `r = 1 - Σ p_i`.
fn top_k_residual(logprobs: &[f64]) -> f64 {
    let (mass, head) = logprobs
        .iter()
        .map(|&lp| (lp.exp(), lp))
        .filter(|&(p, _)| p > 0.0)
        .fold((0.0, 0.0), |(mass, h), (p, lp)| (mass + p, h - p * lp));
    let residual = (1.0 - mass).max(0.0);
    if residual > 0.0 {
        head - residual * residual.ln()
    } else {
        head
    }
}

/// A calibrated threshold with everything needed to use it correctly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// Escalate when the mean per-step value exceeds `tau`.
    pub tau: f32,
    /// The model the threshold was calibrated on.
    pub model_id: String,
    /// How per-step values are measured.
    pub estimator: EntropyEstimator,
    /// The unit of `tau` and of the per-step values.
    pub unit: EntropyUnit,
    /// How many first tokens the mean covers.
    #[serde(default = "default_window")]
    pub window: usize,
}

fn default_window() -> usize {
    DEFAULT_WINDOW
}

/// What to do with a generation, as far as the monitor can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Not decided yet: keep generating.
    Continue,
    /// The mean stayed at or below τ: keep the answer.
    Accept,
    /// The mean exceeds τ: hand the query to a stronger model. `at_step` is how many values had
    /// been observed when that became certain.
    Escalate { at_step: usize },
}

impl Decision {
    /// Whether this is `Accept` or `Escalate`.
    pub fn is_final(self) -> bool {
        self != Self::Continue
    }
}

/// Decides accept or escalate from the mean of the first `window` per-step values.
///
/// The mean is `Σ values / window` compared with τ: accept when `≤ τ`. Because values are never
/// negative, once the partial sum exceeds `τ · window` the mean must exceed τ, so the monitor
/// escalates at once — the same decision as waiting, in fewer steps. Acceptance is only known
/// after `window` values, or at [`EntropyMonitor::finish`].
///
/// Feed it the values of generated tokens only: the caller leaves out the step that produced EOS
/// (or a stop token), which says the answer is over, not that the model is unsure of its content.
#[derive(Debug, Clone)]
pub struct EntropyMonitor {
    tau: f32,
    window: usize,
    estimator: EntropyEstimator,
    unit: EntropyUnit,
    sum: f64,
    num_steps: usize,
    decision: Decision,
}

impl EntropyMonitor {
    /// A monitor with a bare τ (in `unit`, for `estimator`); `window` must be at least 1.
    pub fn new(
        tau: f32,
        window: usize,
        estimator: EntropyEstimator,
        unit: EntropyUnit,
    ) -> Result<Self> {
        if !(tau.is_finite() && tau >= 0.0) {
            return Err(EngineError::Invalid(format!(
                "entropy threshold must be finite and >= 0, got {tau}"
            )));
        }
        if window == 0 {
            return Err(EngineError::Invalid(
                "entropy window must be at least 1".into(),
            ));
        }
        Ok(Self {
            tau,
            window,
            estimator,
            unit,
            sum: 0.0,
            num_steps: 0,
            decision: Decision::Continue,
        })
    }

    /// A monitor for a calibrated threshold; an error if it was calibrated on another model.
    pub fn from_threshold(threshold: &Threshold, model_id: &str) -> Result<Self> {
        if threshold.model_id != model_id {
            let message = format!(
                "entropy threshold was calibrated on model {:?}, not {model_id:?}",
                threshold.model_id
            );
            return Err(EngineError::Invalid(message));
        }
        Self::new(
            threshold.tau,
            threshold.window,
            threshold.estimator,
            threshold.unit,
        )
    }

    /// Adds one step's value (in this monitor's unit); once the decision is final, values are
    /// ignored and the decision is returned again. NaN and negative values are errors.
    pub fn observe(&mut self, value: f32) -> Result<Decision> {
        if self.decision.is_final() {
            return Ok(self.decision);
        }
        if value.is_nan() || value < 0.0 {
            return Err(EngineError::Invalid(format!(
                "entropy value must be >= 0, got {value}"
            )));
        }
        self.sum += f64::from(value);
        self.num_steps += 1;
        if self.sum > self.limit(self.window) {
            self.decision = Decision::Escalate {
                at_step: self.num_steps,
            };
        } else if self.num_steps == self.window {
            self.decision = Decision::Accept;
        }
        Ok(self.decision)
    }

    /// [`EntropyMonitor::observe`] with the value computed by this monitor's estimator and unit.
    pub fn observe_step(&mut self, stats: &LogitsStats, sampled_logprob: f32) -> Result<Decision> {
        if self.decision.is_final() {
            return Ok(self.decision);
        }
        let value = self
            .estimator
            .step_value(stats, sampled_logprob, self.unit)?;
        self.observe(value)
    }

    /// Generation ended: decides on the mean of the values seen if the window was not filled.
    /// With no values at all (EOS first) the answer is accepted: nothing signalled uncertainty,
    /// and an empty answer is the caller's policy to judge.
    pub fn finish(&mut self) -> Decision {
        if !self.decision.is_final() {
            self.decision = if self.num_steps > 0 && self.sum > self.limit(self.num_steps) {
                Decision::Escalate {
                    at_step: self.num_steps,
                }
            } else {
                Decision::Accept
            };
        }
        self.decision
    }

    /// `τ · n`: a sum of `n` values above it means a mean above τ.
    fn limit(&self, n: usize) -> f64 {
        f64::from(self.tau) * n as f64
    }

    /// The decision so far.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Mean of the values that counted; `None` before the first one.
    pub fn mean(&self) -> Option<f32> {
        (self.num_steps > 0).then(|| (self.sum / self.num_steps as f64) as f32)
    }

    /// How many values counted (at most `window`; none after the decision).
    pub fn num_steps(&self) -> usize {
        self.num_steps
    }

    /// The threshold, in [`EntropyMonitor::unit`].
    pub fn tau(&self) -> f32 {
        self.tau
    }

    /// How many first values the mean covers.
    pub fn window(&self) -> usize {
        self.window
    }

    /// How [`EntropyMonitor::observe_step`] measures a step.
    pub fn estimator(&self) -> EntropyEstimator {
        self.estimator
    }

    /// The unit of τ and of the values.
    pub fn unit(&self) -> EntropyUnit {
        self.unit
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    const ESTIMATORS: [EntropyEstimator; 4] = [
        EntropyEstimator::FullSoftmax,
        EntropyEstimator::TopKRenormalized,
        EntropyEstimator::TopKResidual,
        EntropyEstimator::SampledNll,
    ];

    fn stats(entropy: f32, top_k_probs: &[f64]) -> LogitsStats {
        LogitsStats {
            max: 3.5,
            log_sum_exp: 4.25,
            entropy,
            argmax: 7,
            top_k: (0u32..)
                .zip(top_k_probs)
                .map(|(id, p)| (id + 7, p.ln() as f32))
                .collect(),
        }
    }

    fn value(e: EntropyEstimator, s: &LogitsStats, logprob: f32) -> f32 {
        e.step_value(s, logprob, EntropyUnit::Nats).unwrap()
    }

    fn close(a: f32, b: f64) -> bool {
        (f64::from(a) - b).abs() < 1e-5
    }

    #[test]
    fn full_softmax_and_sampled_nll_pass_through() {
        let s = stats(2.75, &[0.3, 0.2]);
        assert_eq!(value(EntropyEstimator::FullSoftmax, &s, -0.9), 2.75);
        assert_eq!(value(EntropyEstimator::SampledNll, &s, -0.9), 0.9);
    }

    #[test]
    fn top_k_renormalized_of_uniform_is_ln_k() {
        let s = stats(5.5, &[0.1; 4]);
        let v = value(EntropyEstimator::TopKRenormalized, &s, -2.3);
        assert!(close(v, 4f64.ln()), "{v}");
        let single = stats(5.5, &[0.4]);
        assert!(close(
            value(EntropyEstimator::TopKRenormalized, &single, -1.0),
            0.0
        ));
    }

    #[test]
    fn top_k_renormalized_matches_direct_formula() {
        let probs = [0.35, 0.2, 0.1, 0.05];
        let z: f64 = probs.iter().sum();
        let expected: f64 = probs.iter().map(|p| -(p / z) * (p / z).ln()).sum();
        let v = value(
            EntropyEstimator::TopKRenormalized,
            &stats(5.5, &probs),
            -1.0,
        );
        assert!(close(v, expected), "{v} vs {expected}");
    }

    #[test]
    fn top_k_residual_adds_one_bucket() {
        let s = stats(5.5, &[0.1; 4]);
        let expected = -4.0 * 0.1 * 0.1f64.ln() - 0.6 * 0.6f64.ln();
        let v = value(EntropyEstimator::TopKResidual, &s, -2.3);
        assert!(close(v, expected), "{v} vs {expected}");
        // With all the mass in the top k the bucket is empty: the plain entropy.
        let full = stats(5.5, &[0.5, 0.25, 0.25]);
        let expected = -(0.5 * 0.5f64.ln() + 0.5 * 0.25f64.ln());
        assert!(close(
            value(EntropyEstimator::TopKResidual, &full, -0.7),
            expected
        ));
    }

    #[test]
    fn bits_are_nats_over_ln_2() {
        let s = stats(2.1, &[0.3, 0.15, 0.05]);
        for e in ESTIMATORS {
            let nats = e.step_value(&s, -1.3, EntropyUnit::Nats).unwrap();
            let bits = e.step_value(&s, -1.3, EntropyUnit::Bits).unwrap();
            assert!(nats > 0.0, "{e:?}");
            assert!(
                close(bits, f64::from(nats) / std::f64::consts::LN_2),
                "{e:?}"
            );
        }
    }

    #[test]
    fn estimator_errors_and_clamping() {
        let empty = stats(1.5, &[]);
        assert!(EntropyEstimator::TopKRenormalized
            .step_value(&empty, -1.0, EntropyUnit::Nats)
            .is_err());
        assert!(EntropyEstimator::TopKResidual
            .step_value(&empty, -1.0, EntropyUnit::Nats)
            .is_err());
        let nan = stats(f32::NAN, &[0.5]);
        assert!(EntropyEstimator::FullSoftmax
            .step_value(&nan, -1.0, EntropyUnit::Nats)
            .is_err());
        assert!(EntropyEstimator::SampledNll
            .step_value(&empty, f32::NAN, EntropyUnit::Nats)
            .is_err());
        // A logprob rounded a hair above 0 still gives a value of 0, never below.
        assert_eq!(value(EntropyEstimator::SampledNll, &empty, 1e-7), 0.0);
        assert_eq!(
            value(EntropyEstimator::FullSoftmax, &stats(-1e-7, &[]), -1.0),
            0.0
        );
    }

    /// The decision made by collecting every value first.
    fn decide_by_waiting(values: &[f32], tau: f32, window: usize) -> Decision {
        let counted = &values[..values.len().min(window)];
        if counted.is_empty() {
            return Decision::Accept;
        }
        let mean = counted.iter().map(|&v| f64::from(v)).sum::<f64>() / counted.len() as f64;
        if mean > f64::from(tau) {
            Decision::Escalate { at_step: 0 }
        } else {
            Decision::Accept
        }
    }

    /// Feeds values until the monitor decides, then finishes if it never did.
    fn run_monitor(values: &[f32], tau: f32, window: usize) -> Decision {
        let mut m = EntropyMonitor::new(
            tau,
            window,
            EntropyEstimator::default(),
            EntropyUnit::default(),
        )
        .unwrap();
        for &v in values {
            let d = m.observe(v).unwrap();
            if d.is_final() {
                return d;
            }
        }
        m.finish()
    }

    /// The first step `k <= window` whose prefix sum exceeds `τ · window`.
    fn first_step_over(values: &[f32], tau: f32, window: usize) -> Option<usize> {
        let limit = f64::from(tau) * window as f64;
        let mut sum = 0.0;
        values
            .iter()
            .take(window)
            .position(|&v| {
                sum += f64::from(v);
                sum > limit
            })
            .map(|idx| idx + 1)
    }

    #[test]
    fn early_decision_equals_waiting_decision() {
        let mut rng = StdRng::seed_from_u64(2024);
        let (mut num_early, mut num_accept, mut num_short) = (0, 0, 0);
        for _ in 0..5_000 {
            let window = [1, 2, 5, 30][rng.random_range(0..4)];
            let len = rng.random_range(1..=2 * window);
            let scale = rng.random_range(0.1f32..3.0);
            let values: Vec<f32> = (0..len)
                .map(|_| rng.random_range(0.01f32..2.0) * scale)
                .collect();
            let tau = rng.random_range(0.2f32..2.5);
            let early = run_monitor(&values, tau, window);
            let waited = decide_by_waiting(&values, tau, window);
            num_short += usize::from(len < window);
            match (early, waited) {
                (Decision::Accept, Decision::Accept) => num_accept += 1,
                (Decision::Escalate { at_step }, Decision::Escalate { .. }) => {
                    let num_counted = window.min(len);
                    assert!(
                        at_step >= 1 && at_step <= num_counted,
                        "{at_step} {window} {len}"
                    );
                    // It escalates where the sum first passes τ·window, or at the end.
                    let expected = first_step_over(&values, tau, window).unwrap_or(len);
                    assert_eq!(at_step, expected, "{values:?} {tau} {window}");
                    num_early += usize::from(at_step < num_counted);
                }
                _ => panic!("early {early:?}, waited {waited:?}: {values:?} {tau} {window}"),
            }
        }
        // The cases must actually cover early escalations, acceptances and short generations.
        assert!(
            num_early > 500 && num_accept > 500 && num_short > 500,
            "{num_early} {num_accept} {num_short}"
        );
    }

    #[test]
    fn accepts_after_window_and_stays_decided() {
        let mut m =
            EntropyMonitor::new(1.0, 3, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        assert_eq!(m.observe(0.5).unwrap(), Decision::Continue);
        assert_eq!(m.observe(1.75).unwrap(), Decision::Continue);
        assert_eq!(m.observe(0.25).unwrap(), Decision::Accept);
        assert_eq!(m.mean(), Some(2.5 / 3.0));
        assert_eq!(m.observe(50.0).unwrap(), Decision::Accept);
        assert_eq!(m.finish(), Decision::Accept);
        assert_eq!(m.num_steps(), 3);
    }

    #[test]
    fn escalates_early_and_stays_decided() {
        let mut m =
            EntropyMonitor::new(1.0, 4, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        assert_eq!(m.observe(2.5).unwrap(), Decision::Continue);
        assert_eq!(m.observe(1.75).unwrap(), Decision::Escalate { at_step: 2 });
        assert_eq!(m.observe(0.125).unwrap(), Decision::Escalate { at_step: 2 });
        assert_eq!(m.finish(), Decision::Escalate { at_step: 2 });
        assert_eq!((m.num_steps(), m.mean()), (2, Some(2.125)));
    }

    #[test]
    fn finish_decides_on_short_generations() {
        let mut m =
            EntropyMonitor::new(1.0, 30, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        assert_eq!(m.mean(), None);
        assert_eq!(m.finish(), Decision::Accept);
        let mut m =
            EntropyMonitor::new(1.0, 30, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        m.observe(1.5).unwrap();
        m.observe(0.75).unwrap();
        assert_eq!(m.finish(), Decision::Escalate { at_step: 2 });
        let mut m =
            EntropyMonitor::new(1.0, 30, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        m.observe(1.25).unwrap();
        m.observe(0.5).unwrap();
        assert_eq!(m.finish(), Decision::Accept);
    }

    #[test]
    fn rejects_bad_values_and_settings() {
        let mut m =
            EntropyMonitor::new(1.0, 5, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).unwrap();
        assert!(m.observe(f32::NAN).is_err());
        assert!(m.observe(-0.5).is_err());
        assert_eq!(m.num_steps(), 0);
        assert!(
            EntropyMonitor::new(1.0, 0, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).is_err()
        );
        assert!(
            EntropyMonitor::new(-0.1, 5, EntropyEstimator::FullSoftmax, EntropyUnit::Nats).is_err()
        );
        assert!(EntropyMonitor::new(
            f32::NAN,
            5,
            EntropyEstimator::FullSoftmax,
            EntropyUnit::Nats
        )
        .is_err());
    }

    #[test]
    fn observe_step_uses_the_monitors_estimator_and_unit() {
        let mut m =
            EntropyMonitor::new(1.0, 2, EntropyEstimator::SampledNll, EntropyUnit::Bits).unwrap();
        let s = stats(3.5, &[0.5]);
        // -ln(0.5) nats = 1 bit, twice: a mean of exactly 1 is accepted.
        assert_eq!(m.observe_step(&s, 0.5f32.ln()).unwrap(), Decision::Continue);
        assert_eq!(m.observe_step(&s, 0.5f32.ln()).unwrap(), Decision::Accept);
        assert!((m.mean().unwrap() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn threshold_round_trips_and_checks_model() {
        let threshold = Threshold {
            tau: 1.25,
            model_id: "qwen2.5-0.5b-instruct".into(),
            estimator: EntropyEstimator::TopKResidual,
            unit: EntropyUnit::Bits,
            window: 16,
        };
        let json = serde_json::to_string(&threshold).unwrap();
        assert!(json.contains(r#""estimator":"top_k_residual""#), "{json}");
        let back: Threshold = serde_json::from_str(&json).unwrap();
        assert_eq!(back, threshold);
        let m = EntropyMonitor::from_threshold(&threshold, "qwen2.5-0.5b-instruct").unwrap();
        assert_eq!(
            (m.tau(), m.window(), m.estimator(), m.unit()),
            (1.25, 16, EntropyEstimator::TopKResidual, EntropyUnit::Bits)
        );
        assert!(EntropyMonitor::from_threshold(&threshold, "llama-3.2-1b").is_err());
    }

    #[test]
    fn threshold_needs_estimator_and_unit_but_defaults_window() {
        let no_unit = r#"{"tau": 0.75, "model_id": "m", "estimator": "full_softmax"}"#;
        assert!(serde_json::from_str::<Threshold>(no_unit).is_err());
        let no_window =
            r#"{"tau": 0.75, "model_id": "m", "estimator": "sampled_nll", "unit": "nats"}"#;
        let t: Threshold = serde_json::from_str(no_window).unwrap();
        assert_eq!(
            (t.window, t.estimator, t.unit),
            (
                DEFAULT_WINDOW,
                EntropyEstimator::SampledNll,
                EntropyUnit::Nats
            )
        );
    }
}
