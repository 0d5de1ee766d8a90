//! A local Hugging Face Hub for tests, std only: the listing API and `/{repo}/resolve/{rev}/{file}`
//! with the headers hf-hub and Python's `huggingface_hub` read, `Range` requests, LFS files behind
//! a redirect as on the Hub, and faults to inject (a cut connection, wrong bytes, a gated repo).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use sha1::Sha1;
use sha2::{Digest as _, Sha256};

/// A repo the local Hub serves at one commit (answering `main` and the commit).
#[derive(Debug, Clone)]
pub struct FakeRepo {
    /// `org/repo`.
    pub id: String,
    /// 40 hex digits.
    pub commit: String,
    pub files: Vec<FakeFile>,
    /// When set, `resolve` answers 401 unless sent `Authorization: Bearer <token>` (a gated
    /// repo: its listing stays public, as on the Hub).
    pub token: Option<String>,
}

/// A file of a [`FakeRepo`].
#[derive(Debug, Clone)]
pub struct FakeFile {
    pub name: String,
    pub bytes: Vec<u8>,
    /// Served as the Hub serves LFS files: listed with its sha256, `resolve` redirects to a
    /// CDN path, the sha256 is the `X-Linked-Etag`.
    pub lfs: bool,
}

impl FakeRepo {
    /// `files` as `(name, bytes)`; `.safetensors` and `.gguf` files are LFS files.
    pub fn new(id: &str, files: &[(&str, &[u8])]) -> Self {
        let files = files
            .iter()
            .map(|(name, bytes)| FakeFile {
                name: name.to_string(),
                bytes: bytes.to_vec(),
                lfs: name.ends_with(".safetensors") || name.ends_with(".gguf"),
            })
            .collect();
        Self {
            id: id.to_string(),
            commit: hex(&Sha1::digest(id.as_bytes())),
            files,
            token: None,
        }
    }

    /// The same repo, gated behind `token`.
    pub fn gated(mut self, token: &str) -> Self {
        self.token = Some(token.to_string());
        self
    }

    fn file(&self, name: &str) -> Option<&FakeFile> {
        self.files.iter().find(|f| f.name == name)
    }

    fn listing(&self) -> String {
        let siblings: Vec<serde_json::Value> = self.files.iter().map(FakeFile::sibling).collect();
        serde_json::json!({"id": self.id, "sha": self.commit, "siblings": siblings}).to_string()
    }
}

impl FakeFile {
    /// What the Hub lists as the file's hash: sha256 for LFS files, the git blob id otherwise.
    pub fn etag(&self) -> String {
        if self.lfs {
            sha256_hex(&self.bytes)
        } else {
            git_blob_id(&self.bytes)
        }
    }

    fn sibling(&self) -> serde_json::Value {
        let size = self.bytes.len();
        let mut json = serde_json::json!({"rfilename": self.name, "size": size,
                                          "blobId": git_blob_id(&self.bytes)});
        if self.lfs {
            json["size"] = 134.into();
            json["lfs"] =
                serde_json::json!({"sha256": self.etag(), "size": size, "pointerSize": 134});
        }
        json
    }
}

/// The sha256 of `bytes` in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn git_blob_id(bytes: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()));
    h.update(bytes);
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One request the local Hub answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    /// The request target, as sent.
    pub target: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, FakeRepo>,
    seen: Vec<Seen>,
    /// File name → bytes after which the next transfer of it is cut (once).
    cuts: HashMap<String, usize>,
    /// File names served with a byte flipped (the listing keeps the true hash).
    corrupt: Vec<String>,
}

