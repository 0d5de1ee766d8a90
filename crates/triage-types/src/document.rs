//! A document to ingest, as every reader (files, suites, datasets) produces it.

use serde::Serialize;

/// One document to ingest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Document {
    pub id: String,
    pub title: String,
    pub text: String,
}
