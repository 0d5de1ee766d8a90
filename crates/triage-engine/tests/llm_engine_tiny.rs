//! Continuous batching on a tiny model: batched, prefix-cached and preempted runs give the same
//! greedy tokens as `generate` alone, and every block is free once requests end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use triage_engine::prefix_store::{PrefixMiss, StoredPrefix};
use triage_engine::{
    generate, EngineConfig, EngineError, EngineSet, EntropySettings, FinishReason, GenerateRequest,
    KvBudget, LlmEngine, PinStart, PrefixRemote, PrefixSource, Prompt, SamplingParams, StreamEvent,
    Usage,
};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;

fn tiny() -> (tempfile::TempDir, Arc<Model>) {
    tiny_of(Architecture::Qwen2)
}

fn tiny_of(arch: Architecture) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    // F32 weights: batched decode (GEMM) and single decode then do the same arithmetic.
    write_tiny_gguf(&path, &TinySpec::new(arch), GgmlDType::F32).unwrap();
    (
        dir,
        Arc::new(Model::load("tiny", &path, &LoadOptions::default()).unwrap()),
    )
}

fn request(i: usize) -> GenerateRequest {
    let shared = "the heat of the sun on the sea ";
    GenerateRequest {
        prompt: Prompt::Text(format!("{shared}{}", "x".repeat(i * 3))),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(6 + i),
            ignore_eos: true,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    }
}

/// Run all requests concurrently; returns each one's token ids, text and final usage.
fn run_batched(
    model: &Arc<Model>,
    config: EngineConfig,
    requests: &[GenerateRequest],
) -> (Vec<(Vec<u32>, String, Usage)>, usize) {
    let mut engine = LlmEngine::new(model.clone(), config).unwrap();
    let rxs: Vec<_> = requests
        .iter()
        .map(|r| engine.add_request(r).unwrap().1)
        .collect();
    while engine.has_unfinished() {
        assert!(engine.step().unwrap() > 0);
        let pool = engine.scheduler().kv().pool();
        assert_eq!(pool.num_free() + pool.num_used(), pool.num_total());
    }
    let preempted = engine.num_preemptions();
    assert_eq!(
        engine.scheduler().kv().pool().num_used(),
        0,
        "all blocks free at the end"
    );
    let results = rxs
        .into_iter()
        .map(|rx| {
            let (mut ids, mut text, mut usage) = (Vec::new(), String::new(), None);
            for ev in rx.try_iter() {
                match ev {
                    StreamEvent::Token(t, piece) => {
                        ids.push(t.id);
                        text.push_str(&piece);
                    }
                    StreamEvent::Text(piece) => text.push_str(&piece),
                    StreamEvent::Finished { usage: u, .. } => usage = Some(u),
                }
            }
            (ids, text, usage.expect("finished event"))
        })
        .collect();
    (results, preempted)
}

fn alone(model: &Arc<Model>, r: &GenerateRequest) -> (Vec<u32>, String) {
    let out = generate(model, r, |_, _| true).unwrap();
    (out.tokens.iter().map(|t| t.id).collect(), out.text)
}

#[test]
fn eight_concurrent_requests_equal_each_alone_with_and_without_prefix_cache() {
    let (_dir, model) = tiny();
    let requests: Vec<_> = (0..8).map(request).collect();
    let expected: Vec<_> = requests.iter().map(|r| alone(&model, r)).collect();
    for prefix_caching in [true, false] {
        let config = EngineConfig {
            kv_budget: KvBudget::Blocks(128),
            block_size: 4,
            max_num_batched_tokens: 64,
            max_num_seqs: 8,
            prefix_caching,
            ..EngineConfig::default()
        };
        let (got, _) = run_batched(&model, config, &requests);
        for (i, ((ids, text, usage), (e_ids, e_text))) in got.iter().zip(&expected).enumerate() {
            assert_eq!(ids, e_ids, "request {i}, prefix caching {prefix_caching}");
            assert_eq!(text, e_text);
            assert_eq!(usage.completion_tokens, 6 + i);
        }
        let cached: usize = got.iter().map(|g| g.2.cached_tokens).sum();
        assert_eq!(
            cached > 0,
            prefix_caching,
            "shared prompt prefix is reused only with caching on"
        );
    }
}

#[test]
fn a_pool_too_small_forces_preemption_and_outputs_stay_identical() {
    let (_dir, model) = tiny();
    let requests: Vec<_> = (0..4).map(request).collect();
    let expected: Vec<_> = requests.iter().map(|r| alone(&model, r)).collect();
    // Each request needs up to 13 blocks of 4 tokens by its end; 24 blocks cannot hold 4 at once.
    let config = EngineConfig {
        kv_budget: KvBudget::Blocks(25),
        block_size: 4,
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        prefix_caching: false,
        ..EngineConfig::default()
    };
    let (got, preempted) = run_batched(&model, config, &requests);
    assert!(preempted > 0, "the pool was meant to force preemption");
    for ((ids, text, _), (e_ids, e_text)) in got.iter().zip(&expected) {
        assert_eq!(ids, e_ids);
        assert_eq!(text, e_text);
    }
}

