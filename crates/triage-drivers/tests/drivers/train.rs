//! `train_classifier` on labelled queries embedded by the tiny BERT: fitted on the training
//! groups, measured on the held-out ones, saved where asked, and refused without a held-out
//! group.

use triage_drivers::{train_classifier, ClassifierParams};
use triage_policy::is_held_out;

/// `groups` groups of three queries each, every other group global, as JSON lines.
fn labelled(groups: usize) -> String {
    let mut out = String::new();
    for g in 0..groups {
        let (label, query) = if g % 2 == 0 {
            ("global", "What are the main themes across these documents")
        } else {
            ("point", "In which year did the harbour log the most ships")
        };
        for i in 0..3 {
            let row = serde_json::json!({"query": format!("{query} ({g}.{i})?"), "label": label,
                "group": format!("group-{g}")});
            out.push_str(&row.to_string());
            out.push('\n');
        }
    }
    out
}

#[test]
fn the_learned_classifier_is_fitted_on_the_training_groups_and_measured_on_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let embedder = triage_host::fixtures::tiny_config(dir.path())
        .unwrap()
        .pipeline
        .embedder;
    let data = dir.path().join("queries.jsonl");
    std::fs::write(&data, labelled(20)).unwrap();
    let out = dir.path().join("policies/classifier.json");
    let params = ClassifierParams {
        data: data.clone(),
        out: Some(out.clone()),
        embedder,
        zero_shot_model: None,
    };
    let r = train_classifier(&params).unwrap();
    let held: Vec<usize> = (0..20)
        .filter(|g| is_held_out(&format!("group-{g}"), 5))
        .collect();
    assert_eq!(r.held_out_groups, held.len());
    assert_eq!(r.held_out_rows, 3 * held.len());
    assert_eq!(r.train_rows + r.held_out_rows, 60);
    assert!((0.0..=1.0).contains(&r.learned.accuracy), "{r:?}");
    assert!(r.zero_shot.is_none() && r.zero_shot_model.is_none());
    // Saved where asked, its folder made, under the hash reported.
    assert_eq!(r.path, out);
    assert!(out.exists());
    assert_eq!(r.sha256.len(), 64);
    // Rows all in training groups leave nothing to measure on.
    let train_only: String = labelled(20)
        .lines()
        .filter(|l| !held.iter().any(|g| l.contains(&format!("\"group-{g}\""))))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&data, train_only).unwrap();
    let err = train_classifier(&params).unwrap_err().to_string();
    assert!(err.contains("needs rows in both"), "{err}");
}
