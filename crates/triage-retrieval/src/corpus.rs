//! Corpora on disk, and searching them. Each corpus is a folder of immutable generations
//! (`gen-000001/`: manifest, vectors, HNSW graph, BM25 index) and a `CURRENT` file naming the
//! live one. An ingest writes a whole new generation, then replaces `CURRENT` by rename, so a
//! crash at any point leaves the previous generation live and consistent; stray generations are
//! removed by the next ingest.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::{HybridRanking, Ranked, SearchBackend};
use crate::bm25::Bm25Index;
use crate::chunker::{Chunk, ChunkerConfig, TokenOffsets};
use crate::dense::{exact_search, HnswIndex};
use crate::documents::Document;
use crate::dual_path::select_dual;
use crate::embedder::Embedder;
use crate::error::{io_at, Result, RetrievalError};
use crate::hybrid::{reciprocal_rank_fusion, RRF_K};

mod assemble;

const FORMAT: &str = "triage-corpus-v1";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct DocEntry {
    hash: String,
    title: String,
    /// Indices into `Manifest::chunks`.
    chunks: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Manifest {
    format: String,
    embedder: String,
    dim: usize,
    chunker: ChunkerConfig,
    documents: BTreeMap<String, DocEntry>,
    chunks: Vec<Chunk>,
}

/// What an ingest did, in documents and chunks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IngestReport {
    pub added: usize,
    pub updated: usize,
    pub unchanged: usize,
    pub deleted: usize,
    pub chunks_embedded: usize,
    pub chunks_total: usize,
}

/// How to search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMode {
    Dense,
    Bm25,
    Hybrid,
}

/// Search settings: results wanted, candidates per arm for fusion, exact or HNSW dense search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchOptions {
    pub mode: SearchMode,
    pub k: usize,
    pub candidates: usize,
    pub rrf_k: f32,
    pub exact: bool,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            mode: SearchMode::Hybrid,
            k: 10,
            candidates: 30,
            rrf_k: RRF_K,
            exact: false,
        }
    }
}

/// One result: the chunk, the score of the mode asked for, and its rank (from 1) in each arm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    pub chunk: Chunk,
    pub score: f32,
    pub dense_rank: Option<usize>,
    pub dense_score: Option<f32>,
    pub bm25_rank: Option<usize>,
    /// Rank in the pseudo-passage arm of dual-path search.
    pub pseudo_rank: Option<usize>,
}

/// Where corpora live: `<data_dir>/corpora/<name>/`.
#[derive(Debug, Clone)]
pub struct CorpusStore {
    root: PathBuf,
}

/// A corpus opened for search.
#[derive(Debug)]
pub struct Corpus {
    pub name: String,
    /// The number of the stored generation this is (`gen-000042` is 42): a new one per change,
    /// so `name@generation` names exactly these chunks.
    pub generation: u64,
    manifest: Manifest,
    /// Chunk id → index into `manifest.chunks`.
    by_id: HashMap<String, usize>,
    vectors: Vec<Vec<f32>>,
    hnsw: HnswIndex,
    bm25: Bm25Index,
}

/// The number of a generation folder (`gen-000042` → 42).
fn generation_number(dir: &Path) -> Option<u64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix("gen-")?
        .parse()
        .ok()
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(RetrievalError::Invalid(format!(
            "corpus name {name:?}: use 1-64 letters, digits, '-' or '_'"
        )))
    }
}

fn doc_hash(doc: &Document) -> String {
    let mut h = Sha256::new();
    h.update(doc.title.as_bytes());
    h.update([0]);
    h.update(doc.text.as_bytes());
    format!("{:x}", h.finalize())
}

/// Write `bytes` to `path` and flush them to disk.
/// Flush a folder's entries (the names of files created or renamed in it) to disk; without it a
/// crash can lose a renamed `CURRENT` or a new generation's files even though each was synced.
fn sync_dir(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io_at(path))
}

/// The one writer of corpus `name`: an exclusive lock on `NAME/.lock` held while a generation is
/// written, so `triage ingest` and a running server (or two ingests) never both write `gen-N+1`.
/// The OS drops it when its holder exits, also on `kill -9`.
#[derive(Debug)]
struct WriterLock {
    _file: std::fs::File,
}

impl WriterLock {
    fn take(dir: &Path, name: &str) -> Result<Self> {
        let path = dir.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_at(&path))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(RetrievalError::Busy(name.to_string())),
            Err(std::fs::TryLockError::Error(e)) => Err(io_at(&path)(e)),
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(io_at(path))?;
    f.write_all(bytes).map_err(io_at(path))?;
    f.sync_all().map_err(io_at(path))
}