#[test]
fn cancelling_mid_prefill_and_mid_decode_frees_blocks() {
    let (_dir, model) = tiny();
    let config = EngineConfig {
        kv_budget: KvBudget::Blocks(64),
        block_size: 4,
        max_num_batched_tokens: 8,
        max_num_seqs: 8,
        prefix_caching: true,
        ..EngineConfig::default()
    };
    let mut engine = LlmEngine::new(model, config).unwrap();
    let (a, rx_a) = engine.add_request(&request(5)).unwrap(); // 46-token prompt: several chunks
    let (b, rx_b) = engine.add_request(&request(0)).unwrap();
    engine.step().unwrap();
    engine.cancel(a);
    for _ in 0..12 {
        engine.step().unwrap();
    }
    assert!(
        rx_b.try_iter().any(|e| matches!(e, StreamEvent::Token(..))),
        "b is decoding"
    );
    engine.cancel(b);
    assert!(!engine.has_unfinished());
    assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
    let last = rx_a.try_iter().last().unwrap();
    assert!(matches!(
        last,
        StreamEvent::Finished {
            reason: FinishReason::Cancelled,
            ..
        }
    ));
}

#[test]
fn oversized_requests_are_refused_up_front() {
    let (_dir, model) = tiny();
    let config = EngineConfig {
        kv_budget: KvBudget::Blocks(8),
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        prefix_caching: true,
        ..EngineConfig::default()
    };
    let mut engine = LlmEngine::new(model, config).unwrap();
    assert!(engine.add_request(&request(7)).is_err());
    assert!(!engine.has_unfinished());
}

/// `ignore_eos` without `max_tokens` asks for the whole context: on a pool smaller than that it
/// is refused when it arrives, so it can never sit at the head of the queue holding the others.
#[test]
fn an_unbounded_ignore_eos_request_is_refused_instead_of_blocking_the_queue() {
    let (_dir, model) = tiny();
    let context = model.context_length();
    let mut engine = LlmEngine::new(model, config(64)).unwrap();
    assert!(64 * 4 < context, "the pool is smaller than the context");
    let mut unbounded = request(0);
    unbounded.params.max_tokens = None;
    let err = engine.add_request(&unbounded).unwrap_err();
    assert!(err.to_string().contains("KV blocks"), "{err}");
    let (_, rx) = engine.add_request(&request(1)).unwrap();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let finished = rx
        .try_iter()
        .any(|e| matches!(e, StreamEvent::Finished { reason, .. } if reason.is_normal()));
    assert!(finished, "the request behind it ran");
}

fn config(num_blocks: usize) -> EngineConfig {
    EngineConfig {
        kv_budget: KvBudget::Blocks(num_blocks),
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        prefix_caching: true,
        ..EngineConfig::default()
    }
}

/// A corpus prefix of 300 to 500 tokens.
fn tide_corpus(model: &Model) -> Vec<u32> {
    model
        .tokenizer
        .encode(
            &"the tide comes in and the tide goes out; ".repeat(12),
            false,
            false,
        )
        .unwrap()
}

/// A corpus prefix being pinned is a request like the others: a short request added after it
/// is admitted beside the prefill (which takes at most half a step's tokens while others wait)
/// and finishes before it; the pin then completes, and pinning again finds it cached.
#[test]
fn a_prefix_being_pinned_does_not_hold_up_other_requests() {
    let (_dir, model) = tiny();
    let mut engine = LlmEngine::new(model.clone(), config(256)).unwrap();
    let corpus = tide_corpus(&model);
    assert!(
        (300..500).contains(&corpus.len()),
        "{} tokens",
        corpus.len()
    );
    let PinStart::Pending(pin) = engine.start_pin(&corpus, None).unwrap() else {
        panic!("nothing was cached, so the prefix must be prefilled");
    };
    let mut short = request(0);
    short.params.max_tokens = Some(2);
    let (_, rx) = engine.add_request(&short).unwrap();
    let mut chat_done_first = false;
    while !pin.is_done(&engine) {
        engine.step().unwrap();
        let finished = rx
            .try_iter()
            .any(|e| matches!(e, StreamEvent::Finished { .. }));
        chat_done_first |= finished;
    }
    assert!(
        chat_done_first,
        "the short request waited for the whole prefill"
    );
    let (handle, source, unsaved) = engine.finish_pin(pin).unwrap();
    assert!(unsaved.is_none());
    assert_eq!(handle.num_tokens, corpus.len() / 4 * 4);
    assert!(matches!(source, PrefixSource::Computed { .. }));
    assert!(matches!(
        engine.start_pin(&corpus, None).unwrap(),
        PinStart::Done(_, PrefixSource::Cache)
    ));
}

/// A 30-token corpus prefix (7 full blocks of 4) and a question after it.
fn corpus_and_question(model: &Model) -> (Vec<u32>, GenerateRequest) {
    let corpus = model
        .tokenizer
        .encode(
            "notes: the blue door opens at noon; the red one never",
            false,
            false,
        )
        .unwrap()[..30]
        .to_vec();
    let mut prompt = corpus.clone();
    prompt.extend(
        model
            .tokenizer
            .encode(" which door?", false, false)
            .unwrap(),
    );
    let request = GenerateRequest {
        prompt: Prompt::Tokens(prompt),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: Some(8),
            ignore_eos: true,
            ..Default::default()
        },
        entropy: EntropySettings::default(),
    };
    (corpus, request)
}

/// Run one request to the end on `engine`; its token ids and usage.
fn run_one(engine: &mut LlmEngine, request: &GenerateRequest) -> (Vec<u32>, Usage) {
    let (_, rx) = engine.add_request(request).unwrap();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let (mut ids, mut usage) = (Vec::new(), None);
    for ev in rx.try_iter() {
        match ev {
            StreamEvent::Token(t, _) => ids.push(t.id),
            StreamEvent::Finished { usage: u, .. } => usage = Some(u),
            StreamEvent::Text(_) => {}
        }
    }
    (ids, usage.expect("finished"))
}

