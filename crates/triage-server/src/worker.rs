//! `EngineWorker`: one OS thread per model that owns its `LlmEngine` and steps it while requests
//! are in flight. Handlers talk to it through a command channel; tokens come back through each
//! request's async channel. The engine stays synchronous and knows nothing of tokio.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::{mpsc as async_mpsc, oneshot};
use triage_engine::{
    EngineError, EventSink, GenerateRequest, LlmEngine, PinJob, RequestId, StreamEvent,
};
use triage_models::model::Model;
use triage_router::ModelRole;

use crate::Result;

/// Forwards engine events into a tokio channel; closed once the handler drops its receiver
/// (the client went away), which makes the engine cancel the request.
struct AsyncSink(async_mpsc::UnboundedSender<StreamEvent>);

impl EventSink for AsyncSink {
    fn send(&mut self, event: StreamEvent) -> bool {
        self.0.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

enum Command {
    Add {
        request: Box<GenerateRequest>,
        sink: AsyncSink,
        reply: oneshot::Sender<std::result::Result<RequestId, EngineError>>,
    },
    /// Keep a prefix resident (persisted under `dir` when given) until `Unpin`; `job` tells
    /// how its prefill goes.
    Pin {
        tokens: Vec<u32>,
        dir: Option<PathBuf>,
        job: Arc<PinJob>,
    },
    Unpin {
        tokens: Vec<u32>,
    },
    /// Stop once idle; with `cancel`, cancel whatever is still running first.
    Shutdown {
        cancel: bool,
    },
}

/// Counters the worker publishes after every step, read by `/metrics` and the queue limit.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub blocks_used: AtomicUsize,
    pub blocks_total: AtomicUsize,
    pub blocks_pinned: AtomicUsize,
    /// Tokens per KV block.
    pub block_size: AtomicUsize,
    /// Requests cancelled because their client went away.
    pub abandoned: AtomicUsize,
}

/// A served model: its engine thread and what handlers need to know about it.
pub struct EngineWorker {
    pub name: String,
    pub role: ModelRole,
    pub model: Arc<Model>,
    pub stats: Arc<EngineStats>,
    /// Requests accepted and not yet finished (queued in the channel, waiting or running).
    pub pending: AtomicUsize,
    commands: Mutex<Sender<Command>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for EngineWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineWorker")
            .field("name", &self.name)
            .finish()
    }
}

