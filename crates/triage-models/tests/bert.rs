//! BERT encoders: the tiny random checkpoints (padding never changes a text's embedding, the
//! shipped tokenizer's truncation and padding are switched off, the cross-encoder scores pairs)
//! and the real all-MiniLM-L6-v2 against sentence-transformers (golden file made by
//! scripts/golden/make_minilm_golden.py; cosine ≥ 0.999 and the same token ids).

use std::path::PathBuf;

use candle_core::Device;
use triage_models::bert::{CrossEncoder, SentenceEmbedder};
use triage_models::bert_fixtures::write_tiny_bert;

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn tiny_embeddings_are_unit_length_and_padding_free() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_bert(dir.path(), false, 1).unwrap();
    let e = SentenceEmbedder::load(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(
        e.max_len(),
        48,
        "from sentence_bert_config.json, not the tokenizer's 8"
    );
    let texts = [
        "a short one",
        "a much longer sentence with many more words than the shipped truncation allows",
        "x",
    ];
    let batch = e.embed(&texts).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let alone = e.embed(&[t]).unwrap().remove(0);
        let n: f32 = alone.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "norm {n}");
        let max_diff = alone
            .iter()
            .zip(&batch[i])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            max_diff < 1e-5,
            "text {i}: batch vs alone differ by {max_diff}"
        );
    }
    // Words past the shipped 8-token truncation still count.
    let a = e
        .embed(&["one two three four five six seven eight nine"])
        .unwrap();
    let b = e
        .embed(&["one two three four five six seven eight zero"])
        .unwrap();
    assert!(cosine(&a[0], &b[0]) < 0.99999);
}

#[test]
fn tiny_cross_encoder_scores_pairs_consistently() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_bert(dir.path(), true, 2).unwrap();
    let ce = CrossEncoder::load(dir.path(), &Device::Cpu).unwrap();
    let passages = ["the cat sat", "stock prices fell sharply today", "a cat"];
    let scores = ce.score("where is the cat", &passages).unwrap();
    assert_eq!(scores.len(), 3);
    assert!(scores.iter().all(|s| s.is_finite()));
    assert!(scores[0] != scores[1]);
    let reversed = ce
        .score("where is the cat", &[passages[2], passages[1], passages[0]])
        .unwrap();
    for (a, b) in scores.iter().zip(reversed.iter().rev()) {
        assert!((a - b).abs() < 1e-5, "order changed a score: {a} vs {b}");
    }
    // A sentence checkpoint has no classifier head: a clear error.
    let plain = tempfile::tempdir().unwrap();
    write_tiny_bert(plain.path(), false, 3).unwrap();
    let err = CrossEncoder::load(plain.path(), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("lacks"), "{err}");
}

#[test]
fn minilm_matches_sentence_transformers() {
    let golden_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/minilm_embeddings.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_path).unwrap()).unwrap();
    let dir = triage_models::paths::model_dir("minilm-l6");
    assert!(
        dir.join("model.safetensors").exists(),
        "{} missing: run `triage models fetch minilm-l6` (scripts/test does)",
        dir.display()
    );
    let e = SentenceEmbedder::load(&dir, &Device::Cpu).unwrap();
    assert_eq!(
        e.max_len() as u64,
        golden["max_seq_length"].as_u64().unwrap()
    );
    let sentences: Vec<&str> = golden["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for (i, s) in sentences.iter().enumerate() {
        let ids: Vec<u32> = e.tokenizer().encode(*s, true).unwrap().get_ids().to_vec();
        let want: Vec<u32> = golden["token_ids"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, want, "token ids of sentence {i}");
    }
    let ours = e.embed(&sentences).unwrap();
    for (i, v) in ours.iter().enumerate() {
        let want: Vec<f32> = golden["embeddings"][i]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let c = cosine(v, &want);
        assert!(c >= 0.999, "sentence {i}: cosine {c}");
    }
}
