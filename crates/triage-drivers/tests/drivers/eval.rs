//! `triage eval` end to end on a tiny random model: every system answers every query of a
//! generated suite, the oracle is derived, the report, its JSON and its figures are written, and
//! an interrupted run resumes without asking again what it already has.

use triage_drivers::{evaluate, export_suite};
use triage_eval::suites::SuiteName;

use crate::{config, lines};

#[test]
fn a_run_answers_every_query_with_every_system_and_resumes_after_an_interruption() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let config = config(dir.path(), &out);
    let report = evaluate(&config).unwrap().report;
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
    evaluate(&config).unwrap();
    let resumed = lines(&results);
    assert_eq!(resumed.len(), 12);
    assert_eq!(resumed[..5], first[..5]);
    // A finished run asks nothing again.
    evaluate(&config).unwrap();
    assert_eq!(lines(&results), resumed);
    // A smaller limit reports on its own questions only; a larger one only adds answers.
    let mut fewer = config.clone();
    fewer.limit = 2;
    let run = evaluate(&fewer).unwrap();
    assert_eq!((run.report.queries, run.rows.len()), (2, 8));
    let mut more = config.clone();
    more.limit = 4;
    assert_eq!(evaluate(&more).unwrap().report.queries, 4);
    let grown = lines(&results);
    assert_eq!((grown.len(), &grown[..12]), (16, &resumed[..]));
    // Another suite into the same folder is refused.
    let mut other = config.clone();
    other.suite = SuiteName::Passkey;
    let err = evaluate(&other).unwrap_err().to_string();
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
    evaluate(&config).unwrap();
    assert_eq!(lines(&results), grown);
    // So is another τ: the answers already there were routed with the old one.
    let mut other = config.clone();
    other.config.routing.monitor.tau = 0.1;
    let err = evaluate(&other).unwrap_err().to_string();
    assert!(err.contains("routing:"), "{err}");
    // A run from before forced RAG asked the routing's own prompt is not resumed into: its
    // forced answers were asked another prompt.
    let mut older: serde_json::Value = serde_json::from_str(&recorded).unwrap();
    let keys = older.as_object_mut().unwrap();
    assert_eq!(keys.remove("forced_rag_prompt"), Some("as routed".into()));
    std::fs::write(&manifest, older.to_string()).unwrap();
    let err = evaluate(&config).unwrap_err().to_string();
    assert!(err.contains("forced_rag_prompt: nothing"), "{err}");
}

#[test]
fn an_export_holds_the_questions_a_run_asks_and_the_corpora_that_answer_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("suite.jsonl");
    let mut config = config(dir.path(), &file);
    config.limit = 5;
    assert_eq!(export_suite(&config, &file).unwrap(), 5);
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
    export_suite(&config, &file).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), first);
}
