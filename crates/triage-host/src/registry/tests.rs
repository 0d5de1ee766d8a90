//! The registry with an engine that can be told to break: a stored change that cannot be
//! loaded is reported, not lost.

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use triage_engine::{EngineConfig, GenerateRequest, KvBudget, LlmEngine, TokenOutput};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;
use triage_router::{Generated, RouterError};

use super::*;

/// An engine that can be told to fail every model lookup (as a broken model would).
struct Flaky {
    engine: LlmEngine,
    broken: bool,
    /// Prefixes pinned so far (each a prefill of the corpus on the long-context model).
    num_pins: usize,
}

impl Generator for Flaky {
    fn model(&self, role: ModelRole) -> triage_router::Result<Arc<triage_models::model::Model>> {
        if self.broken {
            return Err(RouterError::Invalid("the model is broken".into()));
        }
        Generator::model(&self.engine, role)
    }

    fn generate(
        &mut self,
        role: ModelRole,
        requests: &[GenerateRequest],
        watch: &mut dyn FnMut(usize, &TokenOutput, &str) -> bool,
    ) -> triage_router::Result<Vec<Generated>> {
        Generator::generate(&mut self.engine, role, requests, watch)
    }

    fn pin_prefix(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
    ) -> triage_router::Result<PinnedPrefix> {
        self.num_pins += 1;
        Generator::pin_prefix(&mut self.engine, role, tokens, dir)
    }

    fn unpin_prefix(&mut self, _role: ModelRole, _tokens: &[u32]) -> triage_router::Result<()> {
        Ok(())
    }
}

fn doc(id: &str, text: &str) -> Document {
    Document {
        id: id.into(),
        title: id.into(),
        text: text.into(),
    }
}

/// A change whose documents are stored but whose new generation cannot be loaded says so,
/// keeps serving the previous documents, and the next load picks the stored ones up.
#[test]
fn a_stored_change_that_cannot_be_loaded_is_reported_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (mut g, registry) = lone_replica(dir.path());
    let routing = RoutingConfig::default();
    let created = registry
        .create(&mut g, &routing, "c", &[doc("a", "the cat sat on the mat")])
        .unwrap();
    assert!(created.reload_error.is_none());
    g.broken = true;
    let change = registry
        .add_documents(
            &mut g,
            &routing,
            "c",
            &[doc("b", "the dog ran to the park")],
        )
        .unwrap();
    assert_eq!(change.added, 1);
    let why = change.reload_error.expect("the reload failed");
    assert!(why.contains("stored") && why.contains("previous"), "{why}");
    assert_eq!(
        change.corpus.num_documents, 1,
        "the previous documents are served"
    );
    assert_eq!(
        registry.get("c").unwrap().unwrap().corpus.num_documents(),
        1
    );
    g.broken = false;
    let reloaded = registry
        .load(&mut g, &routing, "c", PrefixUse::MayRead)
        .unwrap();
    assert_eq!(reloaded.num_documents, 2, "the stored change was kept");
}

/// A replica with a store and prefix folder of its own under `dir`.
fn lone_replica(dir: &Path) -> (Flaky, CorpusRegistry) {
    let (g, embedder) = replica(dir);
    let registry = CorpusRegistry::new(&dir.join("store"), dir.join("prefixes"), embedder);
    (g, registry)
}

/// An engine over a tiny model and a tiny embedder, both written under `dir`.
fn replica(dir: &Path) -> (Flaky, BertEmbedder) {
    let path = dir.join("tiny.gguf");
    let spec = TinySpec {
        context_length: 2048,
        ..TinySpec::new(Architecture::Qwen2)
    };
    write_tiny_gguf(&path, &spec, GgmlDType::F32).unwrap();
    let model = Arc::new(Model::load("tiny", &path, &LoadOptions::default()).unwrap());
    let config = EngineConfig {
        kv_budget: KvBudget::Blocks(256),
        ..EngineConfig::default()
    };
    let bert = dir.join("bert");
    triage_models::bert_fixtures::write_tiny_bert(&bert, false, 7).unwrap();
    let embedder = BertEmbedder {
        name: "tiny-bert".into(),
        model: triage_models::bert::SentenceEmbedder::load(&bert, &candle_core::Device::Cpu)
            .unwrap(),
    };
    let engine = Flaky {
        engine: LlmEngine::new(model, config).unwrap(),
        broken: false,
        num_pins: 0,
    };
    (engine, embedder)
}

