//! The serving engine on the real Qwen2.5-Coder-0.5B: greedy tokens are the same batched as
//! alone, with the prefix cache on and off, and after a restart that restores a persisted corpus
//! prefix from disk; and its yes/no relevance scores rank an answering passage first.
//!
//! Why "the same" allows near-ties here (the tiny f32 models in `triage-engine` are held to bit
//! equality): this GGUF mixes Q8_0 with Q4_K/Q6_K tensors, and candle multiplies those with
//! different kernels for one row and for several, while every quantized product first rounds the
//! activations to int8, which turns 1e-7 differences (attention summation order) into ~0.05 nats.
//! Measured 2026-11-29 on these prompts: the only divergence was at a step whose top-2 logprobs
//! were 0.05 apart. So a run may leave the reference only at a step where the reference's top two
//! tokens are within `NEAR_TIE` nats, and on at most one prompt.

use std::sync::Arc;

use triage::{
    generate, EntropySettings, GenerateRequest, LoadOptions, Model, Prompt, SamplingParams,
};
use triage_engine::{EngineConfig, KvBudget, LlmEngine, PrefixSource, StreamEvent};

/// Largest top-1/top-2 logprob gap at which two correct runs may pick different tokens.
const NEAR_TIE: f32 = 0.15;

/// Greedy tokens of a request run alone, with each step's top-1/top-2 logprob gap.
struct Reference {
    ids: Vec<u32>,
    gaps: Vec<f32>,
}

/// Check `got` against `reference`: equal, or diverging first at a near-tie. Returns whether
/// they were equal.
fn matches_up_to_near_tie(got: &[u32], reference: &Reference, what: &str) -> bool {
    match got.iter().zip(&reference.ids).position(|(a, b)| a != b) {
        None => {
            assert_eq!(got.len(), reference.ids.len(), "{what}: length");
            true
        }
        Some(step) => {
            let gap = reference.gaps[step];
            assert!(
                gap < NEAR_TIE,
                "{what}: diverged at step {step} where the reference was sure (gap {gap})"
            );
            false
        }
    }
}

fn fetched(name: &str) -> Arc<Model> {
    let path = triage_models::paths::fetched_gguf(name);
    assert!(
        path.exists(),
        "{} missing: run `triage models fetch {name}` (scripts/test does)",
        path.display()
    );
    Arc::new(Model::load(name, &path, &LoadOptions::default()).expect("load model"))
}

const CORPUS: &str = "Inventory notes. The red crate holds copper wire and sits in bay 4. \
The green crate holds glass lenses and sits in bay 9. The blue crate holds spare fuses and \
sits in bay 2. Deliveries arrive on Tuesdays; returns leave on Fridays. ";

fn greedy(prompt: Vec<u32>) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Tokens(prompt),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(12),
            logprobs: true,
            top_logprobs: 2,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    }
}

fn config(prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        kv_budget: KvBudget::Blocks(96),
        block_size: 16,
        max_num_batched_tokens: 512,
        max_num_seqs: 8,
        prefix_caching,
        ..EngineConfig::default()
    }
}

/// Run `requests` concurrently to the end; each one's token ids and cached-token count.
fn run(engine: &mut LlmEngine, requests: &[GenerateRequest]) -> Vec<(Vec<u32>, usize)> {
    let rxs: Vec<_> = requests
        .iter()
        .map(|r| engine.add_request(r).expect("add").1)
        .collect();
    while engine.has_unfinished() {
        engine.step().expect("step");
    }
    rxs.into_iter()
        .map(|rx| {
            let (mut ids, mut cached) = (Vec::new(), 0);
            for ev in rx.try_iter() {
                match ev {
                    StreamEvent::Token(t, _) => ids.push(t.id),
                    StreamEvent::Finished { usage, .. } => cached = usage.cached_tokens,
                    StreamEvent::Text(_) => {}
                }
            }
            (ids, cached)
        })
        .collect()
}

