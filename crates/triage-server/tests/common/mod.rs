//! A real listening server on a tiny random model, for the integration tests.
// Each test binary (server, gateway) uses part of these helpers.
#![allow(dead_code)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::GgmlDType;
use serde_json::Value;
use triage_engine::LlmEngine;
use triage_host::{ModelEntry, ServerSettings, TriageConfig};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, TinySpec};
use triage_models::model::Model;
use triage_models::transformer::LoadOptions;
use triage_router::ModelRole;
use triage_server::{AppState, EngineWorker, RoutingService};

pub const MODEL: &str = "tiny";

pub struct TestServer {
    pub url: String,
    pub state: Arc<AppState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Start on a free loopback port with `edit` applied to the default test config.
    pub async fn start(edit: impl FnOnce(&mut TriageConfig)) -> Self {
        Self::start_inner(edit, false).await
    }

    /// Start with the routing pipeline (alias `triage`) over the tiny model, a tiny BERT
    /// embedder, and a scratch corpus store.
    pub async fn start_routed(edit: impl FnOnce(&mut TriageConfig)) -> Self {
        Self::start_inner(edit, true).await
    }

    async fn start_inner(edit: impl FnOnce(&mut TriageConfig), routed: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        // A long context, so a test can start a generation that outlives its client.
        let spec = TinySpec {
            context_length: 4096,
            ..TinySpec::new(Architecture::Qwen2)
        };
        write_tiny_gguf(&path, &spec, GgmlDType::Q8_0).unwrap();
        let mut config = TriageConfig {
            models: vec![ModelEntry {
                path: Some(path.display().to_string()),
                block_size: 4,
                ..ModelEntry::named(MODEL, ModelRole::Base, "2048blocks")
            }],
            server: ServerSettings {
                shutdown_timeout_s: 5,
                ..ServerSettings::default()
            },
            ..TriageConfig::default()
        };
        edit(&mut config);
        config.validate().unwrap();
        let model = Model::load(MODEL, &path, &LoadOptions::default()).unwrap();
        let entry = &config.models[0];
        let model = Arc::new(model);
        let engine = LlmEngine::new(model.clone(), entry.engine_config().unwrap()).unwrap();
        let worker = EngineWorker::spawn(&entry.name, entry.role, model, engine).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let workers = vec![Arc::new(worker)];
        let routing = routed.then(|| {
            let bert = dir.path().join("tiny-bert");
            triage_models::bert_fixtures::write_tiny_bert(&bert, false, 7).unwrap();
            let embedder = triage_retrieval::BertEmbedder {
                name: "tiny-bert".into(),
                model: triage_models::bert::SentenceEmbedder::load(
                    &bert,
                    &candle_core::Device::Cpu,
                )
                .unwrap(),
            };
            Arc::new(
                RoutingService::new(
                    &config.pipeline.alias,
                    config.routing.clone(),
                    &workers,
                    embedder,
                    &dir.path().join("data"),
                    dir.path().join("prefixes"),
                )
                .unwrap()
                .with_corpus_limits(config.pipeline.limits),
            )
        });
        let state = AppState::with_routing(config, workers, routing);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(triage_server::serve(state.clone(), listener, async move {
            let _ = rx.await;
        }));
        Self {
            url,
            state,
            shutdown: Some(tx),
            task: Some(task),
            _dir: dir,
        }
    }

    /// Ask for a graceful shutdown (as SIGTERM does).
    pub fn signal_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub fn blocks_used(&self) -> usize {
        self.state.workers[0]
            .stats
            .blocks_used
            .load(Ordering::SeqCst)
    }

    pub fn abandoned(&self) -> usize {
        self.state.workers[0].stats.abandoned.load(Ordering::SeqCst)
    }

    pub fn pending(&self) -> usize {
        self.state.workers[0].pending.load(Ordering::SeqCst)
    }

    /// Wait until no KV block is used and no request is pending (the engine frees blocks
    /// asynchronously after a client leaves).
    pub async fn wait_idle(&self) {
        let start = Instant::now();
        while self.blocks_used() != 0 || self.pending() != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "still {} blocks used, {} pending",
                self.blocks_used(),
                self.pending()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until no request is pending, running or waiting (blocks of pinned corpus prefixes
    /// stay in use).
    pub async fn wait_no_requests(&self) {
        let start = Instant::now();
        let stats = &self.state.workers[0].stats;
        let busy = || {
            self.pending()
                + stats.running.load(Ordering::SeqCst)
                + stats.waiting.load(Ordering::SeqCst)
        };
        while busy() != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "still {} requests",
                busy()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until the engine has cancelled `n` requests whose clients left.
    pub async fn wait_abandoned(&self, n: usize) {
        let start = Instant::now();
        while self.abandoned() < n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{} abandoned requests, expected {n}",
                self.abandoned()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// A request with any method, returning the status, the `x-triage-route` header and the
    /// JSON body.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> (u16, Option<String>, Value) {
        let r = reqwest::Client::new()
            .request(method, format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let route = r
            .headers()
            .get("x-triage-route")
            .map(|v| v.to_str().unwrap().to_string());
        (status, route, r.json().await.unwrap_or(Value::Null))
    }

    /// POST a chat completion and return the response unread (streams, hang-ups).
    pub async fn open(&self, body: &Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", self.url))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("{}{path}", self.url)).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// `GET /v1/corpora/{name}` once its prefix's pin has ended (a corpus change returns
    /// before it), which must be within a minute on the tiny model.
    pub async fn pinned_corpus(&self, name: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = self.get(&format!("/v1/corpora/{name}")).await;
            assert_eq!(status, 200, "{body}");
            let body: Value = serde_json::from_str(&body).unwrap();
            if body["pin"]["state"] != "pinning" {
                return body;
            }
            assert!(Instant::now() < deadline, "still pinning: {body}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// POST a streaming request and return its `data:` payloads in order.
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        sse_data(&r.text().await.unwrap())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.signal_shutdown();
    }
}

/// The `data:` payloads of an event stream (keep-alive comments skipped).
pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

pub fn chat_body(content: &str, max_tokens: u32) -> Value {
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
    })
}