/// A question over a pinned prefix that holds most of the pool gets the blocks the pin leaves
/// (the pinned blocks are shared, not taken from the free ones) and answers as it would alone;
/// a request that does not share the pin and needs more than the pin leaves is refused when it
/// is added. Before, the first waited forever at the head of the queue.
#[test]
fn a_question_over_a_pinned_prefix_that_fills_most_of_the_pool_is_answered() {
    let (_dir, model) = tiny();
    let (corpus, question) = corpus_and_question(&model);
    let expected = alone(&model, &question).0;
    // 15 usable blocks: the pin takes 7, the question needs 13 in all, 6 of them new.
    let mut engine = LlmEngine::new(model.clone(), config(16)).unwrap();
    let (handle, _) = engine.pin_prefix(&corpus).unwrap();
    assert_eq!(handle.blocks.len(), 7);
    let (_, rx) = engine.add_request(&question).unwrap();
    for _ in 0..200 {
        if !engine.has_unfinished() {
            break;
        }
        engine.step().unwrap();
    }
    assert!(!engine.has_unfinished(), "answered within 200 steps");
    let ids: Vec<u32> = rx
        .try_iter()
        .filter_map(|ev| match ev {
            StreamEvent::Token(t, _) => Some(t.id),
            _ => None,
        })
        .collect();
    assert_eq!(ids, expected);
    let unshared = GenerateRequest {
        prompt: Prompt::Tokens((1..30).collect()),
        ..question.clone()
    };
    let err = engine.add_request(&unshared).unwrap_err().to_string();
    assert!(err.contains("pinned prefixes"), "{err}");
}

#[test]
fn a_persisted_prefix_survives_a_restart_and_gives_the_same_output() {
    let (_dir, model) = tiny();
    let store = tempfile::tempdir().unwrap();
    let (corpus, question) = corpus_and_question(&model);
    let expected = alone(&model, &question).0;

    let mut first = LlmEngine::new(model.clone(), config(64)).unwrap();
    let (handle, source) = first.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert!(matches!(source, PrefixSource::Computed { .. }));
    assert_eq!(handle.num_tokens, 28);
    assert_eq!(
        first.scheduler().kv().pool().num_used(),
        7,
        "only the pinned blocks stay"
    );
    let (ids, usage) = run_one(&mut first, &question);
    assert_eq!(ids, expected);
    assert_eq!(usage.cached_tokens, 28);
    assert_eq!(first.scheduler().kv().pool().num_used(), 7);
    drop(first);

    // "Restart": a new engine with an empty pool finds the prefix on disk.
    let mut second = LlmEngine::new(model.clone(), config(64)).unwrap();
    let (handle2, source) = second.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert_eq!(source, PrefixSource::Disk);
    assert_eq!(handle2.num_tokens, 28);
    let (ids, usage) = run_one(&mut second, &question);
    assert_eq!(ids, expected, "restored KV gives the same greedy tokens");
    assert_eq!(usage.cached_tokens, 28);
    // Pinned again: the pool answers without touching the disk.
    let (_, source) = second.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert_eq!(source, PrefixSource::Cache);
    second.unpin_prefix(&handle2);
    second.unpin_prefix(&handle2);
    assert_eq!(second.scheduler().kv().pool().num_used(), 0);
}

/// A prefix persisted by a pool of 4-token blocks is a miss, not an error, for a pool of
/// 8-token blocks on the same weights (a GPU pool may use larger blocks than the CPU's): it is
/// recomputed there, saved under its own block size, and found on disk the next time.
#[test]
fn a_prefix_persisted_with_another_block_size_is_a_miss() {
    let (_dir, model) = tiny();
    let store = tempfile::tempdir().unwrap();
    let (corpus, question) = corpus_and_question(&model);
    let expected = alone(&model, &question).0;
    let mut small = LlmEngine::new(model.clone(), config(64)).unwrap();
    let (_, source) = small.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert!(matches!(source, PrefixSource::Computed { .. }));
    let eights = || EngineConfig {
        block_size: 8,
        ..config(64)
    };
    let mut large = LlmEngine::new(model.clone(), eights()).unwrap();
    let (handle, source) = large.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert!(
        matches!(source, PrefixSource::Computed { .. }),
        "{source:?}"
    );
    assert_eq!(
        handle.num_tokens, 24,
        "three full blocks of 8 of the 30 tokens"
    );
    assert_eq!(run_one(&mut large, &question).0, expected);
    let mut again = LlmEngine::new(model.clone(), eights()).unwrap();
    let (_, source) = again.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert_eq!(source, PrefixSource::Disk);
    assert_eq!(
        std::fs::read_dir(store.path()).unwrap().count(),
        2,
        "one file per block size"
    );
}

