//! BM25 through tantivy over the same chunk ids as the dense index: one index per corpus
//! generation, built from scratch at each ingest (a corpus generation is immutable).

use std::path::Path;

use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, Schema, Value, STORED, STRING, TEXT};
use tantivy::{doc, Index, IndexReader, TantivyDocument};

use crate::error::{Result, RetrievalError};

fn index_err(e: impl std::fmt::Display) -> RetrievalError {
    RetrievalError::Index(format!("bm25: {e}"))
}

/// A BM25 hit: chunk id and tantivy's score.
#[derive(Debug, Clone, PartialEq)]
pub struct Bm25Hit {
    pub id: String,
    pub score: f32,
}

/// A tantivy index of chunk texts.
pub struct Bm25Index {
    index: Index,
    reader: IndexReader,
    id: Field,
    text: Field,
}

impl std::fmt::Debug for Bm25Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bm25Index")
    }
}

fn schema() -> (Schema, Field, Field) {
    let mut b = Schema::builder();
    let id = b.add_text_field("id", STRING | STORED);
    let text = b.add_text_field("text", TEXT);
    (b.build(), id, text)
}

impl Bm25Index {
    /// Index `(id, text)` pairs into the empty directory `dir`.
    pub fn build<'a>(dir: &Path, chunks: impl Iterator<Item = (&'a str, &'a str)>) -> Result<Self> {
        let (schema, id, text) = schema();
        let index = Index::create_in_dir(dir, schema).map_err(index_err)?;
        let mut writer = index.writer(50_000_000).map_err(index_err)?;
        for (chunk_id, chunk_text) in chunks {
            writer
                .add_document(doc!(id => chunk_id, text => chunk_text))
                .map_err(index_err)?;
        }
        writer.commit().map_err(index_err)?;
        writer.wait_merging_threads().map_err(index_err)?;
        Self::open(dir)
    }

    pub fn open(dir: &Path) -> Result<Self> {
        let index = Index::open_in_dir(dir).map_err(index_err)?;
        let (_, id, text) = schema();
        let reader = index.reader().map_err(index_err)?;
        Ok(Self {
            index,
            reader,
            id,
            text,
        })
    }

    /// The `k` best chunks for `query` (any text: operators and stray quotes are taken
    /// leniently), best first, ties by id.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Bm25Hit>> {
        let parser = QueryParser::for_index(&self.index, vec![self.text]);
        let (query, _) = parser.parse_query_lenient(query);
        let searcher = self.reader.searcher();
        let top = searcher
            .search(&query, &TopDocs::with_limit(k.max(1)))
            .map_err(index_err)?;
        let mut hits = Vec::with_capacity(top.len());
        for (score, address) in top {
            let doc: TantivyDocument = searcher.doc(address).map_err(index_err)?;
            if let Some(id) = doc.get_first(self.id).and_then(|v| v.as_str()) {
                hits.push(Bm25Hit {
                    id: id.to_string(),
                    score,
                });
            }
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
        Ok(hits)
    }
}
