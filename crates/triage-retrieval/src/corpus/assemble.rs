//! The next generation's manifest and vectors for an ingest, in named steps: check the request,
//! keep the old documents it leaves alone, take the incoming ones (unchanged ones keep their
//! chunks, the rest are chunked), put every document in its place, embed the new chunks in one
//! call, and lay it all out as a manifest.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{doc_hash, Corpus, DocEntry, IngestReport, Manifest, FORMAT};
use crate::chunker::{chunk_document, Chunk, ChunkerConfig, TokenOffsets};
use crate::documents::Document;
use crate::embedder::Embedder;
use crate::error::{Result, RetrievalError};

/// One document of the next generation before it is laid out.
struct Pending {
    id: String,
    title: String,
    hash: String,
    chunks: Vec<Chunk>,
    /// `None` when the chunks must be embedded.
    vectors: Option<Vec<Vec<f32>>>,
}

/// The next manifest and vectors: old chunks kept where documents did not change, new ones
/// chunked and embedded.
pub(super) fn assemble(
    old: Option<&Corpus>,
    docs: &[Document],
    delete: &[String],
    embedder: &dyn Embedder,
    tokens: &dyn TokenOffsets,
    chunker: ChunkerConfig,
) -> Result<(Manifest, Vec<Vec<f32>>, IngestReport)> {
    let mut report = IngestReport::default();
    let (incoming, delete) = check_request(old, docs, delete, &chunker)?;
    // Vectors from another embedder are recomputed.
    let reuse_vectors = old.is_some_and(|o| o.manifest.embedder == embedder.id());
    let mut pending = kept_documents(old, reuse_vectors, &incoming, &delete, &mut report);
    pending.extend(incoming_documents(
        old,
        reuse_vectors,
        docs,
        tokens,
        &chunker,
        &mut report,
    )?);
    put_in_place(&mut pending, old, docs);
    let fresh = embed_new_chunks(&pending, embedder, &mut report)?;
    let (manifest, vectors) = lay_out(pending, fresh, embedder, chunker)?;
    report.chunks_total = manifest.chunks.len();
    Ok((manifest, vectors, report))
}

/// The incoming document ids and the ids to delete, once the request is known to be sound: the
/// chunker settings are the corpus's, no id comes twice, and every id to delete exists.
fn check_request<'a>(
    old: Option<&Corpus>,
    docs: &'a [Document],
    delete: &'a [String],
    chunker: &ChunkerConfig,
) -> Result<(HashSet<&'a str>, HashSet<&'a str>)> {
    if let Some(o) = old.filter(|o| o.manifest.chunker != *chunker) {
        return Err(RetrievalError::Invalid(format!(
            "corpus {:?} was chunked with {:?}; use the same settings or a new corpus",
            o.name, o.manifest.chunker
        )));
    }
    let mut incoming = HashSet::new();
    for d in docs {
        if !incoming.insert(d.id.as_str()) {
            return Err(RetrievalError::Invalid(format!(
                "document id {:?} appears twice",
                d.id
            )));
        }
    }
    let delete: HashSet<&str> = delete.iter().map(String::as_str).collect();
    for &id in &delete {
        let known = old.is_some_and(|o| o.manifest.documents.contains_key(id));
        if !known {
            return Err(RetrievalError::Invalid(format!(
                "no document {id:?} to delete"
            )));
        }
    }
    Ok((incoming, delete))
}

/// An old document's chunks, and its vectors when they can be reused.
fn old_chunks(o: &Corpus, entry: &DocEntry, reuse_vectors: bool) -> Pending {
    Pending {
        id: String::new(),
        title: entry.title.clone(),
        hash: entry.hash.clone(),
        chunks: entry
            .chunks
            .iter()
            .map(|&i| o.manifest.chunks[i].clone())
            .collect(),
        vectors: reuse_vectors
            .then(|| entry.chunks.iter().map(|&i| o.vectors[i].clone()).collect()),
    }
}

/// The old documents that the ingest neither replaces nor deletes, as they were.
fn kept_documents(
    old: Option<&Corpus>,
    reuse_vectors: bool,
    incoming: &HashSet<&str>,
    delete: &HashSet<&str>,
    report: &mut IngestReport,
) -> Vec<Pending> {
    let mut kept = Vec::new();
    let Some(o) = old else {
        return kept;
    };
    for (id, entry) in &o.manifest.documents {
        if delete.contains(id.as_str()) {
            report.deleted += 1;
            continue;
        }
        if incoming.contains(id.as_str()) {
            continue;
        }
        kept.push(Pending {
            id: id.clone(),
            ..old_chunks(o, entry, reuse_vectors)
        });
    }
    kept
}

