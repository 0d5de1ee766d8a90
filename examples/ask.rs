//! Ask a question over a small corpus through the routing pipeline, from Rust.
//!
//! Needs the default models (`cargo run --release -- models fetch`). Run:
//! `cargo run --release --example ask -- "When was the Duchy of Normandy founded?"`
//! The long-context role is played by the 0.5B here so the example stays quick on a CPU.

use std::path::Path;

use triage::{AnswerEvent, AskRequest, Engine, ModelRole, TriageConfig};
use triage_retrieval::{load_documents, ChunkerConfig, CorpusStore};

fn main() -> anyhow::Result<()> {
    let question = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "When was the Duchy of Normandy founded?".into());
    // Eight SQuAD paragraphs about the Normans, shipped with the tests.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/squad-normans");
    let docs = load_documents(&fixture.join("documents.jsonl"))?;

    let scratch = tempfile::tempdir()?;
    let mut config = TriageConfig::default();
    config.set_model(ModelRole::LongContext, triage::DEFAULT_BASE_MODEL)?;
    config.pipeline.prefix_dir = Some(scratch.path().join("prefixes"));
    let engine = Engine::new(config)?.with_store(scratch.path());

    // Ingest with the engine's embedder, then load: the corpus prefix is pinned in the
    // long-context model, so an escalation prefills only the question.
    let embedder = triage::load_embedder(triage::DEFAULT_EMBEDDER)?;
    let tokenizer = embedder.model.tokenizer().clone();
    CorpusStore::new(scratch.path()).ingest(
        "normans",
        &docs,
        &[],
        &embedder,
        &tokenizer,
        ChunkerConfig::default(),
    )?;
    let info = engine.load_corpus("normans")?;
    eprintln!(
        "corpus: {} documents, {:?} prefix tokens",
        info.num_documents, info.prefix_tokens
    );

    let request = AskRequest {
        corpus: "normans".into(),
        question,
        ..AskRequest::default()
    };
    let answer = engine.ask_stream(&request, |event| match event {
        AnswerEvent::Corpus { generation } => eprintln!("[corpus normans@{generation}]"),
        AnswerEvent::Route(path) => eprintln!("[answering via {}]", path.as_str()),
        AnswerEvent::Delta(text) => print!("{text}"),
    })?;
    println!();
    eprintln!(
        "path {} ({}); {} tokens, {} of them cached; {:.1} s",
        answer.decision.path.as_str(),
        answer.decision.reason,
        answer.usage.total_tokens,
        answer.usage.cached_prompt_tokens,
        answer.timings.total_ms / 1e3
    );
    Ok(())
}
