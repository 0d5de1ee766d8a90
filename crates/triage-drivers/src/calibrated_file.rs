//! The routing TOML `triage calibrate` writes: the calibrated `[routing.monitor]` and the
//! `[routing.retrieval]` its RAG answers came from, for the engine and the server to read.

use std::path::PathBuf;

use serde::Serialize;
use triage_router::RoutingConfig;
use triage_router::{Calibration, RetrievalSettings};

use crate::error::{other, Result};

/// What `triage calibrate` writes: `[routing.monitor]` and `[routing.retrieval]` tables the
/// engine and the server read. The retrieval settings travel with τ: the RAG answers it was
/// chosen on came from them, and another search (dense or hybrid) moves the statistic.
#[derive(Debug, Serialize)]
struct CalibratedFile {
    routing: CalibratedRouting,
}

#[derive(Debug, Serialize)]
struct CalibratedRouting {
    monitor: CalibratedMonitor,
    retrieval: RetrievalSettings,
}

#[derive(Debug, Serialize)]
struct CalibratedMonitor {
    /// Absent when a combined score decides instead (the engine's default τ stays, unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    tau: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    combined_score: Option<PathBuf>,
    window: usize,
    estimator: triage_engine::entropy_monitor::EntropyEstimator,
    unit: triage_engine::entropy_monitor::EntropyUnit,
    /// Whether the RAG prompt offered Self-Route's decline: τ and the score hold only for
    /// answers to the prompt they were calibrated on.
    self_route: bool,
    calibration: Calibration,
}

/// What decides escalation in a calibrated routing file.
pub(crate) enum Escalation {
    Tau(f64),
    /// The combined score saved at this path, its threshold inside it.
    Combined(PathBuf),
}

/// The routing TOML for a calibration on RAG answers retrieved with `retrieval`.
pub(crate) fn calibrated_toml(
    escalation: Escalation,
    calibration: &Calibration,
    routing: &RoutingConfig,
) -> Result<String> {
    let (tau, combined_score) = match escalation {
        Escalation::Tau(tau) => (Some(tau as f32), None),
        Escalation::Combined(path) => (None, Some(path)),
    };
    let file = CalibratedFile {
        routing: CalibratedRouting {
            retrieval: routing.retrieval.clone(),
            monitor: CalibratedMonitor {
                tau,
                combined_score,
                window: calibration.window,
                estimator: calibration.estimator,
                unit: calibration.unit,
                self_route: routing.monitor.self_route,
                calibration: calibration.clone(),
            },
        },
    };
    Ok(format!(
        "# Written by `triage calibrate` on the {} split of {} ({} queries).\n{}",
        calibration.split,
        calibration.suite,
        calibration.queries,
        toml::to_string(&file).map_err(other("writing the calibration as TOML"))?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use triage_host::TriageConfig;
    use triage_router::RagSearch;

    #[test]
    fn the_calibrated_file_is_a_routing_config_the_engine_reads() {
        let calibration = Calibration {
            model: "qwen2.5-coder-0.5b".into(),
            estimator: Default::default(),
            unit: Default::default(),
            window: 30,
            suite: "squad-v2".into(),
            split: "dev".into(),
            queries: 40,
            data_sha256: "ab".repeat(32),
            rule: "elbow".into(),
            accuracy: 0.7,
            rag_accuracy: 0.5,
            lc_accuracy: 0.72,
            escalation_rate: 0.4,
            accuracy_retained: 0.97,
            token_reduction: 0.3,
        };
        let retrieval = RetrievalSettings {
            search: RagSearch::Hybrid,
            k: 6,
            ..RetrievalSettings::default()
        };
        let mut routing = RoutingConfig {
            retrieval: retrieval.clone(),
            ..RoutingConfig::default()
        };
        routing.monitor.self_route = false;
        let text = calibrated_toml(Escalation::Tau(0.85), &calibration, &routing).unwrap();
        let config = TriageConfig::from_toml_str(&text).unwrap();
        assert_eq!(config.routing.monitor.tau, 0.85);
        // τ holds for the retrieval and the RAG prompt its answers came from, so the file
        // carries both.
        assert_eq!(config.routing.retrieval, retrieval);
        assert!(!config.routing.monitor.self_route);
        assert_eq!(
            config.routing.monitor.calibration.as_ref(),
            Some(&calibration)
        );
        config.routing.validate().unwrap();
        // The server reads the same file, validated whole as `triage serve` does.
        config.validate().unwrap();
        // Changing the estimator after calibrating is refused.
        let edited = text.replace(
            "[routing.monitor]\n",
            "[routing.monitor]\nunit = \"bits\"\n",
        );
        let edited = edited.replacen("unit = \"nats\"\n", "", 1);
        let config = TriageConfig::from_toml_str(&edited).unwrap();
        let err = config.routing.validate().unwrap_err().to_string();
        assert!(err.contains("calibrated"), "{err}");
        // A calibrated combined score: the file names it and leaves τ at the default.
        let path = PathBuf::from("/runs/squad-v2-calibrated.combined.json");
        let text =
            calibrated_toml(Escalation::Combined(path.clone()), &calibration, &routing).unwrap();
        let config = TriageConfig::from_toml_str(&text).unwrap();
        assert_eq!(config.routing.monitor.combined_score, Some(path));
        assert_eq!(
            config.routing.monitor.tau,
            RoutingConfig::default().monitor.tau
        );
        config.routing.validate().unwrap();
    }
}