/// The incoming documents: an unchanged one keeps its chunks (and vectors where they can be
/// reused), a new or changed one is chunked afresh.
fn incoming_documents(
    old: Option<&Corpus>,
    reuse_vectors: bool,
    docs: &[Document],
    tokens: &dyn TokenOffsets,
    chunker: &ChunkerConfig,
    report: &mut IngestReport,
) -> Result<Vec<Pending>> {
    let mut pending = Vec::with_capacity(docs.len());
    for d in docs {
        let hash = doc_hash(d);
        let previous = old.and_then(|o| o.manifest.documents.get(&d.id).map(|e| (o, e)));
        match previous {
            Some((o, e)) if e.hash == hash => {
                report.unchanged += 1;
                pending.push(Pending {
                    id: d.id.clone(),
                    title: d.title.clone(),
                    hash,
                    ..old_chunks(o, e, reuse_vectors)
                });
            }
            changed => {
                if changed.is_some() {
                    report.updated += 1;
                } else {
                    report.added += 1;
                }
                pending.push(Pending {
                    id: d.id.clone(),
                    title: d.title.clone(),
                    hash,
                    chunks: chunk_document(d, tokens, chunker)?,
                    vectors: None,
                });
            }
        }
    }
    Ok(pending)
}

/// The old document's first chunk, where it has one.
fn old_place(old: Option<&Corpus>, id: &str) -> Option<usize> {
    old.and_then(|o| o.manifest.documents.get(id))
        .and_then(|e| e.chunks.first().copied())
}

/// Orders the documents: a document keeps its place; new ones follow in the order given.
/// Appending then leaves every chunk before it where it was (and the long-context prefix's
/// cached blocks valid).
fn put_in_place(pending: &mut [Pending], old: Option<&Corpus>, docs: &[Document]) {
    let num_old = old.map_or(0, |o| o.manifest.chunks.len());
    let place: HashMap<&str, usize> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| (d.id.as_str(), old_place(old, &d.id).unwrap_or(num_old + i)))
        .collect();
    pending.sort_by_key(|p| {
        place
            .get(p.id.as_str())
            .copied()
            .or_else(|| old_place(old, &p.id))
            .unwrap_or(usize::MAX)
    });
}

/// One embedding call for every new chunk: the embedder batches across documents.
fn embed_new_chunks(
    pending: &[Pending],
    embedder: &dyn Embedder,
    report: &mut IngestReport,
) -> Result<Vec<Vec<f32>>> {
    let texts: Vec<&str> = pending
        .iter()
        .filter(|p| p.vectors.is_none())
        .flat_map(|p| p.chunks.iter().map(|c| c.text.as_str()))
        .collect();
    report.chunks_embedded = texts.len();
    let fresh = embedder.embed(&texts)?;
    if fresh.len() != texts.len() {
        return Err(RetrievalError::Invalid(
            "the embedder returned the wrong number of vectors".into(),
        ));
    }
    Ok(fresh)
}

/// The manifest and vectors, documents in order, each with its chunks' indices.
fn lay_out(
    pending: Vec<Pending>,
    fresh: Vec<Vec<f32>>,
    embedder: &dyn Embedder,
    chunker: ChunkerConfig,
) -> Result<(Manifest, Vec<Vec<f32>>)> {
    let mut manifest = Manifest {
        format: FORMAT.into(),
        embedder: embedder.id(),
        dim: embedder.dim(),
        chunker,
        documents: BTreeMap::new(),
        chunks: Vec::new(),
    };
    let mut vectors: Vec<Vec<f32>> = Vec::new();
    let mut fresh = fresh.into_iter();
    for p in pending {
        let embedded: Vec<Vec<f32>> = match p.vectors {
            Some(v) => v,
            None => fresh.by_ref().take(p.chunks.len()).collect(),
        };
        if embedded.len() != p.chunks.len() || embedded.iter().any(|v| v.len() != manifest.dim) {
            return Err(RetrievalError::Invalid(
                "the embedder returned the wrong shape".into(),
            ));
        }
        let first = manifest.chunks.len();
        manifest.chunks.extend(p.chunks);
        vectors.extend(embedded);
        let indices = (first..manifest.chunks.len()).collect();
        manifest.documents.insert(
            p.id,
            DocEntry {
                hash: p.hash,
                title: p.title,
                chunks: indices,
            },
        );
    }
    Ok((manifest, vectors))
}
