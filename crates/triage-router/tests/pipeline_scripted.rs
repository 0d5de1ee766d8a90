//! The routing pipeline against scripted models: each path is taken when its signal says so
//! (a confident closed-book answer, a sure RAG answer, an unsure one that escalates and is
//! stopped early, a declined one, a global question, the gain policy's hybrid call, a long
//! context estimated cheaper), forced routes are obeyed, and bad overrides are errors.

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use triage_engine::{FinishReason, GenerateRequest, Prompt, TokenOutput};
use triage_engine::{PrefixSource, Usage};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;
use triage_policy::{GainPolicy, GainPolicyModel, GainReport, RidgeModel, Standardizer};
use triage_retrieval::WordOffsets;
use triage_retrieval::{ChunkerConfig, Corpus, CorpusStore, Document, HashingEmbedder};
use triage_router::{corpus_text, LearnedClassifier, LongContextPrompt, QueryClass};
use triage_router::{
    AnswerEvent, AskRequest, CorpusView, Generated, Generator, ModelRole, PinnedPrefix, Pipeline,
    Route, RoutePath, RouterError, RoutingConfig,
};
use triage_router::{ClassifierSetting, MonitorVerdict, RagSearch, SearchKind, Stage};

const EMBEDDER: HashingEmbedder = HashingEmbedder { dim: 64 };

/// Which kind of request reached a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Gate,
    Rag,
    Lc,
    Other,
}

fn kind(request: &GenerateRequest) -> Call {
    match &request.prompt {
        Prompt::Tokens(_) => Call::Lc,
        Prompt::Chat(m) if m.iter().any(|m| m.content.starts_with("Context:")) => Call::Rag,
        Prompt::Chat(m)
            if m.iter()
                .any(|m| m.content.contains("answer only, in a few")) =>
        {
            Call::Gate
        }
        _ => Call::Other,
    }
}