#[test]
fn qwen_05b_batched_cached_and_restored_runs_match_generate_alone() {
    let model = fetched("qwen2.5-coder-0.5b");
    let corpus = model.tokenizer.encode(CORPUS, false, false).unwrap();
    let questions = [
        "Question: which bay holds the red crate? Answer:",
        "Question: what does the green crate hold? Answer:",
        "Question: on which day do deliveries arrive? Answer:",
        "Question: what sits in bay 2? Answer:",
    ];
    let requests: Vec<GenerateRequest> = questions
        .iter()
        .map(|q| {
            let mut ids = corpus.clone();
            ids.extend(model.tokenizer.encode(q, false, false).unwrap());
            greedy(ids)
        })
        .collect();
    let alone: Vec<Reference> = requests
        .iter()
        .map(|r| {
            let out = generate(&model, r, |_, _| true).unwrap();
            Reference {
                ids: out.tokens.iter().map(|t| t.id).collect(),
                gaps: out
                    .tokens
                    .iter()
                    .map(|t| t.top_logprobs[0].1 - t.top_logprobs[1].1)
                    .collect(),
            }
        })
        .collect();
    let mut num_diverged = 0;

    for prefix_caching in [false, true] {
        let mut engine = LlmEngine::new(model.clone(), config(prefix_caching)).unwrap();
        // The first request warms the cache; the other three then find the corpus in it.
        let mut got = run(&mut engine, &requests[..1]);
        got.extend(run(&mut engine, &requests[1..]));
        for (i, ((ids, cached), expected)) in got.iter().zip(&alone).enumerate() {
            let what = format!("question {i}, prefix caching {prefix_caching}");
            num_diverged += usize::from(!matches_up_to_near_tie(ids, expected, &what));
            assert_eq!(*cached > 0, prefix_caching && i > 0, "question {i}");
        }
        assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
    }

    let store = tempfile::tempdir().unwrap();
    let mut first = LlmEngine::new(model.clone(), config(true)).unwrap();
    let (handle, source) = first.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert!(matches!(source, PrefixSource::Computed { .. }));
    let before_restart = run(&mut first, &requests);
    drop(first);
    let mut restarted = LlmEngine::new(model.clone(), config(true)).unwrap();
    let (restored, source) = restarted
        .pin_persisted_prefix(&corpus, store.path())
        .unwrap();
    assert_eq!(source, PrefixSource::Disk);
    assert_eq!(restored.num_tokens, handle.num_tokens);
    let got = run(&mut restarted, &requests);
    // The restored blocks hold the very bytes the first engine computed: bit-equal outputs.
    assert_eq!(
        got, before_restart,
        "restart with a persisted prefix changes nothing"
    );
    for (i, ((ids, cached), expected)) in got.iter().zip(&alone).enumerate() {
        let what = format!("question {i} after restart");
        num_diverged += usize::from(!matches_up_to_near_tie(ids, expected, &what));
        assert_eq!(
            *cached, handle.num_tokens,
            "question {i} reuses the restored prefix"
        );
    }
    // Three runs of four prompts: at most one prompt's runs may leave the reference.
    assert!(
        num_diverged <= 3,
        "{num_diverged} of 12 runs diverged at near-ties"
    );
}

#[test]
fn qwen_05b_relevance_prefers_the_passage_that_answers() {
    let model = fetched("qwen2.5-coder-0.5b");
    let mut engine = LlmEngine::new(model, config(true)).unwrap();
    let question = "Which bay holds the red crate?";
    let passages = [
        "The red crate holds copper wire and sits in bay 4.",
        "Deliveries arrive on Tuesdays; returns leave on Fridays.",
        "Bananas are a good source of potassium.",
    ];
    let scores = triage_engine::relevance_scores(&mut engine, question, &passages).unwrap();
    assert_eq!(scores.len(), 3);
    assert!(scores.iter().all(|s| s.is_finite()), "{scores:?}");
    assert!(
        scores[0] > scores[1] && scores[0] > scores[2],
        "the answering passage scores highest: {scores:?}"
    );
    // Batched and alone agree up to batching arithmetic (Q8 activations; see the module doc).
    let alone = triage_engine::relevance_scores(&mut engine, question, &passages[..1]).unwrap();
    assert!(
        (alone[0] - scores[0]).abs() < 0.2,
        "{} vs {}",
        alone[0],
        scores[0]
    );
    assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
}

/// `triage retrieve --mode dual --rerank` with the fetched 0.5B and MiniLM: the model writes a
/// pseudo-passage, the judge reranks, the six features come back, and the answering document
/// ranks first.
#[test]
fn retrieve_dual_with_llm_rerank_finds_the_answering_document() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let models = triage_models::paths::triage_home().join("models");
    std::os::unix::fs::symlink(&models, home.join("models")).unwrap();
    let docs = dir.path().join("docs.jsonl");
    let records = [
        (
            "crate",
            "The red crate holds copper wire and is stored in bay 4 of the warehouse.",
        ),
        (
            "trucks",
            "Delivery trucks arrive on Tuesdays and returns leave on Fridays.",
        ),
        (
            "bananas",
            "Bananas are a good source of potassium and ripen quickly.",
        ),
        (
            "staff",
            "The night shift has six workers who check the loading docks.",
        ),
    ];
    let lines: String = records
        .iter()
        .map(|(id, text)| format!("{}\n", serde_json::json!({"id": id, "text": text})))
        .collect();
    std::fs::write(&docs, lines).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_triage"))
            .args(args)
            .env("TRIAGE_HOME", &home)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    run(&["ingest", "--corpus", "depot", docs.to_str().unwrap()]);
    let out = run(&[
        "retrieve",
        "--corpus",
        "depot",
        "Which bay is the red crate stored in?",
        "--mode",
        "dual",
        "--rerank",
        "--k",
        "3",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(
        !v["pseudo_passage"].as_str().unwrap_or("").trim().is_empty(),
        "{v}"
    );
    let hits = v["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 3, "{v}");
    assert_eq!(hits[0]["document"], "crate", "{v}");
    for name in [
        "top1_dense",
        "top2_margin",
        "mean_top5_dense",
        "dense_rerank_overlap",
        "rerank_top1_dense_rank",
        "structural_fraction",
    ] {
        assert!(v["features"][name].is_number(), "{name}: {v}");
    }
}
