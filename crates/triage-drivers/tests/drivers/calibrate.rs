//! `calibrate` on a tiny random model: refused on the test split, τ chosen and written as a
//! routing file the engine reads, and with `choose_self_route` both prompt settings calibrated
//! and the better one written.

use triage_drivers::{calibrate, offer_run_dir, CalibrateOptions};
use triage_eval::suites::Split;
use triage_host::TriageConfig;

use crate::{config, lines};

#[test]
fn calibration_is_refused_on_the_test_split() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), &dir.path().join("run"));
    config.split = Split::Test;
    let rule = triage_eval::calibrate::Rule::Elbow(triage_eval::calibrate::Floor::None);
    let err = calibrate(
        &config,
        &dir.path().join("routing.toml"),
        &CalibrateOptions::tau(rule),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("dev split only"), "{err}");
}

#[test]
fn calibration_can_choose_whether_forced_rag_offers_the_decline() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("cal");
    let config = config(dir.path(), &runs);
    let asked = config.config.routing.monitor.self_route;
    let routing = dir.path().join("routing.toml");
    // The tiny model's answers are noise, and some escalate at any τ: a rule every setting
    // can meet.
    let rule = triage_eval::calibrate::Rule::EscalationRate(1.0);
    let options = CalibrateOptions {
        choose_self_route: true,
        ..CalibrateOptions::tau(rule)
    };
    let c = calibrate(&config, &routing, &options).unwrap();
    // Forced RAG answered again, asked the other way, in its own run directory; long
    // context's answers were not asked twice.
    let other_dir = offer_run_dir(&runs, !asked);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(other_dir.join("run.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["routing"]["monitor"]["self_route"], !asked);
    let rows = lines(&other_dir.join("results.jsonl"));
    assert_eq!(rows.len(), 3);
    assert!(
        rows.iter().all(|r| r.contains("\"system\":\"rag\"")),
        "{rows:?}"
    );
    // The written setting is the one whose point the other does not beat.
    let other = c.other.expect("the setting left out");
    assert_eq!(other.self_route, !c.self_route);
    let left_out = other.point.expect("an operating point for each setting");
    assert!(!triage_eval::calibrate::beats(
        &left_out,
        &c.chosen.at,
        None
    ));
    let text = std::fs::read_to_string(&routing).unwrap();
    assert!(
        text.contains(&format!("self_route = {}", c.self_route)),
        "{text}"
    );
}

#[test]
fn a_calibrated_tau_is_written_as_a_routing_file_the_engine_reads() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("cal");
    let config = config(dir.path(), &runs);
    let routing = dir.path().join("routing.toml");
    let rule = triage_eval::calibrate::Rule::EscalationRate(1.0);
    let c = calibrate(&config, &routing, &CalibrateOptions::tau(rule)).unwrap();
    // Forced RAG and long context answered every dev question once, in the run directory.
    let rows = lines(&runs.join("results.jsonl"));
    assert_eq!(rows.len(), 2 * 3, "{rows:?}");
    assert!(c.combined.is_none() && c.other.is_none());
    assert_eq!(c.self_route, config.config.routing.monitor.self_route);
    let written = TriageConfig::from_file(&routing).unwrap();
    assert_eq!(written.routing.monitor.tau, c.chosen.tau as f32);
    // The calibration as chosen (compared field by field: a random model's accuracy retained
    // is NaN, 0 of 0).
    let recorded = written.routing.monitor.calibration.clone().unwrap();
    assert_eq!(
        (recorded.rule, recorded.queries, recorded.data_sha256),
        (c.calibration.rule, 3, c.calibration.data_sha256)
    );
    assert_eq!(recorded.escalation_rate, c.calibration.escalation_rate);
    written.routing.validate().unwrap();
}
