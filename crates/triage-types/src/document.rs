//! A document to ingest, as every reader (files, suites, datasets) produces it.

/// One document to ingest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub id: String,
    pub title: String,
    pub text: String,
}
