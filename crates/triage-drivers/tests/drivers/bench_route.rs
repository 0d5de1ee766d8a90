//! `bench_route` on a two-article SQuAD file and the tiny models: every question answered
//! forced RAG, forced long context and auto over its own article's paragraphs, each path
//! scored, and one row per question written.

use std::path::Path;

use triage_drivers::{bench_route, RouteBenchConfig};
use triage_models::DeviceSpec;

/// Two articles of two paragraphs, two answerable questions each and one unanswerable.
fn squad(path: &Path) {
    let article = |title: &str, place: &str| {
        let paragraph = |i: usize| {
            serde_json::json!({
                "context": format!("In 16{i}0 the harbour of {place} logged {i}2 ships carrying salt."),
                "qas": [
                    {"id": format!("{title}-{i}"), "question": format!("How many ships did {place} log in 16{i}0?"),
                     "answers": [{"text": format!("{i}2")}]},
                    {"id": format!("{title}-{i}-x"), "question": "Who built the quay?", "answers": [],
                     "is_impossible": true}
                ]
            })
        };
        serde_json::json!({"title": title, "paragraphs": [paragraph(1), paragraph(2)]})
    };
    let file =
        serde_json::json!({"data": [article("Lisbon", "Lisbon"), article("Genoa", "Genoa")]});
    std::fs::write(path, file.to_string()).unwrap();
}

#[test]
fn each_question_is_answered_three_ways_over_its_own_article() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = triage_host::fixtures::tiny_config(dir.path()).unwrap();
    let model = dir.path().join("tiny.gguf").to_string_lossy().into_owned();
    squad(&dir.path().join("squad.json"));
    let rows = dir.path().join("rows.jsonl");
    let config = RouteBenchConfig {
        questions: 3,
        paragraphs: 2,
        per_article: 2,
        base: model.clone(),
        long_context: model,
        tau: Some(0.5),
        save_combined: None,
        rows: Some(rows.clone()),
        device: DeviceSpec::Cpu,
        squad: dir.path().join("squad.json"),
        embedder: tiny.pipeline.embedder,
    };
    let bench = bench_route(&config).unwrap();
    // Two from the first article, the third from the second; unanswerable ones left out.
    assert_eq!((bench.questions, bench.articles), (3, 2));
    assert_eq!(bench.tau, 0.5);
    assert!(bench.mean_corpus_tokens > 0.0, "{bench:?}");
    let paths: Vec<&str> = bench.paths.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["rag", "lc", "auto"]);
    assert!(bench.paths.iter().all(|p| p.questions == 3), "{bench:?}");
    assert_eq!(bench.paths[1].lc_rate, 1.0);
    assert_eq!(bench.paths[0].lc_rate, 0.0);
    let written: Vec<serde_json::Value> = crate::lines(&rows)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(written.len(), 3);
    assert_eq!(written[2]["article"], 1);
    assert_eq!(written[0]["golds"][0], "12");
    for row in &written {
        for path in ["rag", "lc", "auto"] {
            assert!(row[path]["text"].is_string(), "{row}");
            assert!(row[path]["decision"]["path"].is_string(), "{row}");
        }
    }
}