/// A prefix file that passes its checksum but holds blocks of another shape (forged, or from
/// another cache layout) is a miss that takes no blocks, and the prefix is recomputed.
/// Replicas on other machines share the prefix directory: the same weights under another path,
/// name and modification time find the file (keyed by content), a second save leaves it
/// alone, and other weights of the same shapes miss rather than read it.
#[test]
fn a_persisted_prefix_is_found_by_the_same_weights_anywhere() {
    let (dir, model) = tiny();
    let store = tempfile::tempdir().unwrap();
    let (corpus, question) = corpus_and_question(&model);
    let expected = alone(&model, &question).0;
    let mut first = LlmEngine::new(model.clone(), config(64)).unwrap();
    let (handle, _) = first.pin_persisted_prefix(&corpus, store.path()).unwrap();
    let path = first.save_prefix(&corpus, &handle, store.path()).unwrap();
    let written = std::fs::metadata(&path).unwrap().modified().unwrap();
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 1);

    // "Another machine": a copy of the weights elsewhere, loaded under another name.
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("renamed.gguf");
    std::fs::copy(dir.path().join("tiny.gguf"), &copy).unwrap();
    let twin = Arc::new(Model::load("lc-model", &copy, &LoadOptions::default()).unwrap());
    let mut second = LlmEngine::new(twin.clone(), config(64)).unwrap();
    let (handle2, source) = second.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert_eq!(source, PrefixSource::Disk);
    let (ids, _) = run_one(&mut second, &question);
    assert_eq!(ids, expected);
    // Written once: saving the same prefix again keeps the file as it was.
    assert_eq!(
        second.save_prefix(&corpus, &handle2, store.path()).unwrap(),
        path
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        written
    );
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 1);

    // Other weights of the same shapes: another key, a miss, and a file of its own.
    let other_path = elsewhere.path().join("other.gguf");
    let spec = TinySpec {
        seed: TinySpec::new(Architecture::Qwen2).seed + 1,
        ..TinySpec::new(Architecture::Qwen2)
    };
    write_tiny_gguf(&other_path, &spec, GgmlDType::F32).unwrap();
    let other = Arc::new(Model::load("tiny", &other_path, &LoadOptions::default()).unwrap());
    let mut third = LlmEngine::new(other, config(64)).unwrap();
    let (_, source) = third.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert!(
        matches!(source, PrefixSource::Computed { .. }),
        "{source:?}"
    );
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 2);
}

/// A shared store that is a directory of its own (or down), counting what crosses it.
#[derive(Debug)]
struct DirRemote {
    dir: tempfile::TempDir,
    down: bool,
    fetched: AtomicUsize,
    published: AtomicUsize,
}

impl DirRemote {
    fn new(down: bool) -> Arc<Self> {
        Arc::new(Self {
            dir: tempfile::tempdir().unwrap(),
            down,
            fetched: AtomicUsize::new(0),
            published: AtomicUsize::new(0),
        })
    }

    fn reachable(&self) -> triage_engine::Result<()> {
        match self.down {
            true => Err(EngineError::Invalid("the store is down".into())),
            false => Ok(()),
        }
    }
}

