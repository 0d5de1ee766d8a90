//! The registry over an engine that can be told to break or to hold its pins' steps: a stored
//! change that cannot be loaded is reported, not lost; a change returns before its prefix is
//! pinned, and a newer change cancels an older pin.

use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, MutexGuard};

use candle_core::quantized::GgmlDType;
use std::time::Instant;

use triage_engine::{EngineConfig, GenerateRequest, KvBudget, LlmEngine, PinJob, TokenOutput};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;

use triage_router::{Generated, ModelRole, RouterError};

use crate::host::ModelAccess;

use super::*;

/// An engine that can be told to fail every model lookup (as a broken model would), and
/// whose pins step only as far as the test allows.
struct Flaky {
    engine: LlmEngine,
    broken: bool,
    /// Pins started so far.
    num_pins: usize,
    /// Engine steps the pinner may still take (unbounded unless a test bounds it).
    steps_allowed: Arc<AtomicUsize>,
}

/// The engine as the pinner reaches it: one lock, taken for one call at a time.
struct Models(Mutex<Flaky>);

impl ModelAccess for Models {
    fn with_generator<R>(&self, f: impl FnOnce(&mut dyn Generator) -> R) -> Result<R> {
        Ok(f(&mut *self.0.lock().unwrap()))
    }
}

