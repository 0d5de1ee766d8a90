//! The Milvus backend against a real server: `milvus-lite` (PyPI, installed by `scripts/test`,
//! path in `TRIAGE_MILVUS_LITE`) started on a free loopback port with a temporary data
//! directory. One test, so one server: the backend passes the same conformance checks as the
//! embedded corpus, `sync` is incremental and exact, and a dead address is a clear error.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use triage_milvus::{MilvusBackend, SyncReport};
use triage_retrieval::{
    conformance, ChunkerConfig, CorpusStore, Document, HashingEmbedder, SearchBackend, WordOffsets,
};

const EMBEDDER: HashingEmbedder = HashingEmbedder { dim: 64 };
const CHUNKER: ChunkerConfig = ChunkerConfig {
    max_tokens: 64,
    overlap_tokens: 0,
};

/// A running milvus-lite, interrupted (then killed if it lingers) when dropped.
struct Server {
    child: Child,
    uri: String,
    _data: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        let exe = std::env::var("TRIAGE_MILVUS_LITE").expect(
            "TRIAGE_MILVUS_LITE must name the milvus-lite executable: run the tests with scripts/test",
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = tempfile::tempdir().unwrap();
        let child = Command::new(exe)
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--data-dir")
            .arg(data.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start milvus-lite");
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "milvus-lite did not listen within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            child,
            uri: format!("http://127.0.0.1:{port}"),
            _data: data,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGINT is milvus-lite's clean shutdown; std has no signal API, so ask `kill`.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chunk_ids_of(corpus: &triage_retrieval::Corpus, doc: &str) -> Vec<String> {
    corpus
        .chunks()
        .iter()
        .filter(|c| c.doc_id == doc)
        .map(|c| c.id.clone())
        .collect()
}

#[test]
fn milvus_backend_conforms_syncs_incrementally_and_reports_a_dead_server() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let store = CorpusStore::new(dir.path());
    let docs = conformance::documents();
    store
        .ingest("conf-ormance", &docs, &[], &EMBEDDER, &WordOffsets, CHUNKER)
        .unwrap();
    let corpus = store.open("conf-ormance").unwrap();
    let milvus = MilvusBackend::connect(&server.uri, &corpus).unwrap();
    let report = milvus.sync(&corpus).unwrap();
    assert_eq!(
        report,
        SyncReport {
            inserted: docs.len(),
            deleted: 0,
            total: docs.len()
        }
    );
    conformance::check(&milvus, &corpus, &EMBEDDER).unwrap();
    // Search through the corpus with Milvus ranking: hits carry the manifest's chunks.
    let v = EMBEDDER.vector(conformance::QUERY);
    let options = triage_retrieval::SearchOptions::default();
    let hits = corpus
        .search_with(&milvus, conformance::QUERY, Some(&v), &options)
        .unwrap();
    assert_eq!(hits[0].chunk.doc_id, "both");
    assert!(hits[0].dense_rank.is_some() && hits[0].bm25_rank.is_some());

    // A second sync changes nothing.
    assert_eq!(milvus.sync(&corpus).unwrap().inserted, 0);

    // Delete one document and change another: sync removes and adds exactly those chunks.
    let gone = chunk_ids_of(&corpus, "lava");
    let old_bees = chunk_ids_of(&corpus, "bees");
    let changed = Document {
        id: "bees".into(),
        title: String::new(),
        text: "Bees dance to tell the hive where the lava fields bloom.".into(),
    };
    store
        .ingest(
            "conf-ormance",
            &[changed],
            &["lava".to_string()],
            &EMBEDDER,
            &WordOffsets,
            CHUNKER,
        )
        .unwrap();
    let corpus = store.open("conf-ormance").unwrap();
    let report = milvus.sync(&corpus).unwrap();
    assert_eq!(
        (report.inserted, report.deleted, report.total),
        (1, 2, docs.len() - 1)
    );
    let bm25 = milvus.bm25("lava", 10).unwrap();
    let found: Vec<&str> = bm25.iter().map(|(id, _)| id.as_str()).collect();
    assert!(
        !found.iter().any(|id| gone.contains(&id.to_string())),
        "{found:?}"
    );
    assert!(
        !found.iter().any(|id| old_bees.contains(&id.to_string())),
        "{found:?}"
    );
    assert!(found.contains(&chunk_ids_of(&corpus, "bees")[0].as_str()));
    milvus.drop_collection().unwrap();
    drop(server);

    // Nothing listens on the server's port any more.
    let dead = MilvusBackend::connect("http://127.0.0.1:9", &corpus).unwrap_err();
    assert!(dead.to_string().contains("127.0.0.1:9"), "{dead}");
}