impl PrefixRemote for DirRemote {
    fn fetch(&self, name: &str, local: &std::path::Path) -> triage_engine::Result<bool> {
        self.reachable()?;
        match std::fs::copy(self.dir.path().join(name), local) {
            Ok(_) => {
                self.fetched.fetch_add(1, Ordering::SeqCst);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(EngineError::Invalid(e.to_string())),
        }
    }

    fn publish(&self, name: &str, local: &std::path::Path) -> triage_engine::Result<bool> {
        self.reachable()?;
        let object = self.dir.path().join(name);
        if object.exists() {
            return Ok(false);
        }
        std::fs::copy(local, object).map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.published.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }
}

#[test]
fn a_prefix_in_the_shared_store_is_fetched_by_a_replica_with_an_empty_disk() {
    let (_dir, model) = tiny();
    let (corpus, question) = corpus_and_question(&model);
    let expected = alone(&model, &question).0;
    let store = DirRemote::new(false);
    let remote = || Some(store.clone() as Arc<dyn PrefixRemote>);
    let (disk_a, disk_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    let mut a = LlmEngine::new(model.clone(), config(64)).unwrap();
    a.set_prefix_remote(remote());
    let (_, source) = a.pin_persisted_prefix(&corpus, disk_a.path()).unwrap();
    assert!(matches!(source, PrefixSource::Computed { .. }));
    assert_eq!(store.published.load(Ordering::SeqCst), 1);
    drop(a);

    // Another machine: its own empty disk, the same store.
    let mut b = LlmEngine::new(model.clone(), config(64)).unwrap();
    b.set_prefix_remote(remote());
    let (handle, source) = b.pin_persisted_prefix(&corpus, disk_b.path()).unwrap();
    assert_eq!(source, PrefixSource::Disk);
    assert_eq!(handle.num_tokens, 28);
    assert_eq!(store.fetched.load(Ordering::SeqCst), 1);
    let (ids, usage) = run_one(&mut b, &question);
    assert_eq!(ids, expected, "fetched KV gives the same greedy tokens");
    assert_eq!(usage.cached_tokens, 28);
    drop(b);

    // That machine restarts: its disk caches the store, nothing is fetched or published again.
    let mut c = LlmEngine::new(model.clone(), config(64)).unwrap();
    c.set_prefix_remote(remote());
    let (_, source) = c.pin_persisted_prefix(&corpus, disk_b.path()).unwrap();
    assert_eq!(source, PrefixSource::Disk);
    assert_eq!(store.fetched.load(Ordering::SeqCst), 1);
    assert_eq!(store.published.load(Ordering::SeqCst), 1);
}

#[test]
fn a_shared_store_that_is_down_costs_a_prefill_not_the_pin() {
    let (_dir, model) = tiny();
    let (corpus, question) = corpus_and_question(&model);
    let expected = alone(&model, &question).0;
    let disk = tempfile::tempdir().unwrap();
    let mut engine = LlmEngine::new(model.clone(), config(64)).unwrap();
    engine.set_prefix_remote(Some(DirRemote::new(true)));
    let (_, source) = engine.pin_persisted_prefix(&corpus, disk.path()).unwrap();
    assert!(matches!(source, PrefixSource::Computed { .. }));
    let (ids, usage) = run_one(&mut engine, &question);
    assert_eq!(ids, expected);
    assert_eq!(usage.cached_tokens, 28);
    // The local file was written before the upload failed: the next start reads it.
    let files = std::fs::read_dir(disk.path()).unwrap().count();
    assert_eq!(files, 1);
}

#[test]
fn a_prefix_file_of_the_wrong_shape_is_a_miss() {
    let (_dir, model) = tiny();
    let store = tempfile::tempdir().unwrap();
    let (corpus, _) = corpus_and_question(&model);
    let mut engine = LlmEngine::new(model.clone(), config(64)).unwrap();
    let (handle, _) = engine.pin_prefix(&corpus).unwrap();
    let path = engine.save_prefix(&corpus, &handle, store.path()).unwrap();
    let full = &corpus[..handle.num_tokens];
    let key = engine.prefix_key(full).unwrap();
    let layers = model.transformer.config().num_layers;
    let wrong = || {
        (0..layers)
            .map(|_| {
                candle_core::Tensor::ones(
                    (1, 2, 3),
                    candle_core::DType::F32,
                    &candle_core::Device::Cpu,
                )
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .unwrap()
    };
    let forged = StoredPrefix {
        k: wrong(),
        v: wrong(),
    };
    // Forged by another writer: a valid file is never overwritten, so it replaces this one.
    std::fs::remove_file(&path).unwrap();
    assert!(triage_engine::prefix_store::save(&path, &key, full, &forged).unwrap());
    let mut fresh = LlmEngine::new(model.clone(), config(64)).unwrap();
    let miss = fresh
        .load_prefix(&corpus, store.path())
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(miss, PrefixMiss::Mismatch(ref m) if m.contains("shape")),
        "{miss:?}"
    );
    assert_eq!(fresh.scheduler().kv().pool().num_used(), 0);
    let (_, source) = fresh.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert!(matches!(source, PrefixSource::Computed { .. }));
}

#[test]
fn a_corrupt_or_foreign_prefix_file_is_a_miss_not_wrong_output() {
    let (_dir, model) = tiny();
    let store = tempfile::tempdir().unwrap();
    let (corpus, question) = corpus_and_question(&model);
    let expected = alone(&model, &question).0;
    let mut engine = LlmEngine::new(model.clone(), config(64)).unwrap();
    let (handle, _) = engine.pin_prefix(&corpus).unwrap();
    let path = engine.save_prefix(&corpus, &handle, store.path()).unwrap();

    // Flip one byte in the middle of the file: KV data (the header and token ids are small).
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let mut fresh = LlmEngine::new(model.clone(), config(64)).unwrap();
    let miss = fresh
        .load_prefix(&corpus, store.path())
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(miss, PrefixMiss::Mismatch(ref m) if m.contains("checksum")),
        "{miss:?}"
    );
    assert_eq!(
        fresh.scheduler().kv().pool().num_used(),
        0,
        "a miss takes no blocks"
    );
    let (_, source) = fresh.pin_persisted_prefix(&corpus, store.path()).unwrap();
    assert!(
        matches!(source, PrefixSource::Computed { .. }),
        "recomputed and rewritten"
    );
    assert_eq!(run_one(&mut fresh, &question).0, expected);

    // Same name and tokens, another model: files are named by the weights' content, so
    // nothing is found; and another model's file put under its name (a bad copy, a hash
    // collision) is a mismatch, never used.
    let (_dir2, other) = tiny_of(Architecture::Llama);
    let mut foreign = LlmEngine::new(other, config(64)).unwrap();
    assert_eq!(
        foreign.load_prefix(&corpus, store.path()).unwrap(),
        Err(PrefixMiss::NotFound)
    );
    let full = &corpus[..handle.num_tokens];
    let foreign_path = foreign.prefix_key(full).unwrap().path_in(store.path());
    assert_ne!(foreign_path, path);
    std::fs::copy(&path, &foreign_path).unwrap();
    let miss = foreign
        .load_prefix(&corpus, store.path())
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(miss, PrefixMiss::Mismatch(ref m) if m.contains("weights_sha256")),
        "{miss:?}"
    );
    assert_eq!(foreign.scheduler().kv().pool().num_used(), 0);
}

#[test]
fn two_models_run_side_by_side_with_their_own_budgets() {
    let (_d1, qwen) = tiny();
    let (_d2, llama) = tiny_of(Architecture::Llama);
    let requests: Vec<_> = (0..3).map(request).collect();
    let mut set = EngineSet::new();
    set.add("base", qwen.clone(), config(40)).unwrap();
    let mib = EngineConfig {
        kv_budget: "0.5MiB".parse().unwrap(),
        ..config(0)
    };
    set.add("lc", llama.clone(), mib).unwrap();
    assert!(
        set.add("lc", llama.clone(), mib).is_err(),
        "names are unique"
    );
    assert!(set.engine_mut("nope").is_err());
    assert_eq!(
        set.get("base").unwrap().scheduler().kv().pool().num_total(),
        39
    );
    let cfg = llama.transformer.config();
    let per_block = triage_models::paged_kv_cache::PagedKvCache::bytes_per_block(
        cfg,
        4,
        triage_models::paged_kv_cache::default_kv_dtype(&candle_core::Device::Cpu),
    );
    assert_eq!(
        set.get("lc").unwrap().scheduler().kv().pool().num_total() + 1,
        (512 * 1024) / per_block
    );
    let mut rxs = Vec::new();
    for r in &requests {
        for name in ["base", "lc"] {
            rxs.push(set.engine_mut(name).unwrap().add_request(r).unwrap().1);
        }
    }
    while set.has_unfinished() {
        set.step().unwrap();
    }
    for (i, rx) in rxs.into_iter().enumerate() {
        let model = if i % 2 == 0 { &qwen } else { &llama };
        let ids: Vec<u32> = rx
            .try_iter()
            .filter_map(|e| match e {
                StreamEvent::Token(t, _) => Some(t.id),
                _ => None,
            })
            .collect();
        assert_eq!(ids, alone(model, &requests[i / 2]).0, "request {i}");
    }
    for name in ["base", "lc"] {
        assert_eq!(set.get(name).unwrap().scheduler().kv().pool().num_used(), 0);
    }
}

/// A listener that goes away after `limit` tokens, like a client that disconnects.
struct LeavingClient {
    tokens: Arc<std::sync::atomic::AtomicUsize>,
    limit: usize,
}

impl triage_engine::EventSink for LeavingClient {
    fn send(&mut self, event: StreamEvent) -> bool {
        use std::sync::atomic::Ordering;
        if matches!(event, StreamEvent::Token(..)) {
            self.tokens.fetch_add(1, Ordering::SeqCst);
        }
        self.tokens.load(Ordering::SeqCst) < self.limit
    }

