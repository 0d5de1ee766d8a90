//! `triage eval` end to end on a tiny random model: every system answers every query of a
//! generated suite, the oracle is derived, the report, its JSON and its figures are written, and
//! an interrupted run resumes without asking again what it already has.

use std::path::Path;

use super::eval::{self, EvalConfig, System};
use triage_eval::suites::{Split, SuiteName};
use triage_router::ClassifierSetting;

fn config(dir: &Path, out: &Path) -> EvalConfig {
    EvalConfig {
        suite: SuiteName::KvRetrieval,
        systems: vec![System::Rag, System::Lc, System::Edar, System::Oracle],
        out: out.to_path_buf(),
        limit: 3,
        seed: 1,
        split: Split::Dev,
        context_tokens: 1_200,
        config: triage_host::fixtures::tiny_config(dir).unwrap(),
        edar_classifier: ClassifierSetting::Off,
        quiet: true,
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_run_answers_every_query_with_every_system_and_resumes_after_an_interruption() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let config = config(dir.path(), &out);
    let report = eval::run(&config).unwrap().report;
    assert_eq!(report.queries, 3);
    let names: Vec<&str> = report.systems.iter().map(|s| s.system.as_str()).collect();
    assert_eq!(names, ["rag", "lc", "edar", "oracle"]);
    let lc = &report.systems[1];
    assert_eq!(lc.lc_rate, 1.0);
    // The long-context answers find the corpus prefix cached.
    assert!(lc.computed_tokens < lc.tokens.value / 2.0, "{lc:?}");
    let results = out.join("results.jsonl");
    let first = lines(&results);
    assert_eq!(first.len(), 12);
    for name in ["report.md", "report.json", "tau_sweep.png", "tau_sweep.svg"] {
        assert!(out.join(name).exists(), "{name}");
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| oracle |") && md.contains("kv-retrieval (dev split)"));
    assert!(
        md.contains("τ = 0.6 (full_softmax over the first 30 tokens, in nats)"),
        "{md}"
    );
    // Interrupted after five answers: a rerun keeps them and answers the rest.
    std::fs::write(&results, first[..5].join("\n") + "\n").unwrap();
    eval::run(&config).unwrap();
    let resumed = lines(&results);
    assert_eq!(resumed.len(), 12);
    assert_eq!(resumed[..5], first[..5]);
    // A finished run asks nothing again.
    eval::run(&config).unwrap();
    assert_eq!(lines(&results), resumed);
    // A smaller limit reports on its own questions only; a larger one only adds answers.
    let mut fewer = config.clone();
    fewer.limit = 2;
    let run = eval::run(&fewer).unwrap();
    assert_eq!((run.report.queries, run.rows.len()), (2, 8));
    let mut more = config.clone();
    more.limit = 4;
    assert_eq!(eval::run(&more).unwrap().report.queries, 4);
    let grown = lines(&results);
    assert_eq!((grown.len(), &grown[..12]), (16, &resumed[..]));
    // Another suite into the same folder is refused.
    let mut other = config.clone();
    other.suite = SuiteName::Passkey;
    let err = eval::run(&other).unwrap_err().to_string();
    assert!(
        err.contains("holds a run with other settings (suite: \"kv-retrieval\" → \"passkey\")"),
        "{err}"
    );
    // A run recorded before a setting existed resumes while that setting is off (null).
    let manifest = out.join("run.json");
    let recorded = std::fs::read_to_string(&manifest).unwrap();
    let mut older: serde_json::Value = serde_json::from_str(&recorded).unwrap();
    let monitor = older["routing"]["monitor"].as_object_mut().unwrap();
    assert_eq!(monitor.remove("probe"), Some(serde_json::Value::Null));
    std::fs::write(&manifest, older.to_string()).unwrap();
    eval::run(&config).unwrap();
    assert_eq!(lines(&results), grown);
    // So is another τ: the answers already there were routed with the old one.
    let mut other = config.clone();
    other.config.routing.monitor.tau = 0.1;
    let err = eval::run(&other).unwrap_err().to_string();
    assert!(err.contains("routing:"), "{err}");
    // A run from before forced RAG asked the routing's own prompt is not resumed into: its
    // forced answers were asked another prompt.
    let mut older: serde_json::Value = serde_json::from_str(&recorded).unwrap();
    let keys = older.as_object_mut().unwrap();
    assert_eq!(keys.remove("forced_rag_prompt"), Some("as routed".into()));
    std::fs::write(&manifest, older.to_string()).unwrap();
    let err = eval::run(&config).unwrap_err().to_string();
    assert!(err.contains("forced_rag_prompt: nothing"), "{err}");
}

#[test]
fn an_export_holds_the_questions_a_run_asks_and_the_corpora_that_answer_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("suite.jsonl");
    let mut config = config(dir.path(), &file);
    config.limit = 5;
    assert_eq!(eval::export(&config, &file).unwrap(), 5);
    let groups: Vec<serde_json::Value> = lines(&file)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut asked = 0;
    for group in &groups {
        let text: String = group["documents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["text"].as_str().unwrap())
            .collect();
        for example in group["examples"].as_array().unwrap() {
            let question = example["question"].as_str().unwrap();
            let gold = example["golds"][0].as_str().unwrap();
            assert!(!question.is_empty() && text.contains(gold), "{example}");
            asked += 1;
        }
    }
    assert_eq!(asked, 5);
    // A second export of the same settings is the same file: the suite is seeded.
    let first = std::fs::read(&file).unwrap();
    eval::export(&config, &file).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), first);
}

#[test]
fn calibration_is_refused_on_the_test_split() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), &dir.path().join("run"));
    config.split = Split::Test;
    let rule = triage_eval::calibrate::Rule::Elbow(triage_eval::calibrate::Floor::None);
    let err = super::calibrate::calibrate(
        &config,
        &dir.path().join("routing.toml"),
        &super::calibrate::CalibrateOptions::tau(rule),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("dev split only"), "{err}");
}

#[test]
fn calibration_can_choose_whether_forced_rag_offers_the_decline() {
    use super::calibrate::{calibrate, offer_run_dir, CalibrateOptions};
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
