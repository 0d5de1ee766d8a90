//! The registry over an engine that can be told to break or to hold its pins' steps: a stored
//! change that cannot be loaded is reported, not lost; a change returns before its prefix is
//! pinned, and a newer change cancels an older pin.

use std::path::Path;
use std::time::Instant;

use crate::test_models::{doc, notes, replica, Models};

use super::*;

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
            let status = summary("c", &generation_2);
            if let PinStatus::Pinning { tokens_done, .. } = status.pin {
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

        let status = summary("c", &generation_3);
        let PinStatus::Pinned { tokens, from } = status.pin else {
            panic!("{:?}", status.pin);
        };
        assert_eq!(from, "computed");
        assert!(
            status.reused_tokens.unwrap() >= 128,
            "the cancelled pin's prefill was reused: {status:?}"
        );
        assert!(generation_3.view("c").long_context.is_ok());
        assert!(
            matches!(
                summary("c", &generation_2).pin,
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