impl Models {
    fn g(&self) -> MutexGuard<'_, Flaky> {
        self.0.lock().unwrap()
    }
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

    fn start_pin(
        &mut self,
        role: ModelRole,
        tokens: &[u32],
        dir: Option<&Path>,
        job: Arc<PinJob>,
    ) -> triage_router::Result<()> {
        self.num_pins += 1;
        Generator::start_pin(&mut self.engine, role, tokens, dir, job)
    }

    fn drive_pins(&mut self) -> triage_router::Result<bool> {
        let allowed = &self.steps_allowed;
        if allowed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            return Ok(false); // held: the pinner waits and looks again
        }
        Generator::drive_pins(&mut self.engine)
    }

    fn unpin_prefix(&mut self, role: ModelRole, tokens: &[u32]) -> triage_router::Result<()> {
        Generator::unpin_prefix(&mut self.engine, role, tokens)
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
    let (models, registry) = lone_replica(dir.path());
    let routing = RoutingConfig::default();
    let created = registry
        .create(
            &mut *models.g(),
            &routing,
            "c",
            &[doc("a", "the cat sat on the mat")],
        )
        .unwrap();
    assert!(created.reload_error.is_none());
    models.g().broken = true;
    let change = registry
        .add_documents(
            &mut *models.g(),
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
    models.g().broken = false;
    let reloaded = registry
        .load(&mut *models.g(), &routing, "c", PrefixUse::MayRead)
        .unwrap();
    assert_eq!(reloaded.num_documents, 2, "the stored change was kept");
}

/// A replica with a store and prefix folder of its own under `dir`.
fn lone_replica(dir: &Path) -> (Models, CorpusRegistry) {
    let (g, embedder) = replica(dir);
    let registry = CorpusRegistry::new(&dir.join("store"), dir.join("prefixes"), embedder);
    (Models(Mutex::new(g)), registry)
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
        max_num_batched_tokens: 64,
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
        steps_allowed: Arc::new(AtomicUsize::new(usize::MAX)),
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
    let loaded = reader
        .get_or_load(&mut b, &routing, "c", PrefixUse::MayRead)
        .unwrap();
    assert_eq!(
        (loaded.corpus.generation, loaded.corpus.num_documents()),
        (1, 1)
    );
    let again = reader
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
    let moved = reader
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
/// queues its pin once, and the questions after it find it resident.
#[test]
fn an_unpinned_corpus_is_pinned_by_the_first_question_that_may_take_long_context() {
    let dir = tempfile::tempdir().unwrap();
    let (models, registry) = lone_replica(dir.path());
    let routing = RoutingConfig::default();
    let docs = [doc("a", "the cat sat on the mat"), doc("b", "the dog ran")];
    registry
        .create(&mut *models.g(), &routing, "c", &docs)
        .unwrap();
    registry.run_queued_pins(&models).unwrap();
    let pinned_by_create = models.g().num_pins;
    assert_eq!(pinned_by_create, 1, "a new corpus is pinned eagerly");

    let summary = registry
        .load(&mut *models.g(), &routing, "c", PrefixUse::Never)
        .unwrap();
    assert!(!summary.prefix_pinned && summary.long_context_unavailable.is_none());
    assert_eq!(summary.pin, PinStatus::Unpinned);
    for _ in 0..2 {
        let loaded = registry
            .get_or_load(&mut *models.g(), &routing, "c", PrefixUse::Never)
            .unwrap();
        assert!(loaded.pinned().is_none());
    }
    assert_eq!(
        registry
            .list_documents(&mut *models.g(), &routing, "c")
            .unwrap()
            .len(),
        2
    );
    registry.run_queued_pins(&models).unwrap();
    assert_eq!(
        models.g().num_pins,
        pinned_by_create,
        "nothing read the prefix yet"
    );

    let loaded = registry
        .get_or_load(&mut *models.g(), &routing, "c", PrefixUse::MayRead)
        .unwrap();
    registry.run_queued_pins(&models).unwrap();
    assert!(loaded.pinned().is_some());
    registry
        .get_or_load(&mut *models.g(), &routing, "c", PrefixUse::MayRead)
        .unwrap();
    registry.run_queued_pins(&models).unwrap();
    assert_eq!(
        models.g().num_pins,
        pinned_by_create + 1,
        "pinned once, then resident"
    );
}

/// Documents long enough that pinning them takes many 64-token steps.
fn notes(from: usize, to: usize) -> Vec<Document> {
    (from..to)
        .map(|i| {
            doc(
                &format!("n{i}"),
                &format!("note {i}: the tide rose over the rocks at dawn and fell by noon"),
            )
        })
        .collect()
}

/// Blocks pinned in the engine's pool now.
fn pinned_blocks(models: &Models) -> usize {
    models.g().engine.scheduler().kv().pool().num_pinned()
}

/// A pin held mid-way: a change returns while the prefix of the generation before it is still
/// being prefilled (the pinner is allowed only a few engine steps), the status says `pinning`
/// with its progress, and the change cancels that pin. Once the steps are let go, only the
/// newest generation is pinned (reusing what the cancelled pin prefilled), the first
/// generation's prefix is released, and the status says `pinned`.
#[test]
fn a_change_returns_before_its_pin_and_a_newer_change_cancels_the_older_pin() {
    let dir = tempfile::tempdir().unwrap();
    let (models, registry) = lone_replica(dir.path());
    let routing = RoutingConfig::default();
    let steps = models.g().steps_allowed.clone();
    registry
        .create(&mut *models.g(), &routing, "c", &notes(0, 3))
        .unwrap();
    registry.run_queued_pins(&models).unwrap();
    let first_blocks = pinned_blocks(&models);
    assert!(first_blocks > 0);

    steps.store(2, Ordering::SeqCst);
    std::thread::scope(|s| {
        // The pinner stops however the test ends (a failed assertion must not leave it running).
        struct Close<'a>(&'a CorpusRegistry);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                self.0.close_pins();
            }
        }
        let _close = Close(&registry);
        s.spawn(|| {
            while !registry.pins_closed() {
                if let Some(task) = registry.next_pin_task(Duration::from_millis(20)) {
                    registry.run_pin(&models, task).unwrap();
                }
            }
        });
        let second = registry
            .add_documents(&mut *models.g(), &routing, "c", &notes(3, 14))
            .unwrap();
        assert_eq!(second.added, 11);
        let PinStatus::Pinning { tokens_total, .. } = second.corpus.pin else {
            panic!("the change returned with its pin {:?}", second.corpus.pin);
        };
        assert!(tokens_total > 256, "{tokens_total} tokens to pin");
        let generation_2 = registry.get("c").unwrap().unwrap();
        // The two steps allowed prefill part of it; then it is held.
        let deadline = Instant::now() + Duration::from_secs(60);
        let done = loop {
            let summary = summary_of("c", &generation_2);
            if let PinStatus::Pinning { tokens_done, .. } = summary.pin {
                if tokens_done >= 128 && steps.load(Ordering::SeqCst) == 0 {
                    break tokens_done;
                }
            }
            assert!(Instant::now() < deadline, "the pin never started");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(
            done < tokens_total,
            "held mid-way: {done} of {tokens_total}"
        );
        let why = generation_2.view("c").long_context.unwrap_err();
        assert!(why.contains("being pinned"), "{why}");

        let third = registry
            .add_documents(&mut *models.g(), &routing, "c", &notes(14, 16))
            .unwrap();
        assert!(matches!(third.corpus.pin, PinStatus::Pinning { .. }));
        assert_eq!(third.corpus.generation, Some(3));
        steps.store(usize::MAX, Ordering::SeqCst);
        let generation_3 = registry.get("c").unwrap().unwrap();
        registry.wait_pinned(&generation_3, Some(Duration::from_secs(120)));
        registry.close_pins();

        let summary = summary_of("c", &generation_3);
        let PinStatus::Pinned { tokens, from } = summary.pin else {
            panic!("{:?}", summary.pin);
        };
        assert_eq!(from, "computed");
        assert!(
            summary.reused_tokens.unwrap() >= 128,
            "the cancelled pin's prefill was reused: {summary:?}"
        );
        assert!(generation_3.view("c").long_context.is_ok());
        assert!(
            matches!(
                summary_of("c", &generation_2).pin,
                PinStatus::Unavailable { .. }
            ),
            "the older pin was cancelled"
        );
        assert_eq!(
            pinned_blocks(&models),
            tokens / 16,
            "only the newest generation stays pinned"
        );
    });
    assert_eq!(models.g().num_pins, 3, "one pin per generation, none twice");
}
