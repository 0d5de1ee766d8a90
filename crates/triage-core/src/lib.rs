//! Bookkeeping: requests, block pool, KV-cache manager and scheduler (ids, hashes, counts).
#![forbid(unsafe_code)]