/// Answers each kind of request with a scripted text whose tokens carry scripted entropies
/// (and logprob = −entropy/2), honouring cancellation.
struct Scripted {
    model: Arc<Model>,
    gate: Vec<(&'static str, f32)>,
    rag: Vec<(&'static str, f32)>,
    lc: Vec<(&'static str, f32)>,
    /// What a sampled (temperature > 0) RAG request says; empty: the same as `rag`.
    sampled: Vec<(&'static str, f32)>,
    /// (kind, tokens produced, max_tokens) of every request.
    calls: Vec<(Call, usize)>,
    rag_prompts: Vec<String>,
    lc_prompts: Vec<Vec<u32>>,
}

impl Scripted {
    fn new(model: Arc<Model>) -> Self {
        Self {
            model,
            gate: vec![("Lyon", 2.0)],
            rag: vec![
                ("Paris", 0.1),
                (" is", 0.1),
                (" the", 0.1),
                (" capital", 0.1),
            ],
            lc: vec![("Paris", 0.05)],
            sampled: Vec::new(),
            calls: Vec::new(),
            rag_prompts: Vec::new(),
            lc_prompts: Vec::new(),
        }
    }

    fn count(&self, call: Call) -> usize {
        self.calls.iter().filter(|(c, _)| *c == call).count()
    }
}

impl Generator for Scripted {
    fn model(&self, _role: ModelRole) -> triage_router::Result<Arc<Model>> {
        Ok(self.model.clone())
    }

    fn generate(
        &mut self,
        _role: ModelRole,
        requests: &[GenerateRequest],
        watch: &mut dyn FnMut(usize, &TokenOutput, &str) -> bool,
    ) -> triage_router::Result<Vec<Generated>> {
        let mut out = Vec::new();
        for (i, request) in requests.iter().enumerate() {
            let call = kind(request);
            match &request.prompt {
                Prompt::Chat(m) if call == Call::Rag => self.rag_prompts.push(m[1].content.clone()),
                Prompt::Tokens(t) => self.lc_prompts.push(t.clone()),
                _ => {}
            }
            let sampled = request.params.temperature > 0.0 && !self.sampled.is_empty();
            let script = match call {
                Call::Rag if sampled => &self.sampled,
                Call::Gate => &self.gate,
                Call::Rag => &self.rag,
                Call::Lc => &self.lc,
                Call::Other => &self.gate,
            };
            let (mut text, mut tokens) = (String::new(), Vec::new());
            let mut finish_reason = FinishReason::Stop;
            for (piece, entropy) in script {
                let token = TokenOutput {
                    id: 0,
                    text: piece.to_string(),
                    logprob: -entropy / 2.0,
                    entropy: *entropy,
                    top_logprobs: vec![(0, -0.1), (1, -1.0)],
                    scored_logprobs: Vec::new(),
                    // The state "layer + step" at each asked layer, for the first steps.
                    hidden: if tokens.len() < request.params.hidden_steps {
                        request
                            .params
                            .hidden_layers
                            .iter()
                            .map(|&l| vec![(l + tokens.len()) as f32; 4])
                            .collect()
                    } else {
                        Vec::new()
                    },
                };
                text.push_str(piece);
                let go_on = watch(i, &token, piece);
                tokens.push(token);
                if !go_on {
                    finish_reason = FinishReason::Cancelled;
                    break;
                }
            }
            self.calls.push((call, tokens.len()));
            let prompt_tokens = match &request.prompt {
                Prompt::Tokens(t) => t.len(),
                _ => 100,
            };
            out.push(Generated {
                text,
                usage: Usage {
                    prompt_tokens,
                    completion_tokens: tokens.len(),
                    // A corpus prefix, or the RAG prompt a sample re-reads, is in the cache
                    // but for its tail.
                    cached_tokens: if call == Call::Lc {
                        prompt_tokens - 8
                    } else if sampled {
                        prompt_tokens - 4
                    } else {
                        0
                    },
                },
                tokens,
                finish_reason,
                elapsed: std::time::Duration::from_millis(1),
            });
        }
        Ok(out)
    }

    fn start_pin(
        &mut self,
        _role: ModelRole,
        tokens: &[u32],
        _dir: Option<&Path>,
        job: std::sync::Arc<triage_engine::PinJob>,
    ) -> triage_router::Result<()> {
        job.end(Ok(PinnedPrefix {
            num_tokens: tokens.len(),
            source: PrefixSource::Computed { reused_tokens: 0 },
        }));
        Ok(())
    }

    fn drive_pins(&mut self) -> triage_router::Result<bool> {
        Ok(false)
    }

    fn unpin_prefix(&mut self, _role: ModelRole, _tokens: &[u32]) -> triage_router::Result<()> {
        Ok(())
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    corpus: Corpus,
    lc: LongContextPrompt,
    model: Arc<Model>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), GgmlDType::F32).unwrap();
    let model = Arc::new(Model::load("tiny", &path, &LoadOptions::default()).unwrap());
    let texts = [
        (
            "france",
            "Paris is the capital of France and its largest city.",
        ),
        (
            "rivers",
            "The Seine flows through Paris to the English Channel.",
        ),
        (
            "bread",
            "Yeast ferments the dough, which rises before baking.",
        ),
        ("forest", "Old trees shade the forest floor from the sun."),
        ("desert", "Dunes move with the wind across the hot desert."),
        ("ocean", "Tides follow the moon and waves cross the ocean."),
    ];
    let docs: Vec<Document> = texts
        .iter()
        .map(|(id, text)| Document {
            id: id.to_string(),
            title: id.to_string(),
            text: text.to_string(),
        })
        .collect();
    let store = CorpusStore::new(dir.path());
    let chunker = ChunkerConfig {
        max_tokens: 64,
        overlap_tokens: 0,
    };
    store
        .ingest("c", &docs, &[], &EMBEDDER, &WordOffsets, chunker)
        .unwrap();
    let corpus = store.open("c").unwrap();
    let lc = LongContextPrompt::new(&model, &corpus_text(&corpus)).unwrap();
    Fixture {
        dir,
        corpus,
        lc,
        model,
    }
}

/// Prices under which RAG is cheaper than reading the (tiny) corpus whole.
fn config() -> RoutingConfig {
    let mut c = RoutingConfig::default();
    c.prices.long_context.cached_prompt = 100.0;
    c.retrieval.k = 2;
    c.monitor.window = 3;
    c.monitor.tau = 0.5;
    c
}

struct Outcome {
    answer: triage_router::Answer,
    events: Vec<AnswerEvent>,
}

fn ask(
    f: &Fixture,
    generator: &mut Scripted,
    config: RoutingConfig,
    request: AskRequest,
    lc_available: bool,
) -> triage_router::Result<Outcome> {
    let pipeline = Pipeline::new(config)?;
    let view = CorpusView {
        name: "c",
        corpus: &f.corpus,
        backend: None,
        long_context: if lc_available {
            Ok(&f.lc)
        } else {
            Err("the corpus is too long".into())
        },
    };
    let mut events = Vec::new();
    let answer = pipeline.ask(generator, &EMBEDDER, &view, &request, &mut |e| {
        events.push(e)
    })?;
    Ok(Outcome { answer, events })
}

fn question(q: &str) -> AskRequest {
    AskRequest {
        corpus: "c".into(),
        question: q.into(),
        ..AskRequest::default()
    }
}

fn streamed_text(events: &[AnswerEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            AnswerEvent::Delta(t) => Some(t.as_str()),
            AnswerEvent::Route(_) | AnswerEvent::Corpus { .. } => None,
        })
        .collect()
}

#[test]
fn a_sure_rag_answer_is_kept_and_streamed_after_the_route() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        config(),
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.text, "Paris is the capital");
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
    assert_eq!(out.events[0], AnswerEvent::Route(RoutePath::Rag));
    assert_eq!(streamed_text(&out.events), "Paris is the capital");
    assert_eq!(g.count(Call::Lc), 0);
    let monitor = out.answer.decision.monitor.as_ref().unwrap();
    assert_eq!(monitor.decision, MonitorVerdict::Accept);
    assert_eq!(monitor.trace.len(), 4);
    assert!((monitor.mean.unwrap() - 0.1).abs() < 1e-6);
    assert_eq!(out.answer.decision.handoff_ms, None);
    let retrieval = out.answer.decision.retrieval.as_ref().unwrap();
    assert_eq!(retrieval.chunk_ids.len(), 2);
    // Chunks are in the prompt in relevance order, the best first.
    assert!(
        g.rag_prompts[0].contains("[1] france"),
        "{}",
        g.rag_prompts[0]
    );
    assert!(out.answer.usage.total_tokens > 0);
    assert!(out.answer.decision.cost > 0.0);
}

