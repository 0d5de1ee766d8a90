//! Hidden-state probes, read offline from the residual streams the RAG answers recorded
//! (`monitor.probe_layers`): per layer, at the last prompt token (before any answer token) and
//! over the first answer tokens, a mass-mean probe — the difference between the wrong and the
//! right answers' mean standardised states — fitted on four folds of corpora and scored on the
//! fifth, so no corpus is both fitted and scored; its AUROC for "the RAG answer is wrong"
//! (`triage_policy::MassMeanProbe`, fitted and scored by `triage_policy::out_of_fold_scores`).

use serde::Serialize;
use triage_policy::{auroc, fold_of, out_of_fold_scores};

use crate::results::ResultRow;

/// Folds of the out-of-fold fit; an answer goes to fold `fold_of(its corpus, FOLDS)`.
const FOLDS: u64 = 5;

/// One probe's out-of-fold AUROC.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeAuroc {
    pub layer: usize,
    /// "prompt" (the last prompt token) or "answer" (the first answer tokens).
    pub at: &'static str,
    /// Answers scored.
    pub n: usize,
    pub auroc: Option<f64>,
}

/// Every recorded layer's probes over the `rag` rows (others are ignored).
pub fn probe_aurocs(rows: &[&ResultRow]) -> Vec<ProbeAuroc> {
    let recorded: Vec<(&ResultRow, &triage_types::ProbeStates)> = rows
        .iter()
        .filter_map(|r| Some((*r, r.decision.monitor.as_ref()?.probe.as_ref()?)))
        .collect();
    let Some((_, first)) = recorded.first() else {
        return Vec::new();
    };
    let layers = first.layers.clone();
    let mut out = Vec::new();
    for (l, &layer) in layers.iter().enumerate() {
        for at in ["prompt", "answer"] {
            let data: Vec<(u64, &[f32], bool)> = recorded
                .iter()
                .filter(|(_, p)| p.layers == layers)
                .filter_map(|(r, p)| {
                    let states = if at == "prompt" { &p.prompt } else { &p.answer };
                    let state = states.get(l)?;
                    Some((fold_of(&r.group, FOLDS), state.as_slice(), !r.score.correct))
                })
                .collect();
            let (scores, labels) = out_of_fold_scores(&data, FOLDS);
            out.push(ProbeAuroc {
                layer,
                at,
                n: scores.len(),
                auroc: auroc(&scores, &labels),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::row;
    use rand::{Rng, SeedableRng};
    use triage_types::{MonitorRecord, ProbeStates};

    /// 60 RAG answers over 12 corpora, every third wrong. Layer 5's states carry the label
    /// along one random direction under noise; layer 1's are noise only.
    fn rows() -> Vec<ResultRow> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let direction: Vec<f32> = (0..32).map(|_| rng.random_range(-1.0..1.0)).collect();
        (0..60)
            .map(|i| {
                let wrong = i % 3 == 0;
                let mut r = row("rag", &format!("e{i}"), !wrong, 100);
                r.group = format!("corpus-{}", i % 12);
                let noise = |rng: &mut rand::rngs::StdRng| -> Vec<f32> {
                    (0..32).map(|_| rng.random_range(-1.0..1.0)).collect()
                };
                let signal: Vec<f32> = noise(&mut rng)
                    .iter()
                    .zip(&direction)
                    .map(|(n, d)| n + if wrong { 1.5 * d } else { 0.0 })
                    .collect();
                let mut monitor: MonitorRecord = serde_json::from_value(serde_json::json!({
                    "tau": {"tau": 0.6, "model": "m", "estimator": "full_softmax",
                            "unit": "nats", "window": 30},
                    "trace": [], "in_answer_span": [], "mean": null, "decided_at": null,
                    "decision": "accept",
                    "signals": {"mean_entropy": null, "span_mean_entropy": null,
                                "max_entropy": null, "mean_nll": null,
                                "mean_top2_margin": null, "declined": false},
                    "combined_p_wrong": null, "combined_threshold": null, "rag_answer": ""
                }))
                .unwrap();
                monitor.probe = Some(ProbeStates {
                    layers: vec![1, 5],
                    prompt: vec![noise(&mut rng), signal.clone()],
                    answer: vec![noise(&mut rng), noise(&mut rng)],
                });
                r.decision.monitor = Some(monitor);
                r
            })
            .collect()
    }

    #[test]
    fn a_layer_that_carries_the_label_is_found_and_noise_is_not() {
        let rows = rows();
        let refs: Vec<&ResultRow> = rows.iter().collect();
        let probes = probe_aurocs(&refs);
        assert_eq!(probes.len(), 4);
        let get = |layer, at| {
            probes
                .iter()
                .find(|p| p.layer == layer && p.at == at)
                .and_then(|p| p.auroc)
                .unwrap()
        };
        assert!(get(5, "prompt") > 0.9, "{probes:?}");
        for (layer, at) in [(1, "prompt"), (1, "answer"), (5, "answer")] {
            let a = get(layer, at);
            assert!((0.2..0.8).contains(&a), "{layer} {at}: {a}");
        }
        assert!(probes.iter().all(|p| p.n == 60));
        // Without recorded states there is nothing to report.
        let plain = row("rag", "e0", true, 100);
        assert!(probe_aurocs(&[&plain]).is_empty());
    }
}
