//! What the registry reports: a corpus's summary (documents, chunks, its long-context prefix and
//! the state of its pin), a document listing, and the outcome of a change.

use std::collections::HashMap;

use super::pins::PinState;
use super::LoadedCorpus;
use serde::Serialize;
use triage_engine::PrefixSource;
use triage_retrieval::Corpus;

/// Where a corpus's long-context prefix stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PinStatus {
    /// Being prefilled in the background (or queued, at 0): questions answer by RAG meanwhile.
    Pinning {
        tokens_done: usize,
        tokens_total: usize,
    },
    /// Resident in the long-context model's cache: `tokens` (whole blocks) came `from` the
    /// cache, a saved file, or a prefill (`computed`).
    Pinned { tokens: usize, from: &'static str },
    /// Not resident (released to make room, or loaded for RAG only): the next question that
    /// may take long context queues its pin.
    Unpinned,
    /// The corpus has no long-context path (why): it answers by RAG.
    Unavailable { reason: String },
}

/// What loading (or listing) a corpus reports.
#[derive(Debug, Clone, Serialize)]
pub struct CorpusSummary {
    pub name: String,
    /// The stored generation served (`name@generation`), when the corpus is loaded.
    pub generation: Option<u64>,
    #[serde(rename = "documents")]
    pub num_documents: usize,
    #[serde(rename = "chunks")]
    pub num_chunks: usize,
    /// Tokens of the corpus prefix in the long-context model, when it fits.
    pub prefix_tokens: Option<usize>,
    /// Whether that prefix is resident now (false once released for another corpus's).
    pub prefix_pinned: bool,
    /// Tokens of the resident prefix pinned in the cache, and where their KV came from when it
    /// was pinned (`cache`, `disk`, `computed`); absent while no prefix is resident.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_tokens: Option<usize>,
    pub pinned_from: Option<&'static str>,
    /// Of a prefix prefilled by this load, the tokens found cached (a corpus grown at its end
    /// prefills only the rest); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused_tokens: Option<usize>,
    /// Why the long-context path is unavailable for it now.
    pub long_context_unavailable: Option<String>,
    /// The state of its prefix's pin.
    pub pin: PinStatus,
    /// Corpora whose prefix this load released to make room (pinned again when next asked).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unpinned_corpora: Vec<String>,
}

/// One document of a corpus, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct DocumentSummary {
    pub id: String,
    pub title: String,
    pub chunks: usize,
}

/// What a change to a corpus's documents did.
#[derive(Debug, Clone, Serialize)]
pub struct DocumentsChange {
    pub added: usize,
    pub updated: usize,
    pub unchanged: usize,
    pub deleted: usize,
    /// The corpus as it is served now.
    pub corpus: CorpusSummary,
    /// Set when the documents were stored but the new generation could not be loaded: the
    /// previous one (if any) is still served, and the next load or restart picks up the new.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reload_error: Option<String>,
}

/// The name the summaries give a prefix's source.
pub fn pinned_name(source: PrefixSource) -> &'static str {
    match source {
        PrefixSource::Cache => "cache",
        PrefixSource::Disk => "disk",
        PrefixSource::Computed { .. } => "computed",
    }
}

/// The pin's state as a client sees it.
fn pin_status(loaded: &LoadedCorpus) -> PinStatus {
    let slot = loaded.slot();
    match &slot.state {
        PinState::NoPrefix => PinStatus::Unavailable {
            reason: match &loaded.long_context {
                Err(why) => why.clone(),
                Ok(_) => "the corpus is no longer served".into(),
            },
        },
        PinState::DoesNotFit(why) => PinStatus::Unavailable {
            reason: why.clone(),
        },
        PinState::Pinning(job) => {
            let (tokens_done, tokens_total) = job.progress();
            PinStatus::Pinning {
                tokens_done,
                tokens_total,
            }
        }
        PinState::Pinned(p) => PinStatus::Pinned {
            tokens: p.num_tokens,
            from: pinned_name(p.source),
        },
        PinState::NotResident => PinStatus::Unpinned,
    }
}

/// What a loaded corpus reports.
pub(crate) fn summary(name: &str, loaded: &LoadedCorpus) -> CorpusSummary {
    let pinned = loaded.pinned();
    CorpusSummary {
        name: name.to_string(),
        generation: Some(loaded.corpus.generation),
        num_documents: loaded.corpus.num_documents(),
        num_chunks: loaded.corpus.chunks().len(),
        prefix_tokens: loaded.long_context.as_ref().ok().map(|lc| lc.prefix.len()),
        prefix_pinned: loaded.pinned().is_some(),
        pinned_tokens: pinned.map(|p| p.num_tokens),
        pinned_from: pinned.map(|p| pinned_name(p.source)),
        reused_tokens: pinned.and_then(|p| match p.source {
            PrefixSource::Computed { reused_tokens } => Some(reused_tokens),
            _ => None,
        }),
        long_context_unavailable: loaded.usable_long_context().err(),
        pin: pin_status(loaded),
        unpinned_corpora: Vec::new(),
    }
}

/// The summary of a corpus that is stored but not loaded.
pub(super) fn not_loaded(name: &str) -> CorpusSummary {
    CorpusSummary {
        name: name.to_string(),
        generation: None,
        num_documents: 0,
        num_chunks: 0,
        prefix_tokens: None,
        prefix_pinned: false,
        pinned_tokens: None,
        pinned_from: None,
        reused_tokens: None,
        long_context_unavailable: Some("the corpus is not loaded".into()),
        pin: PinStatus::Unavailable {
            reason: "the corpus is not loaded".into(),
        },
        unpinned_corpora: Vec::new(),
    }
}

/// Bytes of text of each document of `corpus` (its chunks' furthest end).
pub(super) fn document_bytes(corpus: &Corpus) -> HashMap<&str, usize> {
    let mut bytes: HashMap<&str, usize> = HashMap::new();
    for c in corpus.chunks() {
        let end = bytes.entry(c.doc_id.as_str()).or_default();
        *end = (*end).max(c.end);
    }
    bytes
}
