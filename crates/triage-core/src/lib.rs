//! Bookkeeping: requests, block pool, KV-cache manager and scheduler (ids, hashes, counts).
#![forbid(unsafe_code)]

// The API is the re-exports below; the modules are private.

mod block_hash;
mod block_pool;
mod fnv;
mod kv_cache_manager;
mod scheduler;

pub use block_hash::{hash_block, hash_prefix, BlockHash};
pub use block_pool::{BlockId, BlockPool, NULL_BLOCK};
pub use fnv::{fnv1a, fnv1a_extend, FNV1A_OFFSET};
pub use kv_cache_manager::{ComputedBlocks, KvCacheManager, PrefixHandle, RequestId};
pub use scheduler::{
    FinishReason, Request, ScheduledRequest, Scheduler, SchedulerConfig, SchedulerOutput,
};