/// Two replicas over one shared store: one writes, the other loads a corpus it has never seen
/// on its first question, and moves to the writer's next generation on the question after the
/// change, without a restart.
#[test]
fn a_replica_sharing_the_store_follows_another_writers_generations() {
    let shared = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ((mut a, a_embedder), (mut b, b_embedder)) = (replica(a_dir.path()), replica(b_dir.path()));
    let store = shared.path().join("store");
    let prefixes = shared.path().join("prefixes");
    let writer = CorpusRegistry::new(&store, prefixes.clone(), a_embedder);
    let reader = CorpusRegistry::new(&store, prefixes, b_embedder);
    let routing = RoutingConfig::default();
    writer
        .create(&mut a, &routing, "c", &[doc("a", "the cat sat on the mat")])
        .unwrap();
    let (loaded, _) = reader
        .get_or_load(&mut b, &routing, "c", PrefixUse::MayRead)
        .unwrap();
    assert_eq!(
        (loaded.corpus.generation, loaded.corpus.num_documents()),
        (1, 1)
    );
    let (again, _) = reader
        .get_or_load(&mut b, &routing, "c", PrefixUse::MayRead)
        .unwrap();
    assert!(
        Arc::ptr_eq(&loaded, &again),
        "an unchanged corpus is not reopened"
    );
    writer
        .add_documents(
            &mut a,
            &routing,
            "c",
            &[doc("b", "the dog ran to the park")],
        )
        .unwrap();
    let (moved, _) = reader
        .get_or_load(&mut b, &routing, "c", PrefixUse::MayRead)
        .unwrap();
    assert_eq!(
        (moved.corpus.generation, moved.corpus.num_documents()),
        (2, 2)
    );
    assert_eq!(reader.list().unwrap()[0].generation, Some(2));
}

/// A corpus loaded unpinned costs no long-context prefill until a question that may read its
/// prefix asks: RAG answers and document listings leave it unpinned, the first such question
/// pins it once, and the questions after it find it resident.
#[test]
fn an_unpinned_corpus_is_pinned_by_the_first_question_that_may_take_long_context() {
    let dir = tempfile::tempdir().unwrap();
    let (mut g, registry) = lone_replica(dir.path());
    let routing = RoutingConfig::default();
    let docs = [doc("a", "the cat sat on the mat"), doc("b", "the dog ran")];
    registry.create(&mut g, &routing, "c", &docs).unwrap();
    let pinned_by_create = g.num_pins;
    assert_eq!(pinned_by_create, 1, "a new corpus is pinned eagerly");

    let summary = registry
        .load(&mut g, &routing, "c", PrefixUse::Never)
        .unwrap();
    assert!(!summary.prefix_pinned && summary.long_context_unavailable.is_none());
    for _ in 0..2 {
        let (loaded, _) = registry
            .get_or_load(&mut g, &routing, "c", PrefixUse::Never)
            .unwrap();
        assert!(loaded.pinned().is_none());
    }
    assert_eq!(
        registry
            .list_documents(&mut g, &routing, "c")
            .unwrap()
            .len(),
        2
    );
    assert_eq!(g.num_pins, pinned_by_create, "nothing read the prefix yet");

    let (loaded, _) = registry
        .get_or_load(&mut g, &routing, "c", PrefixUse::MayRead)
        .unwrap();
    assert!(loaded.pinned().is_some());
    registry
        .get_or_load(&mut g, &routing, "c", PrefixUse::MayRead)
        .unwrap();
    assert_eq!(
        g.num_pins,
        pinned_by_create + 1,
        "pinned once, then resident"
    );
}
