//! `Metrics`: the Prometheus registry behind `GET /metrics` (prometheus-client, the Prometheus
//! project's own Rust crate). Every name starts with `triage_`. Gauges of each engine (running,
//! waiting, KV blocks) are read from its worker's counters at scrape time.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::worker::EngineWorker;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model: String,
}

/// All of the server's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    pub requests: Family<RequestLabels, Counter>,
    pub time_to_first_token: Family<ModelLabels, Histogram>,
    pub inter_token_latency: Family<ModelLabels, Histogram>,
    pub prompt_tokens: Family<ModelLabels, Counter>,
    pub generation_tokens: Family<ModelLabels, Counter>,
    pub prefix_cache_queries: Family<ModelLabels, Counter>,
    pub prefix_cache_hits: Family<ModelLabels, Counter>,
    running: Family<ModelLabels, Gauge>,
    waiting: Family<ModelLabels, Gauge>,
    kv_blocks_used: Family<ModelLabels, Gauge>,
    kv_blocks_total: Family<ModelLabels, Gauge>,
    kv_blocks_pinned: Family<ModelLabels, Gauge>,
    abandoned: Family<ModelLabels, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s in powers of two: CPU decode steps and long prefills alike.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 17,
    ))
}

impl Default for Metrics {
    fn default() -> Self {
        let time_to_first_token =
            Family::<ModelLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        let inter_token_latency =
            Family::<ModelLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        let m = Self {
            registry: Mutex::new(Registry::with_prefix("triage")),
            requests: Family::default(),
            time_to_first_token,
            inter_token_latency,
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            prefix_cache_queries: Family::default(),
            prefix_cache_hits: Family::default(),
            running: Family::default(),
            waiting: Family::default(),
            kv_blocks_used: Family::default(),
            kv_blocks_total: Family::default(),
            kv_blocks_pinned: Family::default(),
            abandoned: Family::default(),
        };
        if let Ok(mut r) = m.registry.lock() {
            r.register(
                "requests",
                "HTTP requests by endpoint and status",
                m.requests.clone(),
            );
            r.register(
                "time_to_first_token_seconds",
                "Time from accepting a request to its first token",
                m.time_to_first_token.clone(),
            );
            r.register(
                "inter_token_latency_seconds",
                "Time between consecutive tokens of a request",
                m.inter_token_latency.clone(),
            );
            r.register(
                "prompt_tokens",
                "Prompt tokens of finished requests",
                m.prompt_tokens.clone(),
            );
            r.register(
                "generation_tokens",
                "Tokens generated for finished requests",
                m.generation_tokens.clone(),
            );
            r.register(
                "prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache",
                m.prefix_cache_queries.clone(),
            );
            r.register(
                "prefix_cache_hits",
                "Prompt tokens found in the prefix cache",
                m.prefix_cache_hits.clone(),
            );
            r.register(
                "requests_running",
                "Requests holding KV blocks",
                m.running.clone(),
            );
            r.register(
                "requests_waiting",
                "Requests waiting to be scheduled",
                m.waiting.clone(),
            );
            r.register(
                "kv_blocks_used",
                "KV blocks in use (pinned included)",
                m.kv_blocks_used.clone(),
            );
            r.register(
                "kv_blocks_total",
                "KV blocks in the pool",
                m.kv_blocks_total.clone(),
            );
            r.register(
                "kv_blocks_pinned",
                "KV blocks held by pinned corpus prefixes (in use while no request runs)",
                m.kv_blocks_pinned.clone(),
            );
            r.register(
                "requests_abandoned",
                "Requests cancelled because their client disconnected (since start)",
                m.abandoned.clone(),
            );
        }
        m
    }
}

impl Metrics {
    /// The text exposition, with engine gauges read now.
    pub fn render(&self, workers: &[Arc<EngineWorker>]) -> String {
        for w in workers {
            let labels = ModelLabels {
                model: w.name.clone(),
            };
            let get = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed) as i64;
            self.running
                .get_or_create(&labels)
                .set(get(&w.stats.running));
            self.waiting
                .get_or_create(&labels)
                .set(get(&w.stats.waiting));
            self.kv_blocks_used
                .get_or_create(&labels)
                .set(get(&w.stats.blocks_used));
            self.kv_blocks_total
                .get_or_create(&labels)
                .set(get(&w.stats.blocks_total));
            self.kv_blocks_pinned
                .get_or_create(&labels)
                .set(get(&w.stats.blocks_pinned));
            self.abandoned
                .get_or_create(&labels)
                .set(get(&w.stats.abandoned));
        }
        let mut text = String::new();
        if let Ok(registry) = self.registry.lock() {
            // Writing into a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        }
        text
    }
}
