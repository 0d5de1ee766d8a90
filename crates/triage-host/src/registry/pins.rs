//! The registry's background pins. A corpus change, a load, or a question that may take long
//! context queues a pin of the corpus's long-context prefix; one pinner (the host's thread, or
//! a test calling [`CorpusRegistry::run_queued_pins`]) takes the queue in order. Its prefill
//! runs on the long-context model's engine as a request among the others, borrowing the
//! models only for one step at a time, so questions and changes go on meanwhile.
//!
//! A newer generation of a corpus retires the older one: a pin still queued or prefilling for
//! it is cancelled, and a prefix it holds stays pinned until the newer one's pin has ended (the
//! blocks the two share are reused, not prefilled again). Only the newest generation is pinned.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use triage_engine::{PinFailure, PinJob};
use triage_router::{Generator, ModelRole, PinnedPrefix};

use super::{CorpusRegistry, LoadedCorpus};
use crate::error::Result;
use crate::host::ModelAccess;

/// How long the pinner sleeps between looks at a pin that an engine thread runs.
const POLL: Duration = Duration::from_millis(20);

/// Whether a loaded corpus's long-context prefix is resident.
#[derive(Debug, Clone)]
pub(super) enum PinState {
    /// The corpus has no long-context prompt (see its reason).
    NoPrefix,
    /// Queued, or prefilling in the background; the job tells how far it has got.
    Pinning(Arc<PinJob>),
    /// Resident, with where this pin's KV came from.
    Pinned(PinnedPrefix),
    /// Not resident: released to make room for another corpus's, or loaded unpinned. Pinned
    /// when a question that may take long context asks.
    NotResident,
    /// It does not fit in the long-context model's cache (why): the corpus answers by RAG.
    DoesNotFit(String),
}

/// A loaded corpus's pin, behind one lock: every pin, release and hand-over goes through it.
#[derive(Debug)]
pub(super) struct PinSlot {
    pub state: PinState,
    /// A newer generation replaced this one, or the corpus was unloaded: it is never pinned
    /// again, and a pin that ends for it is released at once.
    pub retired: bool,
    /// Older generations whose prefix stays pinned until this one's pin ends.
    pub predecessors: Vec<Arc<LoadedCorpus>>,
    /// Corpora whose prefix this corpus's last pin released to make room.
    pub released: Vec<String>,
}

impl PinSlot {
    pub fn new(state: PinState) -> Self {
        Self {
            state,
            retired: false,
            predecessors: Vec::new(),
            released: Vec::new(),
        }
    }
}

/// A pin waiting for the pinner: the corpus's name and the generation to pin.
pub struct PinTask {
    name: String,
    loaded: Arc<LoadedCorpus>,
}

/// The pinner's queue.
#[derive(Default)]
pub(super) struct PinQueue {
    tasks: Mutex<VecDeque<PinTask>>,
    queued: Condvar,
    /// Set when the host shuts down: no more tasks are handed out and running pins stop.
    closed: AtomicBool,
}

impl LoadedCorpus {
    pub(super) fn slot(&self) -> MutexGuard<'_, PinSlot> {
        // Only whole values are assigned under this lock, so a poisoned one is still valid.
        self.pin.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Set the state and wake whoever waits for the pin.
    fn settle(&self, slot: &mut PinSlot, state: PinState) {
        slot.state = state;
        self.pin_changed.notify_all();
    }

    /// Wait up to `timeout` (for ever with `None`) while a pin for this generation runs; the
    /// corpora its pin released to make room, once pinned (to the first caller that asks).
    pub(super) fn wait_pinned(&self, timeout: Option<Duration>) -> Vec<String> {
        let running = |s: &mut PinSlot| matches!(s.state, PinState::Pinning(_)) && !s.retired;
        let slot = self.slot();
        let mut slot = match timeout {
            Some(t) => {
                self.pin_changed
                    .wait_timeout_while(slot, t, running)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => self
                .pin_changed
                .wait_while(slot, running)
                .unwrap_or_else(PoisonError::into_inner),
        };
        // The first caller to see the pin reports what it released.
        if matches!(slot.state, PinState::Pinned(_)) {
            std::mem::take(&mut slot.released)
        } else {
            Vec::new()
        }
    }
}

impl CorpusRegistry {
    /// Queue a pin of `loaded`'s prefix unless one is resident, queued or impossible.
    pub(super) fn request_pin(&self, name: &str, loaded: &Arc<LoadedCorpus>) {
        let Ok(lc) = &loaded.long_context else {
            return;
        };
        {
            let mut slot = loaded.slot();
            if slot.retired || !matches!(slot.state, PinState::NotResident) {
                return;
            }
            let job = PinJob::new(lc.prefix.len());
            loaded.settle(&mut slot, PinState::Pinning(job));
        }
        self.pins
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(PinTask {
                name: name.to_string(),
                loaded: loaded.clone(),
            });
        self.pins.queued.notify_all();
    }