/// The local Hub on `127.0.0.1`, answering until dropped. LFS files redirect to a second port,
/// as the Hub redirects them to a CDN on another origin (Python follows only same-origin
/// redirects when it asks for metadata).
pub struct LocalHub {
    url: String,
    cdn_url: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl LocalHub {
    /// Listens on two free ports. Panics (it is a test helper) when it cannot.
    pub fn start() -> Self {
        let bind = || TcpListener::bind("127.0.0.1:0").expect("bind the local Hub");
        let (hub, cdn) = (bind(), bind());
        let url_of = |l: &TcpListener| format!("http://{}", l.local_addr().expect("local addr"));
        let (url, cdn_url) = (url_of(&hub), url_of(&cdn));
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [hub, cdn]
            .into_iter()
            .map(|listener| {
                let (state, stop, cdn) = (Arc::clone(&state), Arc::clone(&stop), cdn_url.clone());
                std::thread::spawn(move || accept_loop(listener, state, stop, cdn))
            })
            .collect();
        Self {
            url,
            cdn_url,
            state,
            stop,
            threads,
        }
    }

    /// `http://127.0.0.1:<port>`: the `HF_ENDPOINT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn add(&self, repo: FakeRepo) {
        self.lock().repos.insert(repo.id.clone(), repo);
    }

    /// The next transfer of a file called `name` sends `bytes` bytes of its body, then closes
    /// the connection.
    pub fn cut_after(&self, name: &str, bytes: usize) {
        self.lock().cuts.insert(name.to_string(), bytes);
    }

    /// Files called `name` are served with their first byte flipped.
    pub fn corrupt(&self, name: &str) {
        self.lock().corrupt.push(name.to_string());
    }

    /// Every request so far, to either port, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for LocalHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accepts.
        for url in [&self.url, &self.cdn_url] {
            let _ = TcpStream::connect(url.trim_start_matches("http://"));
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    cdn_url: String,
) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let (state, cdn_url) = (Arc::clone(&state), cdn_url.clone());
        std::thread::spawn(move || {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = handle(stream, &state, &cdn_url);
        });
    }
}

/// A parsed request: method, target, lower-cased headers.
struct Request {
    method: String,
    target: String,
    headers: HashMap<String, String>,
}

fn read_request(stream: &TcpStream) -> std::io::Result<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    Ok(Request {
        method: method.to_string(),
        target: target.to_string(),
        headers,
    })
}

/// What to send back.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Send only this many body bytes, then close.
    cut: Option<usize>,
}

impl Reply {
    fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
            cut: None,
        }
    }

    fn header(mut self, name: &str, value: impl ToString) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

fn handle(mut stream: TcpStream, state: &Mutex<State>, cdn_url: &str) -> std::io::Result<()> {
    let request = read_request(&stream)?;
    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
    state.seen.push(Seen {
        method: request.method.clone(),
        target: request.target.clone(),
        range: request.headers.get("range").cloned(),
        authorization: request.headers.get("authorization").cloned(),
    });
    let reply = route(&request, &mut state, cdn_url);
    drop(state);
    write_reply(&mut stream, &request, reply)
}

fn write_reply(stream: &mut TcpStream, request: &Request, reply: Reply) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        reply.body.len()
    ));
    stream.write_all(head.as_bytes())?;
    if request.method != "HEAD" {
        let sent = reply.cut.unwrap_or(reply.body.len()).min(reply.body.len());
        stream.write_all(&reply.body[..sent])?;
    }
    stream.flush()?;
    // Write only: closing the read side with bytes unread would send a reset.
    stream.shutdown(Shutdown::Write)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Error",
    }
}

fn route(request: &Request, state: &mut State, cdn_url: &str) -> Reply {
    let path = request.target.split('?').next().unwrap_or("");
    let segments: Vec<String> = path.split('/').skip(1).map(percent_decode).collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    match segs.as_slice() {
        ["api", "models", org, name, "revision", rev @ ..] => {
            listing(state, &format!("{org}/{name}"), &rev.join("/"))
        }
        ["cdn", sha] => cdn(request, state, sha),
        [org, name, "resolve", rev, file @ ..] if !file.is_empty() => {
            let repo = format!("{org}/{name}");
            resolve(request, state, cdn_url, &repo, rev, &file.join("/"))
        }
        _ => Reply::new(404, "no such route"),
    }
}