    fn is_closed(&self) -> bool {
        self.tokens.load(std::sync::atomic::Ordering::SeqCst) >= self.limit
    }
}

#[test]
fn a_listener_that_leaves_cancels_its_request_and_frees_blocks() {
    let (_dir, model) = tiny();
    let mut engine = LlmEngine::new(model, config(64)).unwrap();
    let tokens = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sink = LeavingClient {
        tokens: tokens.clone(),
        limit: 3,
    };
    let mut long = request(2);
    long.params.max_tokens = Some(40);
    engine.add_request_with_sink(&long, Box::new(sink)).unwrap();
    let (_, rx) = engine.add_request(&request(1)).unwrap();
    let mut steps = 0;
    while engine.has_unfinished() {
        engine.step().unwrap();
        steps += 1;
    }
    assert_eq!(tokens.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert!(steps < 40, "the leaving request did not run to max_tokens");
    assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
    let done = rx.try_iter().any(|e| {
        matches!(
            e,
            StreamEvent::Finished {
                reason: FinishReason::Length,
                ..
            }
        )
    });
    assert!(done, "the other request still finishes normally");
}

#[test]
fn scored_token_ids_report_their_raw_logprobs() {
    let (_dir, model) = tiny();
    let mut engine = LlmEngine::new(model.clone(), config(64)).unwrap();
    let mut r = request(1);
    r.params.logprobs = true;
    r.params.top_logprobs = 5;
    r.params.score_token_ids = vec![65, 66, 200];
    let (_, rx) = engine.add_request(&r).unwrap();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let tokens: Vec<_> = rx
        .try_iter()
        .filter_map(|e| match e {
            StreamEvent::Token(t, _) => Some(t),
            _ => None,
        })
        .collect();
    assert!(!tokens.is_empty());
    for t in &tokens {
        let ids: Vec<u32> = t.scored_logprobs.iter().map(|p| p.0).collect();
        assert_eq!(ids, vec![65, 66, 200]);
        assert!(t
            .scored_logprobs
            .iter()
            .all(|p| p.1 <= 0.0 && p.1.is_finite()));
        // Where a scored id is also among the top 5, both report the same value.
        for (id, lp) in &t.scored_logprobs {
            if let Some((_, top)) = t.top_logprobs.iter().find(|(i, _)| i == id) {
                assert!((lp - top).abs() < 1e-4, "{lp} vs {top}");
            }
        }
    }
    // `generate` reports the same values.
    let alone = generate(&model, &r, |_, _| true).unwrap();
    for (a, b) in alone.tokens.iter().zip(&tokens) {
        for (x, y) in a.scored_logprobs.iter().zip(&b.scored_logprobs) {
            assert!((x.1 - y.1).abs() < 1e-4);
        }
    }
    let mut bad = request(1);
    bad.params.score_token_ids = vec![100_000];
    assert!(
        engine.add_request(&bad).is_err(),
        "ids outside the vocabulary"
    );
    // The tiny byte-level vocabulary has no single-token "yes": a clear error, not a guess.
    let err = triage_engine::relevance_scores(&mut engine, "q", &["p"]).unwrap_err();
    assert!(err.to_string().contains("yes/no"), "{err}");
}

#[test]
fn hidden_states_come_with_the_first_tokens_batched_or_alone() {
    let (_dir, model) = tiny();
    let layers = model.transformer.config().num_layers;
    let width = model.transformer.config().hidden_size;
    let mut probed = request(2);
    probed.params.hidden_layers = vec![layers - 1, 0];
    probed.params.hidden_steps = 3;
    // Batched with others that ask for other layers or none.
    let mut other = request(1);
    other.params.hidden_layers = vec![1];
    other.params.hidden_steps = 1;
    let mut engine = LlmEngine::new(model.clone(), config(64)).unwrap();
    let rxs: Vec<_> = [&probed, &other, &request(3)]
        .iter()
        .map(|r| engine.add_request(r).unwrap().1)
        .collect();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let tokens = |rx: &std::sync::mpsc::Receiver<StreamEvent>| -> Vec<_> {
        rx.try_iter()
            .filter_map(|e| match e {
                StreamEvent::Token(t, _) => Some(t),
                _ => None,
            })
            .collect()
    };
    let (p, o, none) = (tokens(&rxs[0]), tokens(&rxs[1]), tokens(&rxs[2]));
    // The first three tokens carry the two layers asked, in the order asked; then nothing.
    for t in &p[..3] {
        assert_eq!(t.hidden.len(), 2);
        assert!(t.hidden.iter().all(|h| h.len() == width));
        assert_ne!(t.hidden[0], t.hidden[1]);
    }
    assert!(p[3..].iter().all(|t| t.hidden.is_empty()));
    assert_eq!((o[0].hidden.len(), o[1].hidden.len()), (1, 0));
    assert!(none.iter().all(|t| t.hidden.is_empty()));
    // Alone, through `generate`, the same states.
    let alone = generate(&model, &probed, |_, _| true).unwrap();
    for (a, b) in alone.tokens.iter().zip(&p) {
        assert_eq!(a.hidden.len(), b.hidden.len());
        for (x, y) in a.hidden.iter().zip(&b.hidden) {
            let diff = x
                .iter()
                .zip(y)
                .map(|(u, v)| (u - v).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-4, "{diff}");
        }
    }
    // A layer the model lacks, or too many, is the request's error.
    let mut bad = request(1);
    bad.params.hidden_layers = vec![layers];
    bad.params.hidden_steps = 1;
    let err = engine.add_request(&bad).unwrap_err().to_string();
    assert!(err.contains("hidden_layers"), "{err}");
    bad.params.hidden_layers = vec![0; 9];
    assert!(engine.add_request(&bad).is_err());
    assert!(generate(&model, &bad, |_, _| true).is_err());
}

/// The tiny model with its final norm scaled by `scale`: every logit is `scale` times the
/// tiny model's (the same argmax), so logits can sit near f32's limit while staying finite.
fn tiny_scaled_logits(scale: f64) -> (tempfile::TempDir, Arc<Model>) {
    use candle_core::quantized::{gguf_file, QTensor};
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.gguf");
    write_tiny_gguf(&plain, &TinySpec::new(Architecture::Qwen2), GgmlDType::F32).unwrap();
    let mut reader = std::fs::File::open(&plain).unwrap();
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let cpu = candle_core::Device::Cpu;
    let tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let t = content.tensor(&mut reader, name, &cpu).unwrap();
            if name != "output_norm.weight" {
                return (name.clone(), t);
            }
            let scaled = (t.dequantize(&cpu).unwrap() * scale).unwrap();
            (
                name.clone(),
                QTensor::quantize(&scaled, GgmlDType::F32).unwrap(),
            )
        })
        .collect();
    let path = dir.path().join("scaled.gguf");
    let mut file = std::fs::File::create(&path).unwrap();
    let metadata: Vec<_> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let refs: Vec<_> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut file, &metadata, &refs).unwrap();
    let model = Model::load("tiny", &path, &LoadOptions::default()).unwrap();
    (dir, Arc::new(model))
}

