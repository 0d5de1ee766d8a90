//! The retrieval-gain policy of the cost-aware study: a ridge regression on the six retrieval
//! features predicts Δ = hit(hybrid) − hit(dense + rerank) for a query; the hybrid pass runs when
//! the prediction reaches τ_h. τ_h is chosen by document-grouped cross-validation to maximise
//! Hit@10 minus a cost per hybrid call, and the fit is frozen to a file with its hash.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use triage_types::{GainDecision, RetrievalFeatures};

use crate::error::{PolicyError, Result};
use crate::frozen::{freeze, thaw};
use crate::linear::RidgeModel;

/// The study's ridge penalty.
pub const RIDGE_PENALTY: f64 = 20.0;
/// The study's price of one hybrid call, in Hit@10 points.
pub const HYBRID_CALL_COST: f64 = 0.02;
const NUM_FOLDS: u64 = 5;

/// One dev query: its features and whether each arm put a gold chunk in its top 10.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GainExample {
    pub features: [f32; 6],
    pub hit_dense: bool,
    pub hit_hybrid: bool,
    /// The query's source document; folds never split a group.
    pub group: String,
}

impl GainExample {
    fn delta(&self) -> f64 {
        f64::from(u8::from(self.hit_hybrid)) - f64::from(u8::from(self.hit_dense))
    }
}

/// The frozen policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GainPolicyModel {
    pub ridge: RidgeModel,
    /// Run hybrid when the predicted Δ is at least this.
    pub tau_h: f64,
    pub cost_per_hybrid: f64,
    /// What the cross-validation measured at τ_h.
    pub report: GainReport,
}

/// Out-of-fold quality of the chosen threshold, next to the two fixed policies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GainReport {
    pub num_examples: usize,
    pub num_groups: usize,
    pub hit_dense_always: f64,
    pub hit_hybrid_always: f64,
    /// Hit@10 of the policy at τ_h (out of fold).
    pub hit_policy: f64,
    /// Fraction of queries the policy sends to hybrid.
    pub hybrid_rate: f64,
    /// Hit@10 − cost · hybrid rate of the policy, and of always-hybrid.
    pub objective_policy: f64,
    pub objective_hybrid_always: f64,
}

/// A fitted policy.
#[derive(Debug, Clone)]
pub struct GainPolicy {
    pub model: GainPolicyModel,
}

fn rows(examples: &[&GainExample]) -> (Vec<Vec<f32>>, Vec<f64>) {
    (
        examples.iter().map(|e| e.features.to_vec()).collect(),
        examples.iter().map(|e| e.delta()).collect(),
    )
}

/// Hit@10 and hybrid rate when the queries with `predicted ≥ tau` take the hybrid arm.
fn outcome(examples: &[GainExample], predicted: &[f64], tau: f64) -> (f64, f64) {
    let n = examples.len() as f64;
    let mut hits = 0.0;
    let mut hybrid = 0.0;
    for (e, &p) in examples.iter().zip(predicted) {
        let use_hybrid = p >= tau;
        hybrid += f64::from(u8::from(use_hybrid));
        let hit = if use_hybrid {
            e.hit_hybrid
        } else {
            e.hit_dense
        };
        hits += f64::from(u8::from(hit));
    }
    (hits / n, hybrid / n)
}