/// A generation's files (vectors, HNSW graph, BM25 index, then the manifest), every name on
/// disk before `CURRENT` may point at it.
fn write_generation(
    gen_dir: &Path,
    manifest: &Manifest,
    vectors: &[Vec<f32>],
    manifest_json: &[u8],
) -> Result<()> {
    write_synced(&gen_dir.join("vectors.bin"), &vectors_to_bytes(vectors))?;
    write_synced(
        &gen_dir.join("hnsw.bin"),
        &HnswIndex::build(vectors).to_bytes()?,
    )?;
    let bm25_dir = gen_dir.join("bm25");
    std::fs::create_dir_all(&bm25_dir).map_err(io_at(&bm25_dir))?;
    Bm25Index::build(
        &bm25_dir,
        manifest
            .chunks
            .iter()
            .map(|c| (c.id.as_str(), c.text.as_str())),
    )?;
    write_synced(&gen_dir.join("manifest.json"), manifest_json)?;
    sync_dir(&bm25_dir)?;
    sync_dir(gen_dir)
}

fn vectors_to_bytes(vectors: &[Vec<f32>]) -> Vec<u8> {
    vectors
        .iter()
        .flatten()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

fn vectors_from_bytes(bytes: &[u8], dim: usize) -> Option<Vec<Vec<f32>>> {
    if dim == 0 || !bytes.len().is_multiple_of(4 * dim) {
        return None;
    }
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Some(floats.chunks_exact(dim).map(<[f32]>::to_vec).collect())
}

impl CorpusStore {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            root: data_dir.join("corpora"),
        }
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Names of the corpora that have a live generation.
    pub fn list(&self) -> Result<Vec<String>> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Ok(Vec::new());
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("CURRENT").exists())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    fn current(&self, name: &str) -> Result<Option<PathBuf>> {
        let pointer = self.dir(name).join("CURRENT");
        match std::fs::read_to_string(&pointer) {
            Ok(generation) => Ok(Some(self.dir(name).join(generation.trim()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_at(&pointer)(e)),
        }
    }

    /// The number of the live generation of `name` (`None` when it has none): one small read,
    /// cheap enough to ask before every question whether another writer moved it on.
    pub fn live_generation(&self, name: &str) -> Result<Option<u64>> {
        check_name(name)?;
        Ok(self.current(name)?.as_deref().and_then(generation_number))
    }

    /// Open the live generation of `name`.
    pub fn open(&self, name: &str) -> Result<Corpus> {
        check_name(name)?;
        let dir = self
            .current(name)?
            .ok_or_else(|| RetrievalError::UnknownCorpus(name.to_string()))?;
        let damaged = |message: String| RetrievalError::Damaged {
            name: name.to_string(),
            message,
        };
        let manifest_path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&manifest_path).map_err(io_at(&manifest_path))?;
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| damaged(format!("manifest: {e}")))?;
        if manifest.format != FORMAT {
            return Err(damaged(format!("unknown format {:?}", manifest.format)));
        }
        let vectors_path = dir.join("vectors.bin");
        let bytes = std::fs::read(&vectors_path).map_err(io_at(&vectors_path))?;
        let vectors = vectors_from_bytes(&bytes, manifest.dim)
            .filter(|v| v.len() == manifest.chunks.len())
            .ok_or_else(|| damaged("vectors.bin does not match the manifest".into()))?;
        let hnsw_path = dir.join("hnsw.bin");
        let hnsw = HnswIndex::from_bytes(&std::fs::read(&hnsw_path).map_err(io_at(&hnsw_path))?)?;
        let bm25 = Bm25Index::open(&dir.join("bm25"))?;
        let by_id = manifest
            .chunks
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), i))
            .collect();
        Ok(Corpus {
            name: name.to_string(),
            generation: generation_number(&dir)
                .ok_or_else(|| damaged(format!("{} is not a generation", dir.display())))?,
            manifest,
            by_id,
            vectors,
            hnsw,
            bm25,
        })
    }

    /// Delete corpus `name` whole (refused while another writer holds it). Its folder is
    /// renamed away first, so it vanishes at once even if removing the files is interrupted.
    pub fn delete(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let dir = self.dir(name);
        if self.current(name)?.is_none() {
            return Err(RetrievalError::UnknownCorpus(name.to_string()));
        }
        let writer = WriterLock::take(&dir, name)?;
        let doomed = self
            .root
            .join(format!(".deleted-{name}-{}", std::process::id()));
        std::fs::rename(&dir, &doomed).map_err(io_at(&dir))?;
        drop(writer);
        sync_dir(&self.root)?;
        std::fs::remove_dir_all(&doomed).map_err(io_at(&doomed))
    }

    /// Add or replace `docs` and drop `delete` (document ids) in corpus `name`, creating it if
    /// needed. Unchanged documents keep their chunks and vectors.
    pub fn ingest(
        &self,
        name: &str,
        docs: &[Document],
        delete: &[String],
        embedder: &dyn Embedder,
        tokens: &dyn TokenOffsets,
        chunker: ChunkerConfig,
    ) -> Result<IngestReport> {
        check_name(name)?;
        let dir = self.dir(name);
        std::fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        let _writer = WriterLock::take(&dir, name)?;
        let old = match self.current(name)? {
            Some(_) => Some(self.open(name)?),
            None => None,
        };
        let (generation, gen_dir) = self.claim_generation(&dir, name)?;
        let (manifest, vectors, report) =
            assemble::assemble(old.as_ref(), docs, delete, embedder, tokens, chunker)?;
        let json =
            serde_json::to_vec(&manifest).map_err(|e| RetrievalError::Index(e.to_string()))?;
        if let Some(old) = &old {
            let old_json = serde_json::to_vec(&old.manifest)
                .map_err(|e| RetrievalError::Index(e.to_string()))?;
            if old_json == json {
                // Nothing changed: keep the live generation instead of rebuilding its indexes.
                std::fs::remove_dir_all(&gen_dir).map_err(io_at(&gen_dir))?;
                return Ok(report);
            }
        }
        write_generation(&gen_dir, &manifest, &vectors, &json)?;
        // The switch: one rename, itself made durable.
        let tmp = dir.join("CURRENT.tmp");
        write_synced(&tmp, generation.as_bytes())?;
        let pointer = dir.join("CURRENT");
        std::fs::rename(&tmp, &pointer).map_err(io_at(&pointer))?;
        sync_dir(&dir)?;
        self.remove_stale_generations(&dir, &generation);
        Ok(report)
    }

    /// The next generation's name and its empty folder. Claimed before anything is built: a
    /// crash from here on leaves only this folder behind.
    fn claim_generation(&self, dir: &Path, name: &str) -> Result<(String, PathBuf)> {
        let live = self.current(name)?;
        let number = live.as_deref().and_then(generation_number).unwrap_or(0) + 1;
        let generation = format!("gen-{number:06}");
        let gen_dir = dir.join(&generation);
        if gen_dir.exists() {
            std::fs::remove_dir_all(&gen_dir).map_err(io_at(&gen_dir))?;
        }
        std::fs::create_dir_all(&gen_dir).map_err(io_at(&gen_dir))?;
        Ok((generation, gen_dir))
    }

    fn remove_stale_generations(&self, dir: &Path, live: &str) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("gen-") && name != live {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

impl Corpus {
    pub fn num_documents(&self) -> usize {
        self.manifest.documents.len()
    }

    pub fn chunks(&self) -> &[Chunk] {
        &self.manifest.chunks
    }

    pub fn vectors(&self) -> &[Vec<f32>] {
        &self.vectors
    }

    /// How its documents were chunked (a change must chunk new ones the same way).
    pub fn chunker(&self) -> ChunkerConfig {
        self.manifest.chunker
    }

    /// The embedder this corpus was built with (queries must use the same).
    pub fn embedder_id(&self) -> &str {
        &self.manifest.embedder
    }

    /// Search with `query` text (BM25) and its embedding (dense; needed unless the mode is
    /// BM25), on the embedded indexes.
    pub fn search(
        &self,
        query: &str,
        query_vector: Option<&[f32]>,
        options: &SearchOptions,
    ) -> Result<Vec<Hit>> {
        self.search_with(self, query, query_vector, options)
    }

    /// Search ranked by `backend` (which must hold this corpus's chunks); hits carry the chunks
    /// from this corpus's manifest. Ids the manifest lacks (a backend not yet synced) are skipped.
    pub fn search_with(
        &self,
        backend: &dyn SearchBackend,
        query: &str,
        query_vector: Option<&[f32]>,
        options: &SearchOptions,
    ) -> Result<Vec<Hit>> {
        let n = options.candidates.max(options.k);
        let vector = || match query_vector {
            Some(q) if q.len() == self.manifest.dim => Ok(q),
            _ => Err(RetrievalError::Invalid(format!(
                "dense search needs a query vector of width {}",
                self.manifest.dim
            ))),
        };
        let ranking = match options.mode {
            SearchMode::Dense => {
                let dense = backend.dense(vector()?, n, options.exact)?;
                HybridRanking {
                    fused: dense.clone(),
                    dense,
                    bm25: Vec::new(),
                }
            }
            SearchMode::Bm25 => {
                let bm25 = backend.bm25(query, n)?;
                HybridRanking {
                    fused: bm25.clone(),
                    dense: Vec::new(),
                    bm25,
                }
            }
            SearchMode::Hybrid => {
                backend.hybrid(query, vector()?, n, options.rrf_k, options.exact)?
            }
        };
        let ranks = |arm: &Ranked| -> HashMap<String, (usize, f32)> {
            arm.iter()
                .enumerate()
                .map(|(i, (id, score))| (id.clone(), (i + 1, *score)))
                .collect()
        };
        let (dense, bm25) = (ranks(&ranking.dense), ranks(&ranking.bm25));
        Ok(ranking
            .fused
            .into_iter()
            .filter_map(|(id, score)| {
                let chunk = self.manifest.chunks.get(*self.by_id.get(&id)?)?.clone();
                Some(Hit {
                    score,
                    dense_rank: dense.get(&id).map(|r| r.0),
                    dense_score: dense.get(&id).map(|r| r.1),
                    bm25_rank: bm25.get(&id).map(|r| r.0),
                    pseudo_rank: None,
                    chunk,
                })
            })
            .take(options.k)
            .collect())
    }

    /// Dual-path search: `options.candidates` dense candidates for the question and as many for
    /// a pseudo-passage answering it, pooled and ranked by joint similarity (`dual_path`).
    pub fn search_dual(
        &self,
        question_vector: &[f32],
        passage_vector: &[f32],
        options: &SearchOptions,
    ) -> Result<Vec<Hit>> {
        for v in [question_vector, passage_vector] {
            if v.len() != self.manifest.dim {
                return Err(RetrievalError::Invalid(format!(
                    "dual-path search needs vectors of width {}, got {}",
                    self.manifest.dim,
                    v.len()
                )));
            }
        }
        let n = options.candidates.max(options.k);
        let arm = |v: &[f32]| {
            if options.exact {
                exact_search(&self.vectors, v, n)
            } else {
                self.hnsw.search(&self.vectors, v, n)
            }
        };
        let (question_arm, passage_arm) = (arm(question_vector), arm(passage_vector));
        let selected = select_dual(
            &question_arm,
            &passage_arm,
            &self.vectors,
            question_vector,
            passage_vector,
            options.k,
        );
        Ok(selected
            .into_iter()
            .filter_map(|c| {
                Some(Hit {
                    chunk: self.manifest.chunks.get(c.index)?.clone(),
                    score: c.score,
                    dense_rank: c.question_rank,
                    dense_score: Some(c.question_similarity),
                    bm25_rank: None,
                    pseudo_rank: c.passage_rank,
                })
            })
            .collect())
    }
}

impl SearchBackend for Corpus {
    fn dense(&self, vector: &[f32], n: usize, exact: bool) -> Result<Ranked> {
        let hits = if exact {
            exact_search(&self.vectors, vector, n)
        } else {
            self.hnsw.search(&self.vectors, vector, n)
        };
        Ok(hits
            .into_iter()
            .filter_map(|h| Some((self.manifest.chunks.get(h.index)?.id.clone(), h.score)))
            .collect())
    }

    fn bm25(&self, query: &str, n: usize) -> Result<Ranked> {
        Ok(self
            .bm25
            .search(query, n)?
            .into_iter()
            .map(|h| (h.id, h.score))
            .collect())
    }

    fn hybrid(
        &self,
        query: &str,
        vector: &[f32],
        candidates: usize,
        rrf_k: f32,
        exact: bool,
    ) -> Result<HybridRanking> {
        let dense = self.dense(vector, candidates, exact)?;
        let bm25 = SearchBackend::bm25(self, query, candidates)?;
        let ids = |arm: &Ranked| arm.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>();
        let fused = reciprocal_rank_fusion(&[ids(&dense), ids(&bm25)], rrf_k)
            .into_iter()
            .map(|f| (f.id, f.score))
            .collect();
        Ok(HybridRanking { fused, dense, bm25 })
    }
}