/// Issue 20: a request whose sampling fails (its repetition penalty, in range, overflows a
/// logit of a model whose logits are near f32's limit) ends alone with `FinishReason::Error`;
/// the step succeeds, and the request batched with it runs to its end with the tokens it gets
/// alone. Before, the step failed and the server cancelled every request on the model.
#[test]
fn a_sampling_failure_ends_only_its_own_request() {
    let (_dir, model) = tiny_scaled_logits(2e36);
    let healthy = request(1);
    let failing = GenerateRequest {
        params: SamplingParams {
            repetition_penalty: 0.01,
            seed: Some(5),
            max_tokens: Some(8),
            ignore_eos: true,
            ..Default::default()
        },
        ..request(0)
    };
    assert!(failing.params.validate().is_ok(), "a valid request");
    let (expected, _) = alone(&model, &healthy);
    let mut engine = LlmEngine::new(model.clone(), EngineConfig::default()).unwrap();
    let (_, rx_bad) = engine.add_request(&failing).unwrap();
    let (_, rx_ok) = engine.add_request(&healthy).unwrap();
    while engine.has_unfinished() {
        engine
            .step()
            .expect("one request's sampling does not fail the step");
    }
    let last = |rx: &std::sync::mpsc::Receiver<StreamEvent>| {
        let events: Vec<_> = rx.try_iter().collect();
        let ids: Vec<u32> = events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Token(t, _) => Some(t.id),
                _ => None,
            })
            .collect();
        match events.last() {
            Some(StreamEvent::Finished { reason, .. }) => (ids, reason.clone()),
            other => panic!("no finish: {other:?}"),
        }
    };
    let (bad_ids, bad_reason) = last(&rx_bad);
    match bad_reason {
        FinishReason::Error(message) => assert!(message.contains("penalties"), "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(bad_ids.is_empty(), "failed at its first token: {bad_ids:?}");
    assert_eq!(last(&rx_ok), (expected, FinishReason::Length));
    assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
}

/// After a failed step the worker ends every request with an error, never a normal finish.
#[test]
fn fail_all_ends_every_request_with_an_error() {
    let (_dir, model) = tiny();
    let mut engine = LlmEngine::new(model, EngineConfig::default()).unwrap();
    let rxs: Vec<_> = (0..3)
        .map(|i| engine.add_request(&request(i)).unwrap().1)
        .collect();
    engine.step().unwrap();
    engine.fail_all("the forward pass failed");
    assert!(!engine.has_unfinished());
    assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
    for rx in rxs {
        let finish = rx.try_iter().find_map(|e| match e {
            StreamEvent::Finished { reason, .. } => Some(reason),
            _ => None,
        });
        assert_eq!(
            finish,
            Some(FinishReason::Error("the forward pass failed".into()))
        );
    }
}

/// Every token's entropy is the request's own estimator and unit, batched or alone, and a
/// threshold with `stop_on_escalate` ends that request alone with `Escalate`: one decode path, so
/// `generate` and the engine cannot drift apart.
#[test]
fn each_request_gets_its_estimator_and_its_escalation_batched_or_alone() {
    use triage_engine::entropy_monitor::{Decision, EntropyEstimator, EntropyUnit};
    let (_dir, model) = tiny();
    let mut nll_bits = request(2);
    nll_bits.params.temperature = 0.9;
    nll_bits.params.seed = Some(7);
    nll_bits.entropy = EntropySettings {
        estimator: EntropyEstimator::SampledNll,
        unit: EntropyUnit::Bits,
        ..EntropySettings::default()
    };
    let mut escalating = request(3);
    escalating.entropy = EntropySettings {
        threshold: Some(0.0),
        stop_on_escalate: true,
        ..EntropySettings::default()
    };
    let plain = request(1);
    let mut engine = LlmEngine::new(model.clone(), config(64)).unwrap();
    let rxs: Vec<_> = [&nll_bits, &escalating, &plain]
        .iter()
        .map(|r| engine.add_request(r).unwrap().1)
        .collect();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let events = |rx: &std::sync::mpsc::Receiver<StreamEvent>| {
        let (mut tokens, mut reason) = (Vec::new(), None);
        for e in rx.try_iter() {
            match e {
                StreamEvent::Token(t, _) => tokens.push(t),
                StreamEvent::Finished { reason: r, .. } => reason = Some(r),
                StreamEvent::Text(_) => {}
            }
        }
        (tokens, reason.expect("finished"))
    };
    let (nll, nll_reason) = events(&rxs[0]);
    assert_eq!((nll.len(), nll_reason), (8, FinishReason::Length));
    for t in &nll {
        let bits = -t.logprob / std::f32::consts::LN_2;
        assert!((t.entropy - bits).abs() < 1e-5, "{} vs {bits}", t.entropy);
    }
    let (esc, esc_reason) = events(&rxs[1]);
    assert_eq!((esc.len(), esc_reason), (1, FinishReason::Escalate));
    let (rest, rest_reason) = events(&rxs[2]);
    assert_eq!((rest.len(), rest_reason), (7, FinishReason::Length));
    // The full-softmax entropy in nats by default: within [0, ln vocab], and not the NLL.
    assert!(rest
        .iter()
        .all(|t| t.entropy >= 0.0 && t.entropy <= 262f32.ln()));
    assert!(rest.iter().any(|t| (t.entropy + t.logprob).abs() > 1e-3));

    // Alone, `generate` gives the same tokens and values, and the monitor's decision.
    let alone = generate(&model, &nll_bits, |_, _| true).unwrap();
    let ids = |ts: &[triage_engine::TokenOutput]| ts.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&alone.tokens), ids(&nll));
    for (a, b) in alone.tokens.iter().zip(&nll) {
        assert!((a.entropy - b.entropy).abs() < 1e-4);
    }
    let alone = generate(&model, &escalating, |_, _| true).unwrap();
    assert_eq!(alone.finish_reason, FinishReason::Escalate);
    assert_eq!(alone.decision, Some(Decision::Escalate { at_step: 1 }));
    assert_eq!(ids(&alone.tokens), ids(&esc));
}