/// Each group's fold: the groups in name order, dealt round the folds.
fn fold_of_group(examples: &[GainExample]) -> BTreeMap<&str, u64> {
    examples
        .iter()
        .map(|e| e.group.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .enumerate()
        .map(|(i, g)| (g, i as u64 % NUM_FOLDS))
        .collect()
}

/// Each example's predicted Δ by the ridge fitted on the other folds (NaN where its fold was
/// skipped: too few training rows, or no rows held out).
fn out_of_fold(examples: &[GainExample], groups: &BTreeMap<&str, u64>) -> Result<Vec<f64>> {
    let fold_of = |e: &GainExample| groups[e.group.as_str()];
    let mut predicted = vec![f64::NAN; examples.len()];
    for fold in 0..NUM_FOLDS {
        let train: Vec<&GainExample> = examples.iter().filter(|e| fold_of(e) != fold).collect();
        if train.len() < 2 || train.len() == examples.len() {
            continue;
        }
        let (x, y) = rows(&train);
        let ridge = RidgeModel::fit(&x, &y, RIDGE_PENALTY)?;
        for (i, e) in examples.iter().enumerate() {
            if fold_of(e) == fold {
                predicted[i] = ridge.predict(&e.features)?;
            }
        }
    }
    Ok(predicted)
}

/// τ_h among the predictions themselves, plus "never": the highest Hit@10 − cost · hybrid
/// rate; among equals the higher τ (fewer hybrid calls).
fn best_tau(examples: &[GainExample], predicted: &[f64], cost_per_hybrid: f64) -> f64 {
    let mut candidates: Vec<f64> = predicted
        .iter()
        .copied()
        .filter(|p| p.is_finite())
        .collect();
    candidates.push(f64::INFINITY);
    candidates.sort_by(f64::total_cmp);
    candidates.dedup();
    let objective = |tau: f64| {
        let (hit, rate) = outcome(examples, predicted, tau);
        hit - cost_per_hybrid * rate
    };
    candidates
        .iter()
        .copied()
        .rev()
        .max_by(|a, b| objective(*a).total_cmp(&objective(*b)).then(a.total_cmp(b)))
        .unwrap_or(f64::INFINITY)
}

impl GainPolicy {
    /// Fit on dev examples: out-of-fold predictions over five document-grouped folds choose τ_h
    /// (among the predictions themselves, plus "never"), then the ridge is refitted on all rows.
    pub fn fit(examples: &[GainExample], cost_per_hybrid: f64) -> Result<Self> {
        if examples.len() < 2 * NUM_FOLDS as usize {
            return Err(PolicyError::Invalid(format!(
                "the gain policy needs at least {} examples, got {}",
                2 * NUM_FOLDS,
                examples.len()
            )));
        }
        let groups = fold_of_group(examples);
        let predicted = out_of_fold(examples, &groups)?;
        let tau_h = best_tau(examples, &predicted, cost_per_hybrid);
        let (hit_policy, hybrid_rate) = outcome(examples, &predicted, tau_h);
        let (hit_dense_always, _) = outcome(examples, &predicted, f64::INFINITY);
        let (hit_hybrid_always, _) = outcome(examples, &predicted, f64::NEG_INFINITY);
        let all: Vec<&GainExample> = examples.iter().collect();
        let (x, y) = rows(&all);
        Ok(Self {
            model: GainPolicyModel {
                ridge: RidgeModel::fit(&x, &y, RIDGE_PENALTY)?,
                tau_h,
                cost_per_hybrid,
                report: GainReport {
                    num_examples: examples.len(),
                    num_groups: groups.len(),
                    hit_dense_always,
                    hit_hybrid_always,
                    hit_policy,
                    hybrid_rate,
                    objective_policy: hit_policy - cost_per_hybrid * hybrid_rate,
                    objective_hybrid_always: hit_hybrid_always - cost_per_hybrid,
                },
            },
        })
    }

    /// Whether to run the hybrid pass for a query with `features`.
    pub fn decide(&self, features: &RetrievalFeatures) -> Result<GainDecision> {
        let predicted_delta = self.model.ridge.predict(&features.to_array())?;
        Ok(GainDecision {
            predicted_delta,
            tau_h: self.model.tau_h,
            run_hybrid: predicted_delta >= self.model.tau_h,
        })
    }

    /// Freeze to `path`; returns the model's SHA-256.
    pub fn save(&self, path: &Path) -> Result<String> {
        freeze(&self.model, path)
    }

    pub fn load(path: &Path) -> Result<Self> {
        Ok(Self { model: thaw(path)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hybrid helps exactly when the top dense similarity is low.
    fn examples() -> Vec<GainExample> {
        (0..200)
            .map(|i| {
                let top1 = (i % 20) as f32 / 20.0;
                let low = top1 < 0.3;
                GainExample {
                    features: [top1, 0.1, top1 - 0.1, 0.5, 2.0, f32::NAN],
                    hit_dense: !low,
                    hit_hybrid: true,
                    group: format!("doc{}", i / 4),
                }
            })
            .collect()
    }

    #[test]
    fn the_policy_sends_only_the_queries_hybrid_helps() {
        let policy = GainPolicy::fit(&examples(), HYBRID_CALL_COST).unwrap();
        let r = &policy.model.report;
        assert_eq!(r.hit_hybrid_always, 1.0);
        assert!((r.hit_dense_always - 0.7).abs() < 1e-9);
        assert!(r.hit_policy > 0.95, "{r:?}");
        assert!(r.hybrid_rate < 0.6, "{r:?}");
        assert!(r.objective_policy > r.objective_hybrid_always);
        let f = |top1: f32| RetrievalFeatures {
            top1_dense: top1,
            top2_margin: 0.1,
            mean_top5_dense: top1 - 0.1,
            dense_rerank_overlap: 0.5,
            rerank_top1_dense_rank: 2.0,
            structural_fraction: f32::NAN,
        };
        assert!(policy.decide(&f(0.05)).unwrap().run_hybrid);
        assert!(!policy.decide(&f(0.9)).unwrap().run_hybrid);
    }

    #[test]
    fn a_free_hybrid_call_that_never_hurts_is_always_taken_and_a_costly_one_never() {
        let never_hurts = GainPolicy::fit(&examples(), 0.0).unwrap();
        assert!((never_hurts.model.report.hit_policy - 1.0).abs() < 1e-9);
        let costly = GainPolicy::fit(&examples(), 10.0).unwrap();
        assert_eq!(costly.model.report.hybrid_rate, 0.0);
    }

    #[test]
    fn too_few_examples_are_refused_and_the_frozen_file_round_trips() {
        assert!(GainPolicy::fit(&examples()[..5], HYBRID_CALL_COST).is_err());
        let policy = GainPolicy::fit(&examples(), HYBRID_CALL_COST).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gain.json");
        let hash = policy.save(&path).unwrap();
        assert_eq!(hash.len(), 64);
        assert_eq!(GainPolicy::load(&path).unwrap().model, policy.model);
    }
}