impl EngineWorker {
    /// Start the engine thread of `engine`, which runs `model`.
    pub fn spawn(
        name: &str,
        role: ModelRole,
        model: Arc<Model>,
        engine: LlmEngine,
    ) -> Result<Self> {
        let stats = Arc::new(EngineStats::default());
        publish(&engine, &stats);
        let (tx, rx) = mpsc::channel();
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name(format!("engine-{name}"))
            .spawn(move || run(engine, rx, &thread_stats))?;
        Ok(Self {
            name: name.to_string(),
            role,
            model,
            stats,
            pending: AtomicUsize::new(0),
            commands: Mutex::new(tx),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queue `request`; its events arrive on the returned receiver. Admission errors (bad
    /// parameters, a prompt beyond the context) come back here.
    pub async fn submit(
        &self,
        request: GenerateRequest,
    ) -> std::result::Result<async_mpsc::UnboundedReceiver<StreamEvent>, EngineError> {
        let (tx, rx) = async_mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        let command = Command::Add {
            request: Box::new(request),
            sink: AsyncSink(tx),
            reply,
        };
        let stopped = || EngineError::Invalid("the engine has stopped".into());
        self.commands
            .lock()
            .map_err(|_| stopped())?
            .send(command)
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())??;
        Ok(rx)
    }

    fn send(&self, command: Command) -> std::result::Result<(), EngineError> {
        let stopped = || EngineError::Invalid("the engine has stopped".into());
        self.commands
            .lock()
            .map_err(|_| stopped())?
            .send(command)
            .map_err(|_| stopped())
    }

    /// [`EngineWorker::submit`] from a thread outside the async runtime (the routing pipeline
    /// runs on tokio's blocking pool).
    pub fn submit_blocking(
        &self,
        request: GenerateRequest,
    ) -> std::result::Result<async_mpsc::UnboundedReceiver<StreamEvent>, EngineError> {
        let (tx, rx) = async_mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        self.send(Command::Add {
            request: Box::new(request),
            sink: AsyncSink(tx),
            reply,
        })?;
        answer
            .blocking_recv()
            .map_err(|_| EngineError::Invalid("the engine has stopped".into()))??;
        Ok(rx)
    }

    /// Start pinning `tokens` in this model's cache: the engine thread prefills them among
    /// its other requests, and `job` reports progress and the outcome.
    pub fn start_pin(
        &self,
        tokens: Vec<u32>,
        dir: Option<PathBuf>,
        job: Arc<PinJob>,
    ) -> std::result::Result<(), EngineError> {
        self.send(Command::Pin { tokens, dir, job })
    }

    /// Release a prefix pinned with [`EngineWorker::start_pin`].
    pub fn unpin(&self, tokens: Vec<u32>) -> std::result::Result<(), EngineError> {
        self.send(Command::Unpin { tokens })
    }

    /// Whether the engine thread still runs (not stopped, not died of a panic).
    pub fn is_alive(&self) -> bool {
        self.thread
            .lock()
            .is_ok_and(|t| t.as_ref().is_some_and(|h| !h.is_finished()))
    }

    /// Stop the thread once its requests are done (or cancelled, with `cancel`), blocking until
    /// it has.
    pub fn shutdown(&self, cancel: bool) {
        if let Ok(tx) = self.commands.lock() {
            let _ = tx.send(Command::Shutdown { cancel });
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

fn publish(engine: &LlmEngine, stats: &EngineStats) {
    let pool = engine.scheduler().kv().pool();
    stats.running.store(engine.num_running(), Ordering::Relaxed);
    stats.waiting.store(engine.num_waiting(), Ordering::Relaxed);
    stats.blocks_used.store(pool.num_used(), Ordering::Relaxed);
    stats
        .blocks_total
        .store(pool.num_total(), Ordering::Relaxed);
    stats
        .blocks_pinned
        .store(pool.num_pinned(), Ordering::Relaxed);
    stats
        .block_size
        .store(engine.scheduler().kv().block_size(), Ordering::Relaxed);
    stats
        .abandoned
        .store(engine.num_abandoned(), Ordering::Relaxed);
}

/// The engine thread: take commands (blocking only when idle), step, publish counters.
fn run(mut engine: LlmEngine, commands: Receiver<Command>, stats: &EngineStats) {
    let mut stopping = false;
    loop {
        loop {
            let next = if engine.has_unfinished() || stopping {
                match commands.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        stopping = true;
                        break;
                    }
                }
            } else {
                match commands.recv() {
                    Ok(c) => c,
                    Err(_) => return,
                }
            };
            match next {
                Command::Add {
                    request,
                    sink,
                    reply,
                } => {
                    let added = engine.add_request_with_sink(&request, Box::new(sink));
                    let _ = reply.send(added);
                }
                Command::Pin { tokens, dir, job } => {
                    // The prefill runs as a request among the others: plain requests and other
                    // pins keep being admitted while a corpus is prefilled.
                    engine.begin_pin(&tokens, dir.as_deref(), job);
                }
                Command::Unpin { tokens } => {
                    engine.release_pin(&tokens);
                }
                Command::Shutdown { cancel } => {
                    stopping = true;
                    if cancel {
                        engine.cancel_all();
                    }
                }
            }
        }
        if engine.has_unfinished() {
            if let Err(e) = engine.step() {
                // The forward pass every scheduled request shares failed: end every request with
                // the error (their clients get a 500, not a normal finish) rather than loop on
                // the same failure. One request's sampling failure never gets here: the engine
                // ends that request alone.
                tracing::error!(error = %e, "engine step failed; failing its requests");
                engine.fail_all(&e.to_string());
            }
        }
        publish(&engine, stats);
        if stopping && !engine.has_unfinished() {
            return;
        }
    }
}