/// A pin begun for a `PinJob` reports its progress step by step, stops at the first step after
/// it is cancelled, and a later pin of the same tokens reuses what the cancelled one prefilled;
/// the held pin is released by its tokens.
#[test]
fn a_pin_job_reports_progress_and_stops_when_cancelled() {
    use triage_engine::{PinFailure, PinJob};
    let (_dir, model) = tiny();
    let mut engine = LlmEngine::new(model.clone(), config(256)).unwrap(); // 64-token steps
    let corpus = tide_corpus(&model);
    let full = corpus.len() / 4 * 4;
    let first = PinJob::new(corpus.len());
    engine.begin_pin(&corpus, None, first.clone());
    assert_eq!(first.progress(), (0, full), "the total is in whole blocks");
    engine.step().unwrap();
    engine.step().unwrap();
    let (done, total) = first.progress();
    assert!(
        done >= 64 && done < total,
        "{done} of {total} after two steps"
    );
    assert!(first.outcome().is_none());
    first.cancel();
    engine.step().unwrap();
    assert_eq!(first.outcome(), Some(Err(PinFailure::Cancelled)));
    assert!(!engine.has_pending_pins() && !engine.has_unfinished());
    assert!(
        !engine.release_pin(&corpus),
        "a cancelled pin holds nothing"
    );

    let second = PinJob::new(corpus.len());
    engine.begin_pin(&corpus, None, second.clone());
    while second.outcome().is_none() {
        engine.step().unwrap();
    }
    let pinned = second.outcome().unwrap().unwrap();
    assert_eq!(pinned.num_tokens, full);
    let PrefixSource::Computed { reused_tokens } = pinned.source else {
        panic!("{pinned:?}");
    };
    assert!(
        reused_tokens >= 64,
        "the cancelled prefill's blocks were reused: {reused_tokens}"
    );
    assert_eq!(second.progress(), (full, full));
    let pinned_blocks = engine.scheduler().kv().pool().num_pinned();
    assert!(pinned_blocks > 0);
    assert!(engine.release_pin(&corpus));
    assert_eq!(engine.scheduler().kv().pool().num_pinned(), 0);
    assert!(!engine.release_pin(&corpus), "released once");
}