    /// `old` is replaced by `new` (or unloaded, with `None`): a pin of `old` still running is
    /// cancelled; a prefix it holds is handed to `new` to release once `new`'s pin ends, or
    /// released now. Returns the generations whose prefix must be released now.
    pub(super) fn retire(
        &self,
        old: &Arc<LoadedCorpus>,
        new: Option<&Arc<LoadedCorpus>>,
    ) -> Vec<Arc<LoadedCorpus>> {
        let mut slot = old.slot();
        slot.retired = true;
        let mut holding = std::mem::take(&mut slot.predecessors);
        match &slot.state {
            PinState::Pinning(job) => job.cancel(),
            PinState::Pinned(_) => holding.push(old.clone()),
            _ => {}
        }
        old.pin_changed.notify_all();
        drop(slot);
        match new {
            Some(new) => {
                let mut slot = new.slot();
                if matches!(slot.state, PinState::Pinning(_)) {
                    slot.predecessors.extend(holding);
                    Vec::new()
                } else {
                    holding
                }
            }
            None => holding,
        }
    }

    /// The next queued pin, waiting up to `timeout`; `None` once closed.
    pub fn next_pin_task(&self, timeout: Duration) -> Option<PinTask> {
        let tasks = self
            .pins
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (mut tasks, _) = self
            .pins
            .queued
            .wait_timeout_while(tasks, timeout, |t| {
                t.is_empty() && !self.pins.closed.load(Ordering::Relaxed)
            })
            .unwrap_or_else(PoisonError::into_inner);
        if self.pins.closed.load(Ordering::Relaxed) {
            return None;
        }
        tasks.pop_front()
    }

    /// Whether [`CorpusRegistry::close_pins`] was called.
    pub fn pins_closed(&self) -> bool {
        self.pins.closed.load(Ordering::Relaxed)
    }

    /// Stop pinning (the host shuts down): the pinner's wait ends and a running pin is
    /// cancelled.
    pub fn close_pins(&self) {
        self.pins.closed.store(true, Ordering::Relaxed);
        self.pins.queued.notify_all();
    }

    /// Run every queued pin to its end in this thread (tests, tools without a pinner thread).
    pub fn run_queued_pins<M: ModelAccess>(&self, models: &M) -> Result<()> {
        while let Some(task) = self.next_pin_task(Duration::ZERO) {
            self.run_pin(models, task)?;
        }
        Ok(())
    }

    /// Pin one queued corpus: start the prefill, let it run (stepping the models when nobody
    /// else does), and settle the outcome. When it does not fit, the retired generations of the
    /// same corpus are released first, then the least recently used prefixes of other corpora,
    /// and it is tried again; when nothing is left to release, the corpus answers by RAG.
    pub fn run_pin<M: ModelAccess>(&self, models: &M, task: PinTask) -> Result<()> {
        let loaded = task.loaded.clone();
        let run = self.run_pin_task(models, task);
        if let Err(e) = &run {
            // Nobody waits for ever on a pin that failed outside its engine.
            let mut slot = loaded.slot();
            if matches!(slot.state, PinState::Pinning(_)) {
                let why = format!("pinning the long-context prefix failed: {e}");
                loaded.settle(&mut slot, PinState::DoesNotFit(why));
            }
        }
        run
    }

