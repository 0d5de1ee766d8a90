//! `MilvusBackend`: one Milvus collection per (corpus, embedder), kept equal to the corpus's
//! chunks by `sync`, searched through `SearchBackend`.

use std::collections::BTreeSet;
use std::time::Duration;

use milvus::v2::prelude::*;
use milvus::v2::ConsistencyLevel;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::runtime::Runtime;
use triage_retrieval::{Corpus, HybridRanking, Ranked, SearchBackend};

use crate::error::{during, MilvusError, Result};

const ID: &str = "id";
const TEXT: &str = "text";
const DENSE: &str = "dense";
const SPARSE: &str = "sparse";
/// Rows per insert request.
const INSERT_BATCH: usize = 256;
/// Ids per delete request and per listing page.
const ID_BATCH: usize = 1000;
/// Longest chunk id and text Milvus stores (VARCHAR limits).
const MAX_ID: u32 = 128;
const MAX_TEXT: u32 = 65_535;

/// What a `sync` changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub inserted: usize,
    pub deleted: usize,
    pub total: usize,
}

/// The collection of `corpus` embedded with `embedder_id`: `triage_<corpus>_<hash>`, the corpus
/// name with `-` written `_h` and `_` written `_u` (Milvus allows letters, digits and `_`), the
/// hash naming the embedder so vectors of two embedders never share a collection.
pub fn collection_name(corpus: &str, embedder_id: &str) -> String {
    let escaped: String = corpus
        .chars()
        .map(|c| match c {
            '-' => "_h".to_string(),
            '_' => "_u".to_string(),
            c => c.to_string(),
        })
        .collect();
    let hash = Sha256::digest(embedder_id.as_bytes());
    let tag: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("triage_{escaped}_{tag}")
}

/// A corpus's mirror in Milvus.
pub struct MilvusBackend {
    runtime: Runtime,
    client: ClientV2,
    collection: String,
}

impl std::fmt::Debug for MilvusBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MilvusBackend")
            .field("collection", &self.collection)
            .finish()
    }
}

fn string_ids(result: &SingleResult) -> Result<Vec<String>> {
    match result.get_ids() {
        Ids::VarChar(ids) => Ok(ids.clone()),
        _ => Err(MilvusError::Invalid(
            "the collection's ids are not strings; it was not made by triage".into(),
        )),
    }
}

/// The first result list of a response, as (id, score) with `score` mapped by `f`.
fn ranked(results: &SearchResults, f: impl Fn(f32) -> f32) -> Result<Ranked> {
    let Some(first) = results.into_iter().next() else {
        return Ok(Vec::new());
    };
    let ids = string_ids(first)?;
    Ok(ids
        .into_iter()
        .zip(first.get_scores().iter().map(|&s| f(s)))
        .collect())
}

/// `id in ["…", …]` with the ids quoted as JSON strings. (Deleting by `Ids` sends a filter
/// template, which milvus-lite does not parse.)
fn id_filter(ids: &[String]) -> String {
    let quoted: Vec<String> = ids.iter().map(|id| json!(id).to_string()).collect();
    format!("{ID} in [{}]", quoted.join(", "))
}

