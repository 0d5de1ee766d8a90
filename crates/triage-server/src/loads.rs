//! `GET /v1/loads`: the replica's load in the shape SGLang's server reports it, which SGLang's
//! model gateway (SMG) polls to take an overloaded worker out of its consistent-hash ring until
//! the load falls, so that a corpus's questions spill to another replica.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Serialize;

use crate::worker::EngineWorker;

/// The whole answer: one data-parallel rank, this replica.
#[derive(Debug, Serialize, PartialEq)]
pub struct WorkerLoads {
    pub dp_rank_count: usize,
    pub loads: Vec<RankLoad>,
}

/// One rank's load, summed over the replica's engines.
#[derive(Debug, Serialize, PartialEq)]
pub struct RankLoad {
    pub dp_rank: usize,
    /// Requests an engine is running now.
    pub num_running_reqs: usize,
    /// Requests accepted and not yet running: in an engine's queue, on their way to it, or (a
    /// pipeline question) retrieving before they ask a model.
    pub num_waiting_reqs: usize,
    /// The fullest engine's share of the KV blocks left for requests that requests hold: blocks
    /// pinned by corpus prefixes are left out, so a replica that holds a large corpus (which is
    /// where its questions should go) is not reported full for that; 1.0 when pins take all.
    pub token_usage: f64,
}

/// The load of a replica serving `workers`.
pub fn worker_loads(workers: &[Arc<EngineWorker>]) -> WorkerLoads {
    let get = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed);
    let mut load = RankLoad {
        dp_rank: 0,
        num_running_reqs: 0,
        num_waiting_reqs: 0,
        token_usage: 0.0,
    };
    for w in workers {
        let running = get(&w.stats.running);
        load.num_running_reqs += running;
        load.num_waiting_reqs += get(&w.pending).saturating_sub(running);
        let pinned = get(&w.stats.blocks_pinned);
        let room = get(&w.stats.blocks_total).saturating_sub(pinned);
        let held = get(&w.stats.blocks_used).saturating_sub(pinned);
        let usage = if room == 0 {
            1.0
        } else {
            (held as f64 / room as f64).min(1.0)
        };
        load.token_usage = load.token_usage.max(usage);
    }
    WorkerLoads {
        dp_rank_count: 1,
        loads: vec![load],
    }
}