#[test]
fn a_rag_answer_records_its_grounding_and_the_agreement_of_its_samples() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        config(),
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    // "Paris is the capital" is a run of words of the best chunk.
    let monitor = out.answer.decision.monitor.clone().unwrap();
    let grounding = monitor.grounding.unwrap();
    assert_eq!((grounding.verbatim, grounding.chunk_rank), (1.0, 1.0));
    assert_eq!(grounding.unsupported_words, 0.0);
    // No samples unless configured: one RAG call, no samples stage.
    assert!(monitor.signals.sample_agreement.is_nan());
    assert_eq!(g.count(Call::Rag), 1);
    let mut c = config();
    c.monitor.samples = 3;
    let mut g = Scripted::new(f.model.clone());
    g.sampled = vec![("Lyon", 1.0), (" is", 1.0)];
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    // The greedy answer and three samples from the same prompt, charged as their own stage.
    assert_eq!(g.count(Call::Rag), 4);
    let samples = out
        .answer
        .decision
        .stages
        .iter()
        .find(|s| s.stage == Stage::Samples)
        .unwrap();
    assert_eq!(samples.completion_tokens, 6);
    // Each sample finds 96 of the prompt's 100 tokens cached: charged are the 4 it computes
    // (and its own), not the prompt again.
    assert_eq!(
        (samples.prompt_tokens, samples.cached_prompt_tokens),
        (12, 0)
    );
    // "lyon is" against "paris is the capital": one word of two, one of four, F1 1/3.
    let signals = out.answer.decision.monitor.unwrap().signals;
    assert!(
        (signals.sample_agreement - 1.0 / 3.0).abs() < 1e-6,
        "{signals:?}"
    );
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
}

/// The RAG calls of an answer (its greedy answer and any samples) and whether a samples stage
/// was charged.
fn rag_calls_and_samples_stage(g: &Scripted, out: &Outcome) -> (usize, bool) {
    let stages = &out.answer.decision.stages;
    (
        g.count(Call::Rag),
        stages.iter().any(|s| s.stage == Stage::Samples),
    )
}

