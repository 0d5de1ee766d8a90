//! Three `triage serve` replicas on loopback behind SGLang's model gateway (SMG, the executable
//! `TRIAGE_TEST_SMG` names; `scripts/test` installs it), consistent-hashing on the corpus header,
//! over one shared store (corpora and persisted prefixes), each replica with its own
//! `TRIAGE_HOME`. A writer process ingests the corpus and stops; questions over it stick to one
//! replica, which read the prefix from the store; SSE and the `triage` body field pass through
//! the gateway unchanged; while that replica has requests queued (SMG polls its `/v1/loads`) they
//! spill to another, which reads the prefix from the store too, and come back when the queue
//! empties; a replica stopped with SIGTERM finishes the stream it was sending and the gateway
//! moves the corpus to another replica, which also reads the prefix from the store.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A child process killed, with everything it started, when the test ends however it ends.
struct Proc {
    child: Child,
    name: String,
    /// Waited for already: its pid may belong to another process now.
    exited: bool,
}

impl Proc {
    /// Sends SIGTERM and waits for the exit; true when it exited with status 0.
    fn terminate(mut self) -> bool {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {}", self.name);
        let status = self.child.wait().expect("wait for the replica");
        self.exited = true;
        status.success()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited {
            return;
        }
        // Each child leads its own process group (SMG's launcher leaves a router child behind
        // that outlives a SIGTERM to the launcher).
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// A replica: its process and the address it bound.
struct Replica {
    proc: Proc,
    url: String,
}

/// `triage serve` with `config` under `home`, once it logs the address it bound.
fn start_replica(config: &Path, home: &Path, name: &str) -> Replica {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_triage"))
        .args(["serve", "--config"])
        .arg(config)
        .env("TRIAGE_HOME", home)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("start triage serve");
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let mut line = String::new();
    let mut addr = None;
    while addr.is_none() && stderr.read_line(&mut line).unwrap_or(0) > 0 {
        addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .map(str::to_string);
        line.clear();
    }
    let addr = addr.unwrap_or_else(|| panic!("{name} logged no address"));
    // Keep draining its log so that it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    Replica {
        proc: Proc {
            child,
            name: name.to_string(),
            exited: false,
        },
        url: format!("http://{addr}"),
    }
}

/// A loopback port free now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// SMG over `workers` (each registered under the model `triage`), hashing on the corpus header.
fn start_gateway(smg: &str, dir: &Path, workers: &[&str]) -> (Proc, String) {
    use std::os::unix::process::CommandExt;
    let manifest = dir.join("workers.json");
    let entries: Vec<Value> = workers
        .iter()
        .map(|url| json!({"url": url, "model_id": "triage"}))
        .collect();
    std::fs::write(
        &manifest,
        json!({"version": 1, "workers": entries}).to_string(),
    )
    .unwrap();
    let (port, metrics_port) = (free_port(), free_port());
    let log = std::fs::File::create(dir.join("smg.log")).unwrap();
    let child = Command::new(smg)
        .args(["launch", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--prometheus-host", "127.0.0.1"])
        .args(["--prometheus-port", &metrics_port.to_string()])
        .args(["--discovery-provider", "file", "--discovery-file"])
        .arg(&manifest)
        .args(["--policy", "consistent_hashing"])
        .args(["--routing-key-headers", "x-triage-corpus"])
        // Spill: poll every replica's `/v1/loads` each second, and leave one with a request
        // queued out of the ring while another has none (token usage alone never spills here).
        .args(["--load-monitor-interval", "1"])
        .args(["--worker-overload-waiting-requests", "1"])
        .args(["--worker-overload-token-usage", "1.0"])
        .args(["--health-check-interval-secs", "1"])
        .args(["--health-failure-threshold", "1"])
        .args(["--health-check-timeout-secs", "1"])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("start {smg}: {e}"));
    let gateway = Proc {
        child,
        name: "smg".into(),
        exited: false,
    };
    let url = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    loop {
        let ready = http()
            .get(format!("{url}/workers"))
            .send()
            .ok()
            .and_then(|r| r.json::<Value>().ok())
            .map(|w| {
                w["workers"]
                    .as_array()
                    .map(|ws| ws.iter().filter(|w| w["status"] == "ready").count())
                    .unwrap_or(0)
            });
        if ready == Some(workers.len()) {
            return (gateway, url);
        }
        let log = std::fs::read_to_string(dir.join("smg.log")).unwrap_or_default();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "SMG did not register {} workers in 60 s: {ready:?} ready\n{log}",
            workers.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// The serve config of every replica: tiny models, the store and the prefixes in `store`.
fn write_config(dir: &Path, store: &Path) -> PathBuf {
    let base = triage_host::fixtures::tiny_config(dir).unwrap();
    // `tiny_config` wrote the model playing every role there.
    let model = dir.join("tiny.gguf").to_string_lossy().into_owned();
    let config = dir.join("serve.toml");
    let text = format!(
        "port = 0\n\
         [[models]]\nname = \"tiny\"\npath = {model:?}\nrole = \"base\"\nkv_budget = \"512blocks\"\n\
         max_num_seqs = 1\n\
         [pipeline]\nembedder = {embedder:?}\ndata_dir = {data:?}\nprefix_dir = {prefixes:?}\n\
         [routing]\nrag_max_tokens = 8\nlc_max_tokens = 4\n",
        embedder = base.pipeline.embedder,
        data = store.to_string_lossy(),
        prefixes = store.join("prefixes").to_string_lossy(),
    );
    std::fs::write(&config, text).unwrap();
    config
}

fn documents() -> Value {
    (0..6)
        .map(|i| {
            json!({"id": format!("d{i}"), "title": format!("doc {i}"),
                   "text": format!("the cat sat on mat {i} and the dog ran to the park {i}")})
        })
        .collect()
}

/// A routed question over `docs` forced to long context, whose prefix shows as cached tokens.
fn question(stream: bool) -> Value {
    json!({
        "model": "triage",
        "messages": [{"role": "user", "content": "where did the dog run"}],
        "stream": stream,
        "triage": {"corpus": "docs", "route": "lc"},
    })
}

/// POSTs `body` to `url` with the corpus header; returns the status, the replica SMG chose (its
/// `x-smg-routed-worker-id`, absent when sent to a replica directly), the corpus header of the
/// response and the body.
fn ask(url: &str, body: &Value) -> (u16, Option<String>, Option<String>, String) {
    let response = http()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-triage-corpus", "docs")
        .json(body)
        .send()
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (worker, corpus) = (header("x-smg-routed-worker-id"), header("x-triage-corpus"));
    let status = response.status().as_u16();
    (status, worker, corpus, response.text().unwrap())
}

/// Corpus `name` as `url` reports it once its prefix's pin has ended (a change returns before
/// it).
fn wait_pinned(url: &str, name: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let corpus: Value = http()
            .get(format!("{url}/v1/corpora/{name}"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        if corpus["pin"]["state"] != "pinning" {
            return corpus;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still pinning: {corpus}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The `pinned_from` of corpus `docs` as `url` reports it.
fn pinned_from(url: &str) -> Value {
    let list: Value = http()
        .get(format!("{url}/v1/corpora"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let docs = list["data"]
        .as_array()
        .and_then(|d| d.iter().find(|c| c["name"] == "docs").cloned());
    docs.map(|d| d["pinned_from"].clone())
        .unwrap_or(Value::Null)
}

/// The queued requests of the replica at `url` as SMG last polled them (its `/workers` list).
fn waiting_seen_by_gateway(gateway: &str, url: &str) -> Option<u64> {
    let list: Value = http()
        .get(format!("{gateway}/workers"))
        .send()
        .ok()?
        .json()
        .ok()?;
    let worker = list["workers"]
        .as_array()?
        .iter()
        .find(|w| w["url"].as_str().map(|u| u.trim_end_matches('/')) == Some(url))?;
    worker["engine_load"]["loads"][0]["num_waiting_reqs"].as_u64()
}

/// Waits until SMG has seen the replica at `url` with a queue `want` accepts; panics after 30 s.
fn wait_for_gateway_view(gateway: &str, url: &str, want: impl Fn(u64) -> bool) {
    let start = Instant::now();
    loop {
        let seen = waiting_seen_by_gateway(gateway, url);
        if seen.is_some_and(&want) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "SMG never saw that queue at {url}: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A streamed answer of `tiny` to `content`, exactly `max_tokens` long, sent to the replica at
/// `url` directly; opened (status 200, headers read), not read.
fn open_stream(url: &str, content: &str, max_tokens: usize) -> reqwest::blocking::Response {
    let body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "ignore_eos": true, "stream": true,
    });
    let response = http()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    response
}

/// The prompt tokens an answer found in the prefix cache.
fn cached_tokens(body: &Value) -> u64 {
    body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
fn sse_events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// What a streamed answer says, without the fields that differ per request (ids, times).
fn stream_content(body: &str) -> (String, Value) {
    let events = sse_events(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    let mut text = String::new();
    let mut record = Value::Null;
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).unwrap_or_else(|e| panic!("{e}: {event}"));
        if let Some(t) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if !chunk["triage"].is_null() {
            record = chunk["triage"]["route"]["path"].clone();
        }
    }
    (text, record)
}

#[test]
fn replicas_behind_smg_stick_to_the_corpus_and_share_its_prefix() {
    let smg = std::env::var("TRIAGE_TEST_SMG").expect(
        "TRIAGE_TEST_SMG must name SMG's `smg` executable: run the tests with scripts/test",
    );
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let config = write_config(dir.path(), &store);
    let home = |name: &str| dir.path().join(name);

    // One writer ingests (and pins and persists the prefix), then stops.
    let writer = start_replica(&config, &home("writer"), "writer");
    let created: Value = http()
        .post(format!("{}/v1/corpora", writer.url))
        .json(&json!({"name": "docs", "documents": documents()}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let pinned = wait_pinned(&writer.url, "docs");
    assert_eq!(pinned["pin"]["from"], "computed", "{pinned}");
    let prefix = created["result"]["corpus"]["prefix_tokens"]
        .as_u64()
        .expect("the corpus has a long-context prefix");
    assert!(
        writer.proc.terminate(),
        "the writer exits cleanly on SIGTERM"
    );

    let replicas: Vec<Replica> = (0..3)
        .map(|i| {
            start_replica(
                &config,
                &home(&format!("replica{i}")),
                &format!("replica{i}"),
            )
        })
        .collect();
    let urls: Vec<&str> = replicas.iter().map(|r| r.url.as_str()).collect();
    let (_gateway, gateway) = start_gateway(&smg, dir.path(), &urls);

    // Questions over one corpus stick to one replica, which read the prefix from the store.
    let mut chosen = BTreeSet::new();
    for i in 0..4 {
        let (status, worker, corpus, body) = ask(&gateway, &question(false));
        assert_eq!(status, 200, "question {i}: {body}");
        assert_eq!(
            corpus.as_deref(),
            Some("docs@1"),
            "the response header passes back"
        );
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["triage"]["route"]["path"], "lc", "{body}");
        let cached = cached_tokens(&body);
        // Block size 16: every whole block of the prefix is pinned, from the first question on.
        assert!(
            cached >= prefix / 16 * 16,
            "question {i}: {cached} of {prefix} cached"
        );
        chosen.insert(worker.expect("SMG names the replica it chose"));
    }
    assert_eq!(chosen.len(), 1, "one corpus, one replica: {chosen:?}");
    let owner_url = chosen.pop_first().unwrap();
    let owner = replicas
        .iter()
        .position(|r| owner_url.trim_end_matches('/') == r.url)
        .unwrap_or_else(|| panic!("{owner_url} is none of {urls:?}"));
    assert_eq!(pinned_from(&replicas[owner].url), "disk");

    // SSE and the `triage` body field pass through unchanged: the same stream as sent directly.
    let (status, _, _, through) = ask(&gateway, &question(true));
    assert_eq!(status, 200, "{through}");
    let (_, _, _, direct) = ask(&replicas[owner].url, &question(true));
    let (text, path) = stream_content(&through);
    assert_eq!((text.clone(), path.clone()), stream_content(&direct));
    assert_eq!(path, "lc", "the decision record rides in the last chunk");

    // Under load the owner's questions spill to another replica, which reads the prefix from
    // the store; once the load is gone they come back to the owner.
    let owner_url = replicas[owner].url.clone();
    // One answer takes about 2 s here (3,000 tokens); four queued behind it keep the queue
    // non-empty for several of SMG's 1 s polls, however slow the machine.
    let held: Vec<_> = (0..5)
        .map(|i| open_stream(&owner_url, &format!("hold {i}"), 3000))
        .collect();
    wait_for_gateway_view(&gateway, &owner_url, |waiting| waiting >= 1);
    let (status, worker, _, body) = ask(&gateway, &question(false));
    assert_eq!(status, 200, "{body}");
    let spilled = worker.expect("SMG names the replica");
    let spilled = spilled.trim_end_matches('/');
    assert_ne!(spilled, owner_url, "a busy owner's question spills");
    let body: Value = serde_json::from_str(&body).unwrap();
    let cached = cached_tokens(&body);
    assert!(
        cached >= prefix / 16 * 16,
        "spilled: {cached} of {prefix} cached"
    );
    assert_eq!(
        pinned_from(spilled),
        "disk",
        "the spilled replica read the store"
    );
    drop(held);
    wait_for_gateway_view(&gateway, &owner_url, |waiting| waiting == 0);
    let (status, worker, _, body) = ask(&gateway, &question(false));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        worker.as_deref().map(|w| w.trim_end_matches('/')),
        Some(owner_url.as_str()),
        "the corpus comes back to its owner"
    );

    // SIGTERM while the owner streams a long answer: the stream ends whole.
    let mut reader = BufReader::new(open_stream(&owner_url, "count", 512));
    let mut first = String::new();
    while !first.starts_with("data: ") {
        first.clear();
        assert!(reader.read_line(&mut first).unwrap() > 0, "no first chunk");
    }
    let mut replicas = replicas;
    let stopped = replicas.remove(owner);
    let exit = std::thread::spawn(move || stopped.proc.terminate());
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let events = sse_events(&format!("{first}{rest}"));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let finish: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["finish_reason"].clone())
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![json!("length")], "all 512 tokens were sent");
    assert!(exit.join().unwrap(), "the owner exits cleanly on SIGTERM");

    // The gateway moves the corpus to another replica, which reads the prefix from the store.
    let start = Instant::now();
    let (worker, body) = loop {
        let (status, worker, _, body) = ask(&gateway, &question(false));
        if status == 200 {
            break (worker, body);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no answer after the owner stopped: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let worker = worker.expect("SMG names the replica");
    assert_ne!(worker.trim_end_matches('/'), owner_url, "{body}");
    let next = replicas
        .iter()
        .find(|r| worker.trim_end_matches('/') == r.url)
        .unwrap_or_else(|| panic!("{worker} is not a live replica"));
    let body: Value = serde_json::from_str(&body).unwrap();
    let cached = cached_tokens(&body);
    assert!(cached >= prefix / 16 * 16, "{cached} of {prefix} cached");
    assert_eq!(pinned_from(&next.url), "disk");
    for replica in replicas {
        assert!(replica.proc.terminate(), "{} exits cleanly", replica.url);
    }
}