impl MilvusBackend {
    /// Connect to the Milvus at `uri` (e.g. `http://127.0.0.1:19530`) for `corpus`'s collection.
    pub fn connect(uri: &str, corpus: &Corpus) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let config = ConnectConfig::new()
            .uri(uri)
            .connect_timeout(Duration::from_secs(10))
            .telemetry(TelemetryConfig::new().enabled(false));
        let client =
            runtime
                .block_on(ClientV2::new(&config))
                .map_err(|e| MilvusError::Connect {
                    uri: uri.to_string(),
                    message: e.to_string(),
                })?;
        Ok(Self {
            runtime,
            client,
            collection: collection_name(&corpus.name, corpus.embedder_id()),
        })
    }

    pub fn collection(&self) -> &str {
        &self.collection
    }

    fn exists(&self) -> Result<bool> {
        let request = HasCollectionRequest::builder()
            .collection_name(&self.collection)
            .build()?;
        Ok(during(
            "has collection",
            self.runtime.block_on(self.client.has_collection(request)),
        )?
        .exists())
    }

    fn create(&self, dim: usize) -> Result<()> {
        let dim = u32::try_from(dim).map_err(|_| MilvusError::Invalid("vector width".into()))?;
        let schema = CollectionSchema::new()
            .add_field(
                FieldSchema::new()
                    .name(ID)
                    .data_type(DataType::VarChar)
                    .max_length(MAX_ID)
                    .primary_key(true),
            )
            .add_field(
                FieldSchema::new()
                    .name(TEXT)
                    .data_type(DataType::VarChar)
                    .max_length(MAX_TEXT)
                    .enable_analyzer(true),
            )
            .add_field(
                FieldSchema::new()
                    .name(DENSE)
                    .data_type(DataType::FloatVector)
                    .dimension(dim),
            )
            .add_field(
                FieldSchema::new()
                    .name(SPARSE)
                    .data_type(DataType::SparseFloatVector),
            )
            .add_function(
                Function::new()
                    .name("bm25")
                    .function_type(FunctionType::Bm25)
                    .input_fields([TEXT])
                    .output_fields([SPARSE]),
            );
        let create = CreateCollectionRequest::builder()
            .collection_name(&self.collection)
            .schema(schema)
            .consistency_level(ConsistencyLevel::Strong)
            .build()?;
        during(
            "create collection",
            self.runtime.block_on(self.client.create_collection(create)),
        )?;
        let index = CreateIndexRequest::builder()
            .collection_name(&self.collection)
            .index_params(vec![
                IndexParam::new()
                    .field_name(DENSE)
                    .index_type(IndexType::Hnsw)
                    .metric_type(MetricType::Cosine),
                IndexParam::new()
                    .field_name(SPARSE)
                    .index_type(IndexType::SparseInvertedIndex)
                    .metric_type(MetricType::Bm25),
            ])
            // Waiting polls AllocTimestamp, which milvus-lite lacks; loading the collection
            // waits for the indexes anyway.
            .sync(false)
            .build()?;
        during(
            "create index",
            self.runtime.block_on(self.client.create_index(index)),
        )?;
        let load = LoadCollectionRequest::builder()
            .collection_name(&self.collection)
            .build()?;
        during(
            "load collection",
            self.runtime.block_on(self.client.load_collection(load)),
        )?;
        Ok(())
    }

    /// Every chunk id in the collection: through a query iterator (no size limit) where the
    /// server has one, else in offset pages (milvus-lite has no iterator; Milvus proper caps
    /// offset pages at 16,384 rows, which is where the iterator is needed).
    fn stored_ids(&self) -> Result<BTreeSet<String>> {
        self.ids_by_iterator().or_else(|_| self.ids_by_pages())
    }

    fn id_query(&self) -> QueryRequestBuilder {
        QueryRequest::builder()
            .collection_name(&self.collection)
            .filter(format!("{ID} != \"\""))
            .output_fields([ID])
            .consistency_level(ConsistencyLevel::Strong)
    }

    fn ids_by_iterator(&self) -> Result<BTreeSet<String>> {
        let request = QueryIteratorRequest::builder()
            .query(self.id_query().build()?)
            .batch_size(ID_BATCH)
            .build()?;
        let listed = self.runtime.block_on(async {
            let mut iterator = self.client.query_iterator(request).await?;
            let mut ids = BTreeSet::new();
            while let Some(page) = iterator.next().await? {
                let before = ids.len();
                for row in page.results().rows()? {
                    ids.insert(row.get_str(ID)?.to_string());
                }
                if ids.len() == before {
                    break;
                }
            }
            Ok(ids)
        });
        during("list chunk ids", listed)
    }

    fn ids_by_pages(&self) -> Result<BTreeSet<String>> {
        let mut ids = BTreeSet::new();
        loop {
            let request = self
                .id_query()
                .limit(ID_BATCH as i64)
                .offset(ids.len() as i64)
                .build()?;
            let page = during(
                "list chunk ids",
                self.runtime.block_on(self.client.query(request)),
            )?;
            let before = ids.len();
            for row in page.results().rows()? {
                ids.insert(row.get_str(ID)?.to_string());
            }
            if ids.len() - before < ID_BATCH {
                return Ok(ids);
            }
        }
    }

    /// Make the collection hold exactly `corpus`'s chunks (creating it on first use): chunks it
    /// lacks are inserted, chunks the corpus no longer has are deleted. Chunk ids are content
    /// hashes, so an unchanged id means unchanged text and vector.
    pub fn sync(&self, corpus: &Corpus) -> Result<SyncReport> {
        let dim = corpus.vectors().first().map_or(0, Vec::len);
        if !self.exists()? {
            if dim == 0 {
                return Ok(SyncReport::default());
            }
            self.create(dim)?;
        }
        let stored = self.stored_ids()?;
        let wanted: BTreeSet<&str> = corpus.chunks().iter().map(|c| c.id.as_str()).collect();
        let stale: Vec<String> = stored
            .iter()
            .filter(|id| !wanted.contains(id.as_str()))
            .cloned()
            .collect();
        for batch in stale.chunks(ID_BATCH) {
            let delete = DeleteRequest::builder()
                .collection_name(&self.collection)
                .filter(id_filter(batch))
                .build()?;
            during("delete", self.runtime.block_on(self.client.delete(delete)))?;
        }
        let missing: Vec<serde_json::Value> = corpus
            .chunks()
            .iter()
            .zip(corpus.vectors())
            .filter(|(c, _)| !stored.contains(&c.id))
            .map(|(c, v)| json!({ ID: c.id, TEXT: c.text, DENSE: v }))
            .collect();
        for batch in missing.chunks(INSERT_BATCH) {
            let insert = InsertRequest::builder()
                .collection_name(&self.collection)
                .rows(batch.to_vec())
                .build()?;
            during("insert", self.runtime.block_on(self.client.insert(insert)))?;
        }
        Ok(SyncReport {
            inserted: missing.len(),
            deleted: stale.len(),
            total: wanted.len(),
        })
    }

    /// Remove the collection.
    pub fn drop_collection(&self) -> Result<()> {
        if self.exists()? {
            let drop = DropCollectionRequest::builder()
                .collection_name(&self.collection)
                .build()?;
            during(
                "drop collection",
                self.runtime.block_on(self.client.drop_collection(drop)),
            )?;
        }
        Ok(())
    }

    fn dense_search(&self, vector: &[f32], n: usize) -> Result<Ranked> {
        let request = SearchRequest::builder()
            .collection_name(&self.collection)
            .vector_field(DENSE)
            .vectors(SearchVectors::Float(vec![vector.to_vec()]))
            .limit(n as i64)
            .consistency_level(ConsistencyLevel::Strong)
            .build()?;
        let response = during("search", self.runtime.block_on(self.client.search(request)))?;
        ranked(response.results(), |s| s)
    }

    fn bm25_search(&self, query: &str, n: usize) -> Result<Ranked> {
        let request = SearchRequest::builder()
            .collection_name(&self.collection)
            .vector_field(SPARSE)
            .vectors(SearchVectors::EmbeddedText(vec![query.to_string()]))
            .limit(n as i64)
            .consistency_level(ConsistencyLevel::Strong)
            .build()?;
        let response = during("search", self.runtime.block_on(self.client.search(request)))?;
        // Milvus reports BM25 as a distance: a negated score on milvus-lite, the score itself on
        // Milvus proper. Results come best first either way, so the score is the magnitude.
        ranked(response.results(), f32::abs)
    }

    fn hybrid_search(
        &self,
        query: &str,
        vector: &[f32],
        candidates: usize,
        rrf_k: f32,
    ) -> Result<Ranked> {
        if rrf_k.fract() != 0.0 || rrf_k < 1.0 {
            return Err(MilvusError::Invalid(format!(
                "Milvus's RRF ranker takes a whole k ≥ 1, not {rrf_k}"
            )));
        }
        let dense = SubSearchRequest::builder()
            .vector_field(DENSE)
            .vectors(SearchVectors::Float(vec![vector.to_vec()]))
            .limit(candidates as i64)
            .build()?;
        let sparse = SubSearchRequest::builder()
            .vector_field(SPARSE)
            .vectors(SearchVectors::EmbeddedText(vec![query.to_string()]))
            .limit(candidates as i64)
            .build()?;
        let request = HybridSearchRequest::builder()
            .collection_name(&self.collection)
            .sub_requests(vec![dense, sparse])
            .rerank(RRFRerank::new().k(rrf_k as i64))
            .limit(2 * candidates as i64)
            .consistency_level(ConsistencyLevel::Strong)
            .build()?;
        let response = during(
            "hybrid search",
            self.runtime.block_on(self.client.hybrid_search(request)),
        )?;
        ranked(response.results(), |s| s)
    }
}

impl SearchBackend for MilvusBackend {
    /// Milvus searches its HNSW index; `exact` is not available here.
    fn dense(&self, vector: &[f32], n: usize, _exact: bool) -> triage_retrieval::Result<Ranked> {
        Ok(self.dense_search(vector, n)?)
    }

    fn bm25(&self, query: &str, n: usize) -> triage_retrieval::Result<Ranked> {
        Ok(self.bm25_search(query, n)?)
    }

    fn hybrid(
        &self,
        query: &str,
        vector: &[f32],
        candidates: usize,
        rrf_k: f32,
        _exact: bool,
    ) -> triage_retrieval::Result<HybridRanking> {
        // Three round trips: the fused order comes from Milvus's own RRF ranker (the point of
        // this backend), the two plain searches only report each hit's rank per arm.
        Ok(HybridRanking {
            fused: self.hybrid_search(query, vector, candidates, rrf_k)?,
            dense: self.dense_search(vector, candidates)?,
            bm25: self.bm25_search(query, candidates)?,
        })
    }
}