#[test]
fn samples_are_drawn_only_where_something_reads_them() {
    let f = fixture();
    let q = "What is the capital of France?";
    let unsure = vec![("Maybe", 3.0), (" Lyon", 3.0)];
    let mut c = config();
    c.monitor.samples = 3;
    // τ escalates the unsure answer and only the combined score reads samples: none drawn.
    let mut g = Scripted::new(f.model.clone());
    g.rag = unsure.clone();
    let out = ask(&f, &mut g, c.clone(), question(q), true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert_eq!(rag_calls_and_samples_stage(&g, &out), (1, false));
    assert!(out
        .answer
        .decision
        .monitor
        .unwrap()
        .signals
        .sample_agreement
        .is_nan());
    // Nor for a decline, which escalates on its own.
    let mut g = declining(&f);
    let out = ask(&f, &mut g, c.clone(), question(q), true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert_eq!(rag_calls_and_samples_stage(&g, &out), (1, false));
    // Forced RAG draws them for calibration to read, however unsure the answer.
    let mut g = Scripted::new(f.model.clone());
    g.rag = unsure.clone();
    let mut forced = question(q);
    forced.route = Route::Rag;
    let out = ask(&f, &mut g, c.clone(), forced, true).unwrap();
    assert_eq!(rag_calls_and_samples_stage(&g, &out), (4, true));
    // So does an answer the combined score judges: there τ only records.
    c.monitor.combined_score = Some(combined_file(f.dir.path(), -5.0));
    let mut g = Scripted::new(f.model.clone());
    g.rag = unsure;
    let out = ask(&f, &mut g, c, question(q), true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
    assert_eq!(rag_calls_and_samples_stage(&g, &out), (4, true));
}

#[test]
fn a_rag_answer_records_the_residual_stream_a_probe_asks_for() {
    let f = fixture();
    let mut c = config();
    c.monitor.probe_layers = vec![2, 0];
    c.monitor.probe_steps = 3;
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    let probe = out.answer.decision.monitor.unwrap().probe.unwrap();
    assert_eq!(probe.layers, vec![2, 0]);
    // The last prompt token's state (step 0), then the mean of steps 1 and 2.
    assert_eq!(probe.prompt, vec![vec![2.0; 4], vec![0.0; 4]]);
    assert_eq!(probe.answer, vec![vec![3.5; 4], vec![1.5; 4]]);
    // Not asked, not recorded.
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        config(),
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert!(out.answer.decision.monitor.unwrap().probe.is_none());
}

/// A probe over 4-value states at layer 2 scoring the sum of the state, escalating above
/// `threshold`.
fn probe_file(dir: &Path, threshold: f64) -> std::path::PathBuf {
    let path = dir.join(format!("probe-{threshold}.json"));
    let probe = triage_policy::ProbeModel {
        model_id: "tiny".into(),
        layer: 2,
        probe: triage_policy::MassMeanProbe {
            mean: vec![0.0; 4],
            scale: vec![1.0; 4],
            direction: vec![1.0; 4],
        },
        threshold,
    };
    probe.save(&path).unwrap();
    path
}

#[test]
fn a_probe_escalates_a_calm_answer_at_its_first_token() {
    let f = fixture();
    // The scripted state at layer 2 for the first token is [2; 4]: score 8.
    let mut c = config();
    c.monitor.probe = Some(probe_file(f.dir.path(), 5.0));
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert!(
        out.answer.decision.reason.contains("probe"),
        "{}",
        out.answer.decision.reason
    );
    // The RAG answer stopped at its first token and was never shown: the text is long
    // context's answer.
    let rag_tokens: Vec<usize> = g
        .calls
        .iter()
        .filter(|c| c.0 == Call::Rag)
        .map(|c| c.1)
        .collect();
    assert_eq!(rag_tokens, vec![1]);
    assert_eq!(streamed_text(&out.events), "Paris");
    let monitor = out.answer.decision.monitor.unwrap();
    assert_eq!(
        (monitor.probe_score, monitor.probe_threshold),
        (Some(8.0), Some(5.0))
    );
    // Under its threshold the probe only records, and the calm answer stands.
    let mut c = config();
    c.monitor.probe = Some(probe_file(f.dir.path(), 10.0));
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
    assert_eq!(out.answer.decision.monitor.unwrap().probe_score, Some(8.0));
}

#[test]
fn an_unsure_rag_answer_escalates_and_its_generation_stops_early() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    g.rag = vec![
        ("Maybe", 3.0),
        (" Lyon", 3.0),
        (" or", 3.0),
        (" Nice", 3.0),
        (" or", 3.0),
    ];
    let out = ask(
        &f,
        &mut g,
        config(),
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert_eq!(out.answer.text, "Paris");
    // τ·m = 1.5 is exceeded at the first token: one token was generated, not five.
    assert_eq!(g.calls.iter().find(|c| c.0 == Call::Rag).unwrap().1, 1);
    let monitor = out.answer.decision.monitor.as_ref().unwrap();
    assert_eq!(monitor.decision, MonitorVerdict::Escalate);
    assert_eq!(monitor.decided_at, Some(1));
    assert_eq!(monitor.rag_answer, "Maybe");
    // The replaced answer was never streamed.
    assert_eq!(
        out.events,
        [
            AnswerEvent::Route(RoutePath::Lc),
            AnswerEvent::Delta("Paris".into())
        ]
    );
    let lc = out
        .answer
        .decision
        .stages
        .iter()
        .find(|s| s.stage == Stage::Lc)
        .unwrap();
    assert!(lc.cached_prompt_tokens >= f.lc.prefix.len() - 8);
    assert!(
        out.answer.decision.reason.contains("escalated"),
        "{}",
        out.answer.decision.reason
    );
    // Timed from the monitor's decision to the long-context model's first token.
    assert!(out.answer.decision.handoff_ms.is_some());
}

#[test]
fn a_per_request_tau_overrides_the_config() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    g.rag = vec![("Maybe", 3.0), (" Lyon", 3.0)];
    let mut request = question("What is the capital of France?");
    request.tau = Some(5.0);
    let out = ask(&f, &mut g, config(), request, true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
    assert_eq!(out.answer.decision.monitor.unwrap().tau.tau, 5.0);
}

/// Whether the monitor flagged the RAG answer as a decline.
fn declined(out: &Outcome) -> bool {
    out.answer
        .decision
        .monitor
        .as_ref()
        .unwrap()
        .signals
        .declined
}

/// A generator whose RAG answer is a sure decline.
fn declining(f: &Fixture) -> Scripted {
    let mut g = Scripted::new(f.model.clone());
    g.rag = vec![("Unanswerable", 0.01), (".", 0.01)];
    g
}

#[test]
fn a_declined_answer_escalates_even_when_sure() {
    let f = fixture();
    let mut g = declining(&f);
    let out = ask(
        &f,
        &mut g,
        config(),
        question("Who wrote the tide tables?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert!(declined(&out));
    assert!(g.rag_prompts[0].contains("reply exactly: unanswerable"));
    assert!(out.answer.decision.reason.contains("insufficient"));
    // Decided on the finished answer, and timed from that verdict.
    assert!(out.answer.decision.handoff_ms.is_some());
}

#[test]
fn with_abstention_long_context_may_decline_and_a_rag_decline_is_final_only_without_it() {
    let f = fixture();
    let q = "Who wrote the tide tables?";
    let mut g = declining(&f);
    g.lc = vec![("unanswerable", 0.01)];
    let mut c = config();
    c.abstain = true;
    c.monitor.self_route = false;
    // Auto: the RAG decline escalates (only long context sees everything), whose abstention
    // is the answer; both prompts carry the instruction.
    let out = ask(&f, &mut g, c.clone(), question(q), true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert_eq!(out.answer.text, "unanswerable");
    assert!(g.rag_prompts[0].ends_with("reply exactly: unanswerable"));
    let with_clause =
        format!("{q}\nIf the documents do not contain the answer, reply exactly: unanswerable");
    assert_eq!(
        g.lc_prompts[0],
        f.lc.tokens(&f.model, &with_clause).unwrap()
    );
    // Forced RAG cannot escalate: its decline is the answer.
    let mut request = question(q);
    request.route = Route::Rag;
    let out = ask(&f, &mut g, c.clone(), request, true).unwrap();
    assert_eq!(
        (out.answer.decision.path, out.answer.text.as_str()),
        (RoutePath::Rag, "Unanswerable.")
    );
    assert!(g.rag_prompts[1].ends_with("reply exactly: unanswerable"));
    // Without abstention, the long-context prompt is the plain question.
    let mut request = question(q);
    request.route = Route::Lc;
    ask(&f, &mut g, config(), request, true).unwrap();
    assert_eq!(g.lc_prompts[1], f.lc.tokens(&f.model, q).unwrap());
}

#[test]
fn forced_rag_asks_the_routed_prompt_and_flags_its_decline() {
    let f = fixture();
    let q = "Who wrote the tide tables?";
    let mut g = declining(&f);
    let mut c = config();
    c.monitor.self_route = true;
    c.abstain = false;
    let mut forced = question(q);
    forced.route = Route::Rag;
    let out = ask(&f, &mut g, c.clone(), forced.clone(), true).unwrap();
    assert_eq!(
        (out.answer.decision.path, out.answer.text.as_str()),
        (RoutePath::Rag, "Unanswerable.")
    );
    assert!(declined(&out));
    // Auto's first stage asks word for word what forced RAG asked (calibration replays the
    // forced answers as auto's), and there the decline escalates.
    let out = ask(&f, &mut g, c.clone(), question(q), true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert_eq!(g.rag_prompts[0], g.rag_prompts[1]);
    assert!(g.rag_prompts[0].ends_with("reply exactly: unanswerable"));
    // Without Self-Route (or abstention) the prompt offers no decline, and none is flagged.
    c.monitor.self_route = false;
    let out = ask(&f, &mut g, c, forced, true).unwrap();
    assert!(!g.rag_prompts[2].contains("unanswerable"));
    assert!(!declined(&out));
}

#[test]
fn a_confident_closed_book_answer_skips_retrieval() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    g.gate = vec![("Paris", 0.1)];
    let mut c = config();
    c.gate_nll = Some(0.3);
    let out = ask(
        &f,
        &mut g,
        c.clone(),
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::None);
    assert_eq!(out.answer.text, "Paris");
    assert!(out.answer.decision.retrieval.is_none());
    assert_eq!(g.count(Call::Rag), 0);
    let gate = out.answer.decision.gate.as_ref().unwrap();
    assert!((gate.mean_nll.unwrap() - 0.05).abs() < 1e-6);
    // An unsure closed-book answer goes on to retrieval.
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
    assert!(!out.answer.decision.gate.as_ref().unwrap().answered);
}

#[test]
fn forced_routes_are_obeyed() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    g.rag = vec![("Maybe", 3.0), (" Lyon", 3.0)];
    let mut request = question("What is the capital of France?");
    request.route = Route::Rag;
    let out = ask(&f, &mut g, config(), request.clone(), true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
    assert!(out.answer.decision.forced);
    assert_eq!(out.answer.text, "Maybe Lyon");
    assert_eq!(g.count(Call::Lc), 0);
    request.route = Route::Lc;
    let out = ask(&f, &mut g, config(), request.clone(), true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert_eq!(g.count(Call::Rag), 1);
    // Nothing escalated, so there is no handoff to time.
    assert_eq!(out.answer.decision.handoff_ms, None);
    request.route = Route::None;
    let out = ask(&f, &mut g, config(), request.clone(), true).unwrap();
    assert_eq!(
        (out.answer.decision.path, out.answer.text.as_str()),
        (RoutePath::None, "Lyon")
    );
    request.route = Route::Hybrid;
    let out = ask(&f, &mut g, config(), request.clone(), true).unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Hybrid);
    assert_eq!(
        out.answer.decision.retrieval.unwrap().search,
        SearchKind::Hybrid
    );
    // Forcing lc where the corpus does not fit is an error naming why.
    request.route = Route::Lc;
    let err = ask(&f, &mut g, config(), request, false)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("too long"), "{err}");
}

#[test]
fn without_a_long_context_path_an_unsure_answer_is_kept_with_the_reason() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    g.rag = vec![("Maybe", 3.0), (" Lyon", 3.0)];
    let out = ask(
        &f,
        &mut g,
        config(),
        question("What is the capital of France?"),
        false,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
    assert_eq!(out.answer.text, "Maybe Lyon");
    assert!(out.answer.decision.reason.contains("unavailable"));
    assert_eq!(streamed_text(&out.events), "Maybe Lyon");
}

#[test]
fn a_global_question_goes_straight_to_long_context() {
    let f = fixture();
    let queries = [
        "Summarize the documents.",
        "Summarize all the documents.",
        "What are the main themes of the documents?",
        "Give an overview of the documents.",
        "What is the capital of France?",
        "Where does the Seine flow?",
        "What makes the dough rise?",
        "What moves the dunes?",
    ];
    let labels = [
        QueryClass::Global,
        QueryClass::Global,
        QueryClass::Global,
        QueryClass::Global,
        QueryClass::Point,
        QueryClass::Point,
        QueryClass::Point,
        QueryClass::Point,
    ];
    let classifier = LearnedClassifier::fit(&EMBEDDER, &queries, &labels).unwrap();
    let path = f.dir.path().join("classifier.json");
    classifier.save(&path).unwrap();
    let mut c = config();
    c.classifier = ClassifierSetting::Learned(path);
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        c.clone(),
        question("Summarize the documents."),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    let record = out.answer.decision.classifier.as_ref().unwrap();
    assert_eq!(
        (record.classifier.as_str(), record.label),
        ("learned", QueryClass::Global)
    );
    assert_eq!(g.count(Call::Rag), 0);
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
}

fn always_hybrid_policy(dir: &Path) -> std::path::PathBuf {
    let model = GainPolicyModel {
        ridge: RidgeModel {
            standardizer: Standardizer {
                medians: vec![0.0; 6],
                means: vec![0.0; 6],
                stds: vec![1.0; 6],
            },
            weights: vec![0.0; 6],
            bias: 0.1,
        },
        tau_h: 0.05,
        cost_per_hybrid: 0.02,
        report: GainReport {
            num_examples: 0,
            num_groups: 0,
            hit_dense_always: 0.0,
            hit_hybrid_always: 0.0,
            hit_policy: 0.0,
            hybrid_rate: 0.0,
            objective_policy: 0.0,
            objective_hybrid_always: 0.0,
        },
    };
    let path = dir.join("gain.json");
    GainPolicy { model }.save(&path).unwrap();
    path
}

#[test]
fn the_gain_policy_sends_a_query_to_the_hybrid_search() {
    let f = fixture();
    let mut c = config();
    c.retrieval.gain_policy = Some(always_hybrid_policy(f.dir.path()));
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        c.clone(),
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Hybrid);
    let retrieval = out.answer.decision.retrieval.as_ref().unwrap();
    assert_eq!(retrieval.search, SearchKind::Hybrid);
    let decision = retrieval.gain_policy.unwrap();
    assert!(decision.run_hybrid && (decision.predicted_delta - 0.1).abs() < 1e-9);
    assert!(retrieval.features.is_some());
    // With hybrid not among the allowed actions the policy cannot send it there.
    c.actions = vec![RoutePath::Rag, RoutePath::Lc];
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
}

#[test]
fn search_hybrid_sends_every_rag_answer_to_the_hybrid_search_without_a_policy() {
    let f = fixture();
    let mut c = config();
    c.retrieval.search = RagSearch::Hybrid;
    let mut g = Scripted::new(f.model.clone());
    for route in [Route::Auto, Route::Rag] {
        let mut request = question("What is the capital of France?");
        request.route = route;
        let out = ask(&f, &mut g, c.clone(), request, true).unwrap();
        assert_eq!(out.answer.decision.path, RoutePath::Hybrid, "{route:?}");
        let retrieval = out.answer.decision.retrieval.as_ref().unwrap();
        assert_eq!(retrieval.search, SearchKind::Hybrid, "{route:?}");
        assert!(retrieval.gain_policy.is_none(), "{route:?}");
    }
    // Settings that allow RAG but not the hybrid path contradict it.
    c.actions = vec![RoutePath::Rag, RoutePath::Lc];
    let err = Pipeline::new(c).unwrap_err().to_string();
    assert!(err.contains("add \"hybrid\" to routing.actions"), "{err}");
}

#[test]
fn a_long_context_estimated_cheaper_than_rag_is_taken_directly() {
    let f = fixture();
    let mut c = config();
    c.prices.long_context.cached_prompt = 0.0;
    c.prices.long_context.prompt = 0.0;
    c.prices.long_context.completion = 0.0;
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    assert!(out.answer.decision.reason.contains("estimated"));
    let costs = &out.answer.decision.estimated_costs;
    assert!(costs["lc"] < costs["rag"]);
    assert_eq!(g.count(Call::Rag), 0);
}

#[test]
fn bad_requests_and_configs_are_errors() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    let mut request = question("What is the capital of France?");
    request.tau = Some(f32::NAN);
    assert!(matches!(
        ask(&f, &mut g, config(), request, true),
        Err(RouterError::Invalid(_))
    ));
    let empty = question("   ");
    assert!(ask(&f, &mut g, config(), empty, true).is_err());
    let mut c = config();
    c.monitor.window = 0;
    assert!(Pipeline::new(c).is_err());
    let mut c = config();
    c.retrieval.gain_policy = Some(f.dir.path().join("missing.json"));
    assert!(Pipeline::new(c).is_err());
    assert!("sideways".parse::<Route>().is_err());
    // The self-check reads single-token yes/no answers; the tiny byte vocabulary has none: a
    // clear error, not a guess.
    let mut c = config();
    c.monitor.self_check = true;
    let asked = question("What is the capital of France?");
    let err = ask(&f, &mut g, c, asked, true).err().unwrap();
    assert!(err.to_string().contains("yes/no"), "{err}");
}

#[test]
fn the_long_context_prompt_shares_its_prefix_across_questions() {
    let f = fixture();
    let a =
        f.lc.tokens(&f.model, "What is the capital of France?")
            .unwrap();
    let b = f.lc.tokens(&f.model, "Where does the Seine flow?").unwrap();
    assert_eq!(&a[..f.lc.prefix.len()], &f.lc.prefix[..]);
    assert_eq!(&b[..f.lc.prefix.len()], &f.lc.prefix[..]);
    let text = corpus_text(&f.corpus);
    // Documents in the order they were ingested, not by id: an appended one comes last.
    assert!(text.starts_with("[france] france\n"), "{text}");
    assert!(
        text.trim_end().ends_with("waves cross the ocean."),
        "{text}"
    );
    assert!(text.contains("Paris is the capital of France"));
    // Rendering the whole chat at once gives the same tokens (the split is invisible).
    let whole = triage_engine::tokenize_prompt(
        &f.model,
        &Prompt::Chat(vec![
            triage_models::chat_template::ChatMessage::new(
                "system",
                "You answer questions about the documents the user provides. Answer with the \
                 answer only, in a few words, taken from the documents.",
            ),
            triage_models::chat_template::ChatMessage::new(
                "user",
                format!("Documents:\n\n{text}Question: Where does the Seine flow?"),
            ),
        ]),
    )
    .unwrap();
    assert_eq!(whole, b);
}

#[test]
fn the_long_context_prompt_keeps_a_documents_layout() {
    let dir = tempfile::tempdir().unwrap();
    let text = "# Keys\n\n{\n  \"a1\": \"b1\",\n\n  \"a2\": \"b2\"\n}\n\n## Notes\n- one\n- two three four five six seven";
    let doc = Document {
        id: "k".into(),
        title: "keys".into(),
        text: text.into(),
    };
    let store = CorpusStore::new(dir.path());
    let chunker = ChunkerConfig {
        max_tokens: 4,
        overlap_tokens: 1,
    };
    store
        .ingest("c", &[doc], &[], &EMBEDDER, &WordOffsets, chunker)
        .unwrap();
    let corpus = store.open("c").unwrap();
    assert!(corpus.chunks().len() > 4, "several chunks, one overlapping");
    // Blank lines and line breaks between chunks are the document's, not spaces.
    assert_eq!(corpus_text(&corpus), format!("[k] keys\n{text}\n\n"));
}

fn combined_file(dir: &Path, bias: f64) -> std::path::PathBuf {
    use triage_policy::{
        CombinedScore, CombinedScoreModel, LogisticModel, COMBINED_INPUTS as INPUTS,
    };
    let n = INPUTS.len();
    let model = CombinedScoreModel {
        model_id: "tiny".into(),
        inputs: INPUTS.iter().map(|s| s.to_string()).collect(),
        logistic: LogisticModel {
            standardizer: Standardizer {
                medians: vec![0.0; n],
                means: vec![0.0; n],
                stds: vec![1.0; n],
            },
            weights: vec![0.0; n],
            bias,
        },
        declines: None,
        threshold: 0.5,
    };
    let path = dir.join(format!("combined{bias}.json"));
    CombinedScore { model }.save(&path).unwrap();
    path
}

#[test]
fn the_combined_score_decides_instead_of_tau_when_configured() {
    let f = fixture();
    // Sure of being wrong: a calm answer escalates once complete, not early.
    let mut c = config();
    c.monitor.combined_score = Some(combined_file(f.dir.path(), 5.0));
    let mut g = Scripted::new(f.model.clone());
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Lc);
    let monitor = out.answer.decision.monitor.as_ref().unwrap();
    assert!(monitor.combined_p_wrong.unwrap() > 0.99);
    assert_eq!(g.calls.iter().find(|c| c.0 == Call::Rag).unwrap().1, 4);
    assert!(out.answer.decision.reason.contains("combined score"));
    // Sure of being right: an unsure-looking answer is kept.
    let mut c = config();
    c.monitor.combined_score = Some(combined_file(f.dir.path(), -5.0));
    let mut g = Scripted::new(f.model.clone());
    g.rag = vec![("Maybe", 3.0), (" Lyon", 3.0)];
    let out = ask(
        &f,
        &mut g,
        c,
        question("What is the capital of France?"),
        true,
    )
    .unwrap();
    assert_eq!(out.answer.decision.path, RoutePath::Rag);
    assert_eq!(out.answer.text, "Maybe Lyon");
    // A score fitted on another model is refused.
    let mut c = config();
    let path = combined_file(f.dir.path(), 1.0);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"tiny\""));
    c.monitor.combined_score = Some(path);
    let mut other = Scripted::new(f.model.clone());
    other.model = Arc::new(
        Model::load(
            "other",
            &f.dir.path().join("tiny.gguf"),
            &LoadOptions::default(),
        )
        .unwrap(),
    );
    assert!(ask(
        &f,
        &mut other,
        c,
        question("What is the capital of France?"),
        true
    )
    .is_err());
}

#[test]
fn plan_decides_the_first_path_without_answering() {
    let f = fixture();
    let mut g = Scripted::new(f.model.clone());
    let pipeline = Pipeline::new(config()).unwrap();
    let view = CorpusView {
        name: "c",
        corpus: &f.corpus,
        backend: None,
        long_context: Ok(&f.lc),
    };
    let record = pipeline
        .plan(
            &mut g,
            &EMBEDDER,
            &view,
            &question("What is the capital of France?"),
        )
        .unwrap();
    assert_eq!(record.path, RoutePath::Rag);
    assert!(record.reason.contains("may still escalate"));
    assert!(g.calls.is_empty(), "{:?}", g.calls);
    let mut forced = question("What is the capital of France?");
    forced.route = Route::Lc;
    let record = pipeline.plan(&mut g, &EMBEDDER, &view, &forced).unwrap();
    assert_eq!((record.path, record.forced), (RoutePath::Lc, true));
}
