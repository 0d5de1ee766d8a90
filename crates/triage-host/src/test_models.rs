//! Test models for the host's own tests: an engine over a tiny model that can be told to break
//! or to hold its pins' steps, reached through a lock as a host reaches its models, and the
//! documents the tests store.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::quantized::GgmlDType;
use triage_engine::{EngineConfig, GenerateRequest, KvBudget, LlmEngine, PinJob, TokenOutput};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;
use triage_retrieval::{BertEmbedder, Document};
use triage_router::{Generated, Generator, ModelRole, RouterError};

use crate::error::Result;
use crate::host::ModelAccess;

/// An engine that can be told to fail every model lookup (as a broken model would), and
/// whose pins step only as far as the test allows.
pub struct Flaky {
    pub engine: LlmEngine,
    pub broken: bool,
    /// Pins started so far.
    pub num_pins: usize,
    /// Engine steps the pinner may still take (unbounded unless a test bounds it).
    pub steps_allowed: Arc<AtomicUsize>,
}

/// The engine as the pinner reaches it: one lock, taken for one call at a time.
pub struct Models(pub Mutex<Flaky>);

impl ModelAccess for Models {
    fn with_generator<R>(&self, f: impl FnOnce(&mut dyn Generator) -> R) -> Result<R> {
        Ok(f(&mut *self.0.lock().unwrap()))
    }
}

impl Models {
    pub fn g(&self) -> MutexGuard<'_, Flaky> {
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

pub fn doc(id: &str, text: &str) -> Document {
    Document {
        id: id.into(),
        title: id.into(),
        text: text.into(),
    }
}

/// An engine over a tiny model and a tiny embedder, both written under `dir`.
pub fn replica(dir: &Path) -> (Flaky, BertEmbedder) {
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

/// Documents long enough that pinning them takes many 64-token steps.
pub fn notes(from: usize, to: usize) -> Vec<Document> {
    (from..to)
        .map(|i| {
            doc(
                &format!("n{i}"),
                &format!("note {i}: the tide rose over the rocks at dawn and fell by noon"),
            )
        })
        .collect()
}