    fn run_pin_task<M: ModelAccess>(&self, models: &M, task: PinTask) -> Result<()> {
        let PinTask { name, loaded } = task;
        let Ok(lc) = &loaded.long_context else {
            return Ok(());
        };
        std::fs::create_dir_all(&self.prefix_dir).map_err(|e| {
            crate::error::HostError::Internal(format!(
                "creating {}: {e}",
                self.prefix_dir.display()
            ))
        })?;
        loop {
            let job = {
                let slot = loaded.slot();
                match &slot.state {
                    PinState::Pinning(job) if !slot.retired => job.clone(),
                    _ => return Ok(()),
                }
            };
            let started = Instant::now();
            let outcome = match models.with_generator(|g| {
                g.start_pin(
                    ModelRole::LongContext,
                    &lc.prefix,
                    Some(&self.prefix_dir),
                    job.clone(),
                )
            })? {
                Ok(()) => match self.drive(models, &job)? {
                    Some(outcome) => outcome,
                    // Closed: the host is going away; the cancelled job ends on its own.
                    None => Err(PinFailure::Cancelled),
                },
                Err(e) => Err(PinFailure::Failed(e.to_string())),
            };
            let why = match outcome {
                Ok(pinned) => {
                    tracing::info!(corpus = %name, generation = loaded.corpus.generation, tokens = pinned.num_tokens, source = ?pinned.source, seconds = started.elapsed().as_secs_f64(), "pinned the long-context prefix");
                    return self.pinned(models, &loaded, pinned);
                }
                Err(PinFailure::Cancelled) => {
                    let mut slot = loaded.slot();
                    let state = if slot.retired {
                        PinState::NoPrefix
                    } else {
                        PinState::NotResident
                    };
                    loaded.settle(&mut slot, state);
                    return Ok(());
                }
                Err(PinFailure::Failed(why)) => why,
            };
            if !self.make_room(models, &name, &loaded)? {
                let why = format!(
                    "the {}-token corpus prefix does not fit in the long-context model's KV cache: {why}",
                    lc.prefix.len()
                );
                tracing::warn!(corpus = %name, reason = %why, "the corpus answers by RAG only");
                let mut slot = loaded.slot();
                let predecessors = std::mem::take(&mut slot.predecessors);
                loaded.settle(&mut slot, PinState::DoesNotFit(why));
                drop(slot);
                self.release_all(models, &predecessors)?;
                return Ok(());
            }
            let mut slot = loaded.slot();
            if slot.retired {
                loaded.settle(&mut slot, PinState::NoPrefix);
                return Ok(());
            }
            slot.state = PinState::Pinning(PinJob::new(lc.prefix.len()));
        }
    }

    /// Let `job` run until it ends; `None` if the registry closed first (the job is cancelled).
    fn drive<M: ModelAccess>(
        &self,
        models: &M,
        job: &PinJob,
    ) -> Result<Option<triage_engine::PinOutcome>> {
        loop {
            if let Some(outcome) = job.outcome() {
                return Ok(Some(outcome));
            }
            if self.pins_closed() {
                job.cancel();
                return Ok(None);
            }
            if models.with_generator(|g| g.drive_pins())?? {
                // Models stepped in the caller's thread: let a waiting question have them.
                std::thread::yield_now();
            } else {
                job.wait(POLL);
            }
        }
    }

    /// A pin ended well: keep it unless its generation was retired meanwhile, then release the
    /// generations it replaces.
    fn pinned<M: ModelAccess>(
        &self,
        models: &M,
        loaded: &Arc<LoadedCorpus>,
        pinned: PinnedPrefix,
    ) -> Result<()> {
        let mut slot = loaded.slot();
        let mut release = std::mem::take(&mut slot.predecessors);
        loaded.settle(&mut slot, PinState::Pinned(pinned));
        if slot.retired {
            release.push(loaded.clone());
        }
        drop(slot);
        self.release_all(models, &release)
    }

    /// Release something so that `loaded`'s prefix may fit: its retired generations, else the
    /// least recently used prefix of another corpus; whether anything was released.
    fn make_room<M: ModelAccess>(
        &self,
        models: &M,
        name: &str,
        loaded: &Arc<LoadedCorpus>,
    ) -> Result<bool> {
        let predecessors = std::mem::take(&mut loaded.slot().predecessors);
        if !predecessors.is_empty() {
            self.release_all(models, &predecessors)?;
            return Ok(true);
        }
        let Some((victim_name, victim)) = self.least_recently_used_pinned(name)? else {
            return Ok(false);
        };
        if models.with_generator(|g| self.release(g, &victim, PinState::NotResident))?? {
            tracing::info!(corpus = %name, released = %victim_name, "released a pinned corpus prefix to make room");
            loaded.slot().released.push(victim_name);
        }
        Ok(true)
    }

    fn release_all<M: ModelAccess>(&self, models: &M, all: &[Arc<LoadedCorpus>]) -> Result<()> {
        if all.is_empty() {
            return Ok(());
        }
        models.with_generator(|g| self.release_now(g, all))?
    }

    /// Unpin each of `all` that is pinned.
    pub(super) fn release_now(
        &self,
        generator: &mut dyn Generator,
        all: &[Arc<LoadedCorpus>],
    ) -> Result<()> {
        for old in all {
            self.release(generator, old, PinState::NoPrefix)?;
        }
        Ok(())
    }

    /// Unpin the prefix of `loaded` if it is pinned, leaving it in state `after`; whether it was.
    pub(super) fn release(
        &self,
        generator: &mut dyn Generator,
        loaded: &LoadedCorpus,
        after: PinState,
    ) -> Result<bool> {
        let mut slot = loaded.slot();
        if !matches!(slot.state, PinState::Pinned(_)) {
            return Ok(false);
        }
        if let Ok(lc) = &loaded.long_context {
            generator.unpin_prefix(ModelRole::LongContext, &lc.prefix)?;
        }
        loaded.settle(&mut slot, after);
        Ok(true)
    }
}
