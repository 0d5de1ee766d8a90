//! `Metrics`: the Prometheus registry behind `GET /metrics` (prometheus-client, the Prometheus
//! project's own Rust crate). Every name starts with `triage_`. Gauges of each engine (running,
//! waiting, KV blocks) are read from its worker's counters at scrape time, and so are the
//! corpus prefixes resident. Gateways' schedulers read some of them under names they are told
//! (`docs/deploy.md` maps them): the queue, running requests, KV-cache usage as a 0–1 gauge, the
//! cache layout as an info metric with vLLM's label names, and the prefix tokens per corpus.

use std::sync::atomic::{AtomicU64, Ordering};
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

/// The cache layout, in the label names vLLM's `cache_config_info` uses (endpoint pickers read
/// `block_size` and `num_gpu_blocks`; on a CPU the blocks are in host memory).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheConfigLabels {
    model: String,
    block_size: String,
    num_gpu_blocks: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrefixLabels {
    corpus: String,
    generation: String,
    model: String,
}

/// A corpus prefix resident in a model's KV cache, as `/metrics` reports it.
#[derive(Debug, Clone)]
pub struct ResidentPrefix {
    pub corpus: String,
    pub generation: u64,
    pub model: String,
    pub tokens: usize,
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
    kv_cache_usage: Family<ModelLabels, Gauge<f64, AtomicU64>>,
    cache_config: Family<CacheConfigLabels, Gauge>,
    prefix_tokens: Family<PrefixLabels, Gauge>,
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
        let m = Self::unregistered();
        if let Ok(mut r) = m.registry.lock() {
            m.register_request_metrics(&mut r);
            m.register_engine_gauges(&mut r);
        }
        m
    }
}

impl Metrics {
    /// Every family, empty, and a registry that does not know them yet.
    fn unregistered() -> Self {
        let time_to_first_token =
            Family::<ModelLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        let inter_token_latency =
            Family::<ModelLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        Self {
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
            kv_cache_usage: Family::default(),
            cache_config: Family::default(),
            prefix_tokens: Family::default(),
            abandoned: Family::default(),
        }
    }

    /// The metrics counted as requests are served: requests, latencies, tokens, prefix cache.
    fn register_request_metrics(&self, r: &mut Registry) {
        r.register(
            "requests",
            "HTTP requests by endpoint and status",
            self.requests.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "Time from accepting a request to its first token",
            self.time_to_first_token.clone(),
        );
        r.register(
            "inter_token_latency_seconds",
            "Time between consecutive tokens of a request",
            self.inter_token_latency.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of finished requests",
            self.prompt_tokens.clone(),
        );
        r.register(
            "generation_tokens",
            "Tokens generated for finished requests",
            self.generation_tokens.clone(),
        );
        r.register(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            self.prefix_cache_queries.clone(),
        );
        r.register(
            "prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            self.prefix_cache_hits.clone(),
        );
    }

    /// The gauges read from the engines and the corpus registry at scrape time.
    fn register_engine_gauges(&self, r: &mut Registry) {
        r.register(
            "requests_running",
            "Requests holding KV blocks",
            self.running.clone(),
        );
        r.register(
            "requests_waiting",
            "Requests waiting to be scheduled",
            self.waiting.clone(),
        );
        r.register(
            "kv_blocks_used",
            "KV blocks in use (pinned included)",
            self.kv_blocks_used.clone(),
        );
        r.register(
            "kv_blocks_total",
            "KV blocks in the pool",
            self.kv_blocks_total.clone(),
        );
        r.register(
            "kv_blocks_pinned",
            "KV blocks held by pinned corpus prefixes (in use while no request runs)",
            self.kv_blocks_pinned.clone(),
        );
        r.register(
            "kv_cache_usage_perc",
            "Fraction of KV blocks in use, pinned included (0 to 1)",
            self.kv_cache_usage.clone(),
        );
        r.register(
            "cache_config_info",
            "The KV cache layout (labels block_size and num_gpu_blocks, as vLLM names them); \
             always 1",
            self.cache_config.clone(),
        );
        r.register(
            "prefix_tokens_resident",
            "Tokens of each corpus prefix pinned in a model's KV cache (gone once released)",
            self.prefix_tokens.clone(),
        );
        r.register(
            "requests_abandoned",
            "Requests cancelled because their client disconnected (since start)",
            self.abandoned.clone(),
        );
    }
}

impl Metrics {
    /// The text exposition, with engine gauges and the resident corpus prefixes read now.
    pub fn render(&self, workers: &[Arc<EngineWorker>], prefixes: &[ResidentPrefix]) -> String {
        // Held throughout, so two scrapes never interleave clearing and setting the families.
        let Ok(registry) = self.registry.lock() else {
            return String::new();
        };
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
            let (used, total) = (get(&w.stats.blocks_used), get(&w.stats.blocks_total));
            let usage = if total > 0 {
                used as f64 / total as f64
            } else {
                0.0
            };
            self.kv_cache_usage.get_or_create(&labels).set(usage);
            let layout = CacheConfigLabels {
                model: w.name.clone(),
                block_size: get(&w.stats.block_size).to_string(),
                num_gpu_blocks: total.to_string(),
            };
            self.cache_config.get_or_create(&layout).set(1);
        }
        // Released and deleted corpora drop out: the family holds exactly what is resident.
        self.prefix_tokens.clear();
        for p in prefixes {
            let labels = PrefixLabels {
                corpus: p.corpus.clone(),
                generation: p.generation.to_string(),
                model: p.model.clone(),
            };
            self.prefix_tokens
                .get_or_create(&labels)
                .set(p.tokens as i64);
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}
