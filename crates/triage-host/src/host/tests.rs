//! Questions while a corpus is being re-pinned: auto routing waits up to the host's
//! `pin_wait`, then answers by RAG over the new generation and says why; a question forced to
//! long context waits for the pin of its generation and reads it.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use triage_router::{AskRequest, Route, RoutePath, RoutingConfig};

use crate::registry::PinStatus;
use crate::test_models::{notes, replica, Models};

use super::Host;

#[test]
fn questions_during_a_re_pin_never_mix_generations() {
    let dir = tempfile::tempdir().unwrap();
    let (flaky, embedder) = replica(dir.path());
    let steps = flaky.steps_allowed.clone();
    let mut routing = RoutingConfig {
        rag_max_tokens: 4,
        lc_max_tokens: 4,
        ..RoutingConfig::default()
    };
    routing.retrieval.k = 2;
    let host = Host::with_models(
        Models(Mutex::new(flaky)),
        routing,
        embedder,
        &dir.path().join("store"),
        dir.path().join("prefixes"),
    )
    .unwrap()
    .with_pin_wait(Duration::from_millis(50));
    host.create_corpus("c", &notes(0, 3)).unwrap();
    let first = host.wait_pinned("c").unwrap();
    assert!(matches!(first.pin, PinStatus::Pinned { .. }), "{first:?}");

    // The pinner may not step: the new generation's pin is held at its start.
    steps.store(0, Ordering::SeqCst);
    let change = host.add_documents("c", &notes(3, 14)).unwrap();
    assert_eq!(change.corpus.generation, Some(2));
    assert!(matches!(change.corpus.pin, PinStatus::Pinning { .. }));

    // τ = 0 would escalate any RAG answer: with the prefix being pinned it cannot, and the
    // record says why. The answer is over generation 2's documents.
    let ask = |route| AskRequest {
        corpus: "c".into(),
        question: "what rose over the rocks".into(),
        route,
        tau: Some(0.0),
        ..AskRequest::default()
    };
    let auto = host.ask(&ask(Route::Auto)).unwrap();
    assert_ne!(auto.decision.path, RoutePath::Lc, "{:?}", auto.decision);
    assert_eq!(auto.decision.corpus_generation, Some(2));
    let why = auto
        .decision
        .long_context_unavailable
        .clone()
        .unwrap_or_default();
    assert!(why.contains("generation 2 is being pinned"), "{why}");

    // Forced long context waits for generation 2's pin, which runs once the steps are let go.
    std::thread::scope(|s| {
        let lc = s.spawn(|| host.ask(&ask(Route::Lc)));
        steps.store(usize::MAX, Ordering::SeqCst);
        let answer = lc.join().unwrap().unwrap();
        assert_eq!(answer.decision.path, RoutePath::Lc);
        assert_eq!(answer.decision.corpus_generation, Some(2));
        let pinned = host.corpus("c").unwrap();
        let PinStatus::Pinned { tokens, .. } = pinned.pin else {
            panic!("{pinned:?}");
        };
        assert!(
            answer.usage.cached_prompt_tokens >= tokens,
            "the answer read the pinned prefix: {} cached of {tokens}",
            answer.usage.cached_prompt_tokens
        );
    });
}
