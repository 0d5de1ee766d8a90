//! `ingest` as a function: documents are checked against the server's bounds before anything
//! loads or is stored.

use triage_drivers::{ingest, IngestParams};

/// A JSONL document with a 300-byte id is refused by name; the embedder named is never loaded
/// (it does not exist) and no corpus is made.
#[test]
fn an_id_past_its_limit_is_refused_before_anything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("docs.jsonl");
    let line = serde_json::json!({"id": "i".repeat(300), "text": "a document"});
    std::fs::write(&file, format!("{line}\n")).unwrap();
    let params = IngestParams {
        corpus: "limits".into(),
        paths: vec![file],
        delete: Vec::new(),
        embedder: dir.path().join("no-embedder").display().to_string(),
        chunker: triage_retrieval::ChunkerConfig::default(),
    };
    let err = ingest(&params).expect_err("a 300-byte id").to_string();
    assert!(
        err.contains("documents[0].id") && err.contains("300"),
        "{err}"
    );
}