fn not_found(code: &str) -> Reply {
    Reply::new(404, code).header("X-Error-Code", code)
}

/// A repo the Hub does not show: 401, as the Hub answers without a token.
fn repo_not_found() -> Reply {
    Reply::new(401, r#"{"error":"Repository Not Found"}"#).header("X-Error-Code", "RepoNotFound")
}

fn listing(state: &State, repo: &str, rev: &str) -> Reply {
    match state.repos.get(repo) {
        None => repo_not_found(),
        Some(r) if rev != "main" && rev != r.commit => not_found("RevisionNotFound"),
        Some(r) => Reply::new(200, r.listing()).header("Content-Type", "application/json"),
    }
}

fn resolve(
    request: &Request,
    state: &mut State,
    cdn_url: &str,
    repo: &str,
    rev: &str,
    name: &str,
) -> Reply {
    let Some(r) = state.repos.get(repo) else {
        return repo_not_found();
    };
    if let Some(token) = &r.token {
        if request.headers.get("authorization") != Some(&format!("Bearer {token}")) {
            return Reply::new(401, "Access to this model is restricted")
                .header("X-Error-Code", "GatedRepo");
        }
    }
    if rev != "main" && rev != r.commit {
        return not_found("RevisionNotFound");
    }
    let Some(file) = r.file(name).cloned() else {
        return not_found("EntryNotFound");
    };
    let commit = r.commit.clone();
    let etag = format!("\"{}\"", file.etag());
    if file.lfs {
        return Reply::new(302, "")
            .header("Location", format!("{cdn_url}/cdn/{}", file.etag()))
            .header("X-Linked-Etag", &etag)
            .header("X-Linked-Size", file.bytes.len())
            .header("X-Repo-Commit", commit)
            .header("ETag", etag);
    }
    content(request, state, &file)
        .header("ETag", etag)
        .header("X-Repo-Commit", commit)
}

fn cdn(request: &Request, state: &mut State, sha: &str) -> Reply {
    let file = state
        .repos
        .values()
        .flat_map(|r| &r.files)
        .find(|f| f.lfs && f.etag() == sha)
        .cloned();
    match file {
        Some(file) => content(request, state, &file),
        None => Reply::new(404, "no such object"),
    }
}

/// The file's bytes, or the range asked for, with the faults set for it.
fn content(request: &Request, state: &mut State, file: &FakeFile) -> Reply {
    let mut bytes = file.bytes.clone();
    if state.corrupt.contains(&file.name) && !bytes.is_empty() {
        bytes[0] ^= 0xff;
    }
    let total = bytes.len();
    let range = request
        .headers
        .get("range")
        .and_then(|r| parse_range(r, total));
    let mut reply = match range {
        Some((start, _)) if start >= total => {
            return Reply::new(416, "").header("Content-Range", format!("bytes */{total}"))
        }
        Some((start, end)) => Reply::new(206, bytes[start..=end].to_vec())
            .header("Content-Range", format!("bytes {start}-{end}/{total}")),
        None => Reply::new(200, bytes),
    };
    let body_len = reply.body.len();
    if request.method == "GET" {
        if let Some(&cut) = state.cuts.get(&file.name).filter(|&&cut| body_len > cut) {
            state.cuts.remove(&file.name);
            reply.cut = Some(cut);
        }
    }
    reply.header("Accept-Ranges", "bytes")
}

/// `bytes=a-` or `bytes=a-b` → the inclusive range, clamped to the file.
fn parse_range(header: &str, total: usize) -> Option<(usize, usize)> {
    let (start, end) = header.strip_prefix("bytes=")?.split_once('-')?;
    let start: usize = start.trim().parse().ok()?;
    let last = total.saturating_sub(1);
    let end = match end.trim() {
        "" => last,
        end => end.parse::<usize>().ok()?.min(last),
    };
    Some((start, end.max(start.min(last))))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
