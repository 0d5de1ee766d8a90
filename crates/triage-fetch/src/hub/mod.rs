//! Models from the Hugging Face Hub (`org/repo`, `org/repo:QUANT`, `org/repo/file`), downloaded
//! with hf-hub into the hub cache that Python's `huggingface_hub` shares, and checked against the
//! sizes and hashes the Hub lists.

mod cache;
mod client;
mod id;
mod listing;
mod model;
mod pick;
mod settings;
mod verify;

#[cfg(feature = "test-support")]
pub mod testing;

pub use client::HubFile;
pub use id::{HubId, DEFAULT_REVISION};
pub use model::{fetch_hub, resolve_hub, HubModel};
pub use pick::DEFAULT_QUANT;
pub use settings::{HubSettings, DEFAULT_ENDPOINT, DEFAULT_MAX_RETRIES};
pub(crate) use verify::cached_sha256;
