//! The `triage` binary end to end on tiny models: `generate --json` output shape, `serve` up and
//! down on SIGTERM, bad input giving a clear error and a non-zero exit, never a panic, and the int8
//! kernels (`TRIAGE_Q8_KERNEL`) agreeing token for token, and Hub ids fetched from a local Hub.

use std::process::{Command, Output};

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use triage_fetch::hub::testing::{FakeRepo, LocalHub};
use triage_models::config::Architecture;
use triage_models::fixtures::{write_tiny_gguf, write_tiny_safetensors, TinySpec, TINY_VOCAB};

fn triage(args: &[&str]) -> Output {
    triage_env(args, &[])
}

fn triage_env(args: &[&str], env: &[(&str, &std::path::Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage"));
    let home = std::env::temp_dir().join("triage-cli-test-home");
    cmd.args(args).env("TRIAGE_HOME", home);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run triage")
}

fn tiny(dir: &tempfile::TempDir) -> String {
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::new(Architecture::Qwen2), GgmlDType::Q8_0).unwrap();
    path.to_string_lossy().into_owned()
}

fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
}

#[test]
fn generate_json_has_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(&dir);
    let out = triage(&[
        "generate",
        "--model",
        &model,
        "--prompt",
        "the heat",
        "--max-tokens",
        "7",
        "--ignore-eos",
        "--seed",
        "3",
        "--temperature",
        "0.8",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["completion_tokens"], 7);
    assert_eq!(v["prompt_tokens"], 6, "'the heat' is t,he,Ġ,he,a,t");
    let tokens = v["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 7);
    for t in tokens {
        assert!(t["id"].is_u64() && t["text"].is_string());
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
        assert!(t["entropy"].as_f64().unwrap() >= 0.0);
    }
    let mean: f64 = tokens
        .iter()
        .map(|t| t["entropy"].as_f64().unwrap())
        .sum::<f64>()
        / 7.0;
    assert!((v["mean_entropy"]["value"].as_f64().unwrap() - mean).abs() < 1e-4);
    assert_eq!(v["mean_entropy"]["unit"], "nats");
    assert_eq!(v["mean_entropy"]["window"], 30);
    assert!(v["timings"]["prefill_ms"].as_f64().unwrap() > 0.0);
    assert!(v["timings"]["decode_ms"].is_number());
    assert!(v["text"].is_string());
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(&dir);
    let truncated = dir.path().join("cut.gguf");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let truncated = truncated.to_string_lossy().into_owned();
    let long_prompt = "x ".repeat(600); // the tiny model's context is 512
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "generate",
                "--model",
                "/no/such/model.gguf",
                "--prompt",
                "hi",
            ],
            "no model",
        ),
        (
            vec![
                "generate",
                "--model",
                "qwen2.5-coder-0.5b",
                "--prompt",
                "hi",
            ],
            "triage models fetch",
        ),
        (
            vec!["generate", "--model", &truncated, "--prompt", "hi"],
            "truncated",
        ),
        (
            vec!["generate", "--model", &model, "--prompt", &long_prompt],
            "exceeds the context length",
        ),
        (
            vec![
                "generate",
                "--model",
                &model,
                "--prompt",
                "hi",
                "--temperature",
                "-1",
            ],
            "temperature",
        ),
        (
            vec![
                "generate", "--model", &model, "--prompt", "hi", "--top-p", "1.5",
            ],
            "top_p",
        ),
        (
            vec![
                "generate",
                "--model",
                &model,
                "--prompt",
                "hi",
                "--max-tokens",
                "0",
            ],
            "max_tokens",
        ),
        (vec!["generate", "--model", &model], "--prompt"),
        (
            vec!["eval", "--suite", "trivia", "--out", "/tmp/x"],
            "unknown suite \"trivia\"",
        ),
        (
            vec![
                "eval",
                "--suite",
                "passkey",
                "--out",
                "/tmp/x",
                "--systems",
                "rag,psychic",
            ],
            "unknown system \"psychic\"",
        ),
        (
            vec![
                "eval", "--suite", "passkey", "--out", "/tmp/x", "--split", "train",
            ],
            "dev or test",
        ),
        (vec!["eval", "--suite", "passkey"], "--out"),
        (
            vec![
                "eval", "--suite", "passkey", "--out", "/tmp/x", "--export", "/tmp/y",
            ],
            "cannot be used with",
        ),
        (
            vec![
                "calibrate",
                "--suite",
                "squad-v2",
                "--out",
                "/tmp/r.toml",
                "--split",
                "test",
            ],
            "dev split only",
        ),
        (
            vec![
                "calibrate",
                "--suite",
                "squad-v2",
                "--out",
                "/tmp/r.toml",
                "--min-accuracy",
                "0.7",
                "--min-retained",
                "0.9",
            ],
            "cannot be used with",
        ),
    ];
    for (args, needle) in cases {
        assert_clean_failure(&triage(&args), needle);
    }
}

#[test]
fn version_names_revision_and_features() {
    let out = triage(&["--version"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("git ") && text.contains("features: cpu"),
        "{text}"
    );
}

#[test]
fn models_in_the_hugging_face_cache_resolve_by_repo_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("models--tiny-org--tiny-repo");
    let snapshot = repo.join("snapshots").join("abc123");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "abc123\n").unwrap();
    write_tiny_gguf(
        &snapshot.join("tiny-q8_0.gguf"),
        &TinySpec::new(Architecture::Llama),
        GgmlDType::Q8_0,
    )
    .unwrap();
    let env = [("HF_HUB_CACHE", dir.path())];
    let args = [
        "generate",
        "--model",
        "tiny-org/tiny-repo/tiny-q8_0.gguf",
        "--prompt",
        "hi",
        "--max-tokens",
        "3",
        "--ignore-eos",
        "--json",
    ];
    let out = triage_env(&args, &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["completion_tokens"], 3);
    let missing = [
        "generate",
        "--model",
        "tiny-org/tiny-repo/other.gguf",
        "--prompt",
        "hi",
    ];
    assert_clean_failure(&triage_env(&missing, &env), "not in the Hugging Face cache");
}

/// `triage` with `HF_*` pointing at a local Hub and a temp cache, and no proxy between them.
fn triage_hub(args: &[&str], hub: &LocalHub, dir: &std::path::Path, offline: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_triage"));
    cmd.args(args)
        .env(
            "TRIAGE_HOME",
            std::env::temp_dir().join("triage-cli-test-home"),
        )
        .env("HF_ENDPOINT", hub.url())
        .env("HF_HOME", dir.join("hf-home"))
        .env("HF_HUB_CACHE", dir.join("hub"))
        .env("HF_HUB_OFFLINE", if offline { "1" } else { "0" })
        .env_remove("HF_TOKEN");
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        cmd.env_remove(var).env_remove(var.to_ascii_lowercase());
    }
    cmd.output().expect("run triage")
}

#[test]
fn models_fetch_takes_hub_ids_and_generate_runs_them_offline() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec::new(Architecture::Qwen2);
    let st = dir.path().join("st");
    write_tiny_safetensors(&st, &spec, DType::F32).unwrap();
    let read = |name: &str| std::fs::read(st.join(name)).unwrap();
    let st_files: Vec<(&str, Vec<u8>)> = ["config.json", "tokenizer.json", "tokenizer_config.json"]
        .into_iter()
        .chain(["model.safetensors"])
        .map(|name| (name, read(name)))
        .collect();
    let gguf = dir.path().join("tiny-Q8_0.gguf");
    write_tiny_gguf(&gguf, &spec, GgmlDType::Q8_0).unwrap();
    let hub = LocalHub::start();
    let refs: Vec<(&str, &[u8])> = st_files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    hub.add(FakeRepo::new("tiny-org/tiny-st", &refs));
    let gguf_bytes = std::fs::read(&gguf).unwrap();
    hub.add(FakeRepo::new(
        "tiny-org/tiny-GGUF",
        &[("README.md", b"tiny"), ("tiny-Q8_0.gguf", &gguf_bytes)],
    ));

    let fetch = [
        "models",
        "fetch",
        "tiny-org/tiny-st",
        "tiny-org/tiny-GGUF:Q8_0",
    ];
    let out = triage_hub(&fetch, &hub, dir.path(), false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("models--tiny-org--tiny-st/snapshots/"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tiny-Q8_0.gguf") && stdout.contains("Fetched"),
        "{stdout}"
    );

    let requests = hub.seen().len();
    for model in ["tiny-org/tiny-st", "tiny-org/tiny-GGUF:Q8_0"] {
        let args = [
            "generate",
            "--model",
            model,
            "--prompt",
            "hi",
            "--max-tokens",
            "3",
        ];
        let args = [&args[..], &["--ignore-eos", "--json"]].concat();
        let out = triage_hub(&args, &hub, dir.path(), true);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{model}: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["completion_tokens"], 3, "{model}");
    }
    let missing = [
        "generate",
        "--model",
        "tiny-org/other:Q8_0",
        "--prompt",
        "hi",
    ];
    assert_clean_failure(
        &triage_hub(&missing, &hub, dir.path(), true),
        "HF_HUB_OFFLINE",
    );
    assert_eq!(hub.seen().len(), requests, "offline runs make no request");
}

#[test]
fn bench_commands_print_their_json_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(&dir);
    let ids_path = dir.path().join("prompt.json");
    let out = triage(&[
        "bench",
        "prefix",
        "--model",
        &model,
        "--prefix-tokens",
        "64",
        "--question-tokens",
        "8",
        "--prompt-ids",
        ids_path.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (cold, cached) = (
        v["cold_ttft_ms"].as_f64().unwrap(),
        v["cached_ttft_ms"].as_f64().unwrap(),
    );
    assert!(cold > 0.0 && cached > 0.0);
    assert!((v["speedup"].as_f64().unwrap() - cold / cached).abs() < 1e-6);
    // The cold prompt, for a peer to run, and the token the engine took from it.
    let ids: Vec<u32> = serde_json::from_slice(&std::fs::read(&ids_path).unwrap()).unwrap();
    assert_eq!(ids.len(), 64 + 8);
    let first = &v["cold_first_token"];
    assert!(first["id"].as_u64().unwrap() < TINY_VOCAB as u64);
    assert!(first["logprob"].as_f64().unwrap() <= 0.0);
    assert!(first["entropy"].as_f64().unwrap() >= 0.0);
    let out = triage(&[
        "bench",
        "decode",
        "--model",
        &model,
        "--concurrency",
        "1,4",
        "--decode-tokens",
        "8",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[1]["concurrency"], 4);
    assert!(results
        .iter()
        .all(|r| r["tokens_per_s"].as_f64().unwrap() > 0.0));
    assert_clean_failure(
        &triage(&["bench", "decode", "--model", &model, "--concurrency", "0"]),
        "positive",
    );
}

/// `bench escalate` on a tiny model with room for a 1k-token corpus: the RAG answer escalates
/// (τ = 0), and the long-context model reads the pinned prefix from its cache, prefilling only
/// the question.
#[test]
fn bench_escalate_hands_the_question_to_the_pinned_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-2k.gguf");
    // Llama's fixture has its own LM head: a Qwen fixture's tied head repeats the prompt's last
    // token ("\n"), an answer without content, which escalates for that reason instead of τ.
    let spec = TinySpec {
        context_length: 2048,
        ..TinySpec::new(Architecture::Llama)
    };
    write_tiny_gguf(&path, &spec, GgmlDType::Q8_0).unwrap();
    let model = path.to_string_lossy().into_owned();
    let out = triage(&[
        "bench",
        "escalate",
        "--model",
        &model,
        "--lc-model",
        &model,
        "--prefix-tokens",
        "1024",
        "--answer-tokens",
        "4",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["escalated"], true, "{v}");
    assert_eq!(v["device"], "cpu");
    assert_eq!(
        v["lc_model"], v["model"],
        "one model played both roles: {v}"
    );
    assert_eq!(v["shared_engine"], true, "{v}");
    assert!(v["handoff_ms"].is_number(), "{v}");
    let field = |name: &str| v[name].as_u64().unwrap();
    let prefix = field("prefix_tokens");
    let reused = field("prefix_blocks_reused");
    let prefilled = field("tokens_prefilled_on_escalation");
    assert!(prefix > 512 && prefix <= 1024, "{v}");
    // Every pinned block came from the cache; the question was all that was computed.
    assert_eq!(field("pinned_tokens"), prefix / 16 * 16, "{v}");
    assert_eq!(reused * field("block_size"), field("pinned_tokens"), "{v}");
    assert!(reused > 0 && prefilled < prefix, "{v}");
    assert_eq!(
        field("lc_cached_tokens") + prefilled,
        field("lc_prompt_tokens")
    );
    // τ decided, mid-answer.
    assert!(v["mean_entropy"].as_f64().unwrap() > v["tau"].as_f64().unwrap());
    assert!(v["reason"].as_str().unwrap().contains("τ"), "{v}");
}

#[test]
fn serve_answers_then_exits_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader, Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_triage"))
        .args(["serve", "--model", &model, "--port", "0"])
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start triage serve");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    while addr.is_none() && stderr.read_line(&mut line).unwrap() > 0 {
        addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .map(str::to_string);
        line.clear();
    }
    let addr = addr.expect("the server logs the address it bound");
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"status\":\"ok\""), "{reply}");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("shutting down"), "{rest}");
    assert!(!rest.contains("panicked"), "{rest}");
}

#[test]
fn serve_refuses_bad_configs_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = triage(&["serve", "--config", "/nonexistent/triage.toml"]);
    assert_clean_failure(&out, "/nonexistent/triage.toml");
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "prot = 8080\n").unwrap();
    let out = triage(&["serve", "--config", config.to_str().unwrap()]);
    assert_clean_failure(&out, "unknown field");
    let out = triage(&["serve", "--model", "/nonexistent/model.gguf", "--port", "0"]);
    assert_clean_failure(&out, "/nonexistent/model.gguf");
}

/// A failed command's exit code says whose fault it was (README "Command line"), so scripts can
/// tell a typo from a crash.
#[test]
fn failures_exit_with_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(&dir);
    let long_prompt = "x ".repeat(600); // the tiny model's context is 512
    let bad_config = dir.path().join("bad.toml");
    std::fs::write(&bad_config, "prot = 8080\n").unwrap();
    let truncated = dir.path().join("cut.gguf");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let cases: Vec<(Vec<&str>, i32)> = vec![
        (
            vec!["generate", "--model", &model, "--prompt", &long_prompt],
            2,
        ),
        (vec!["serve", "--config", bad_config.to_str().unwrap()], 2),
        (
            vec![
                "generate",
                "--model",
                "/no/such/model.gguf",
                "--prompt",
                "hi",
            ],
            3,
        ),
        (
            vec![
                "generate",
                "--model",
                truncated.to_str().unwrap(),
                "--prompt",
                "hi",
            ],
            1,
        ),
    ];
    for (args, code) in cases {
        let out = triage(&args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A binary built without the `cuda` feature (the one CI tests) refuses a GPU by name on every
/// command that takes `--device`, and a malformed device is a usage error; none panics.
#[cfg(not(feature = "cuda"))]
#[test]
fn a_cpu_build_asked_for_cuda_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(&dir);
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!("port = 0\n[[models]]\nname = \"tiny\"\npath = {model:?}\ndevice = \"cuda:0\"\n"),
    )
    .unwrap();
    let without = "without the `cuda` feature";
    for args in [
        vec![
            "generate", "--model", &model, "--prompt", "hi", "--device", "cuda",
        ],
        vec!["bench", "decode", "--model", &model, "--device", "cuda:1"],
        vec!["serve", "--config", config.to_str().unwrap()],
        vec![
            "serve", "--model", &model, "--port", "0", "--device", "cuda",
        ],
    ] {
        assert_clean_failure(&triage(&args), without);
    }
    let out = triage(&[
        "generate", "--model", &model, "--prompt", "hi", "--device", "gpu",
    ]);
    assert_clean_failure(&out, "expected \"cpu\", \"cuda\" or \"cuda:N\"");
}

fn triage_home(home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_triage"))
        .args(args)
        .env("TRIAGE_HOME", home)
        .output()
        .expect("run triage")
}

/// Wait until an ingest has claimed the generation folder `next` (it then holds the corpus).
fn wait_for_writer(next: &std::path::Path) {
    let start = std::time::Instant::now();
    while !next.exists() {
        assert!(
            start.elapsed().as_secs() < 60,
            "the ingest never started writing"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn ingest_then_retrieve_and_a_killed_ingest_leaves_the_previous_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let embedder = dir.path().join("tiny-bert");
    triage_models::bert_fixtures::write_tiny_bert(&embedder, false, 5).unwrap();
    let embedder = embedder.to_str().unwrap();
    let small = dir.path().join("small.jsonl");
    std::fs::write(
        &small,
        "{\"id\": \"a\", \"title\": \"Lava\", \"text\": \"magma erupts as lava from the volcano\"}\n\
         {\"id\": \"b\", \"title\": \"Tides\", \"text\": \"the moon pulls the ocean tides\"}\n",
    )
    .unwrap();
    let out = triage_home(
        &home,
        &[
            "ingest",
            "--corpus",
            "demo",
            "--embedder",
            embedder,
            "--json",
            small.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["added"], 2);
    let retrieve = |mode: &str| {
        let out = triage_home(
            &home,
            &[
                "retrieve",
                "--corpus",
                "demo",
                "volcano lava",
                "--mode",
                mode,
                "--embedder",
                embedder,
                "--json",
                "--k",
                "5",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    for mode in ["dense", "hybrid"] {
        let hits = retrieve(mode);
        assert_eq!(
            hits["hits"].as_array().unwrap().len(),
            2,
            "{mode}: every chunk: {hits}"
        );
    }
    let bm25 = retrieve("bm25");
    assert_eq!(
        bm25["hits"].as_array().unwrap().len(),
        1,
        "only 'a' has the words: {bm25}"
    );
    assert_eq!(bm25["hits"][0]["document"], "a");

    // A big ingest, killed while it embeds: the corpus stays the two-document one.
    let big = dir.path().join("big.jsonl");
    let lines: String = (0..20_000)
        .map(|i| format!("{{\"id\": \"d{i}\", \"text\": \"document number {i} about volcano lava and tides\"}}\n"))
        .collect();
    std::fs::write(&big, lines).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_triage"))
        .args([
            "ingest",
            "--corpus",
            "demo",
            "--embedder",
            embedder,
            big.to_str().unwrap(),
        ])
        .env("TRIAGE_HOME", &home)
        .spawn()
        .unwrap();
    wait_for_writer(&home.join("corpora/demo/gen-000002"));
    std::thread::sleep(std::time::Duration::from_millis(100));
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the ingest was killed before it finished"
    );
    let hits = retrieve("dense");
    assert_eq!(
        hits["hits"].as_array().unwrap().len(),
        2,
        "the previous corpus is live: {hits}"
    );
    // The next ingest works and clears the debris.
    let out = triage_home(
        &home,
        &[
            "ingest",
            "--corpus",
            "demo",
            "--embedder",
            embedder,
            "--delete",
            "b",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(retrieve("dense")["hits"].as_array().unwrap().len(), 1);
    let gens = std::fs::read_dir(home.join("corpora/demo"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("gen-")
        })
        .count();
    assert_eq!(gens, 1);
    let out = triage_home(
        &home,
        &["retrieve", "--corpus", "nope", "x", "--mode", "bm25"],
    );
    assert_clean_failure(&out, "no corpus named \"nope\"");
    let out = triage_home(
        &home,
        &[
            "ingest",
            "--corpus",
            "demo",
            "--embedder",
            embedder,
            "/nonexistent/docs",
        ],
    );
    assert_clean_failure(&out, "/nonexistent/docs");
}

#[test]
fn every_q8_kernel_gives_the_same_greedy_tokens_and_an_unknown_one_is_an_error() {
    // The kernels differ only in speed: a user (or a benchmark) switching them must see the
    // same output token for token.
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(&dir);
    let run = |kernel: &str| {
        let kernel = std::path::Path::new(kernel);
        let out = triage_env(
            &[
                "generate",
                "--model",
                &model,
                "--prompt",
                "the heat",
                "--max-tokens",
                "12",
                "--ignore-eos",
                "--temperature",
                "0",
                "--json",
            ],
            &[("TRIAGE_Q8_KERNEL", kernel)],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    // The portable loop sums in scalar order, so only the SIMD kernels are bit-identical.
    use triage_ops::KernelChoice;
    let best = triage_ops::Q8Kernel::best();
    let reference = run(best.name());
    assert_eq!(reference.len(), 12);
    for &kernel in triage_ops::Q8Kernel::available() {
        if kernel != triage_ops::Q8Kernel::Portable && kernel != best {
            assert_eq!(run(kernel.name()), reference, "{kernel:?}");
        }
    }
    let out = triage_env(
        &["models", "list"],
        &[("TRIAGE_Q8_KERNEL", std::path::Path::new("avx9000"))],
    );
    assert_clean_failure(&out, "TRIAGE_Q8_KERNEL=avx9000: this CPU runs portable");
}

/// `triage ingest` killed (SIGKILL) at random points, 20 times, alternately adding 300 documents
/// and deleting them again: every time the corpus opens and answers, with the documents of
/// before the kill or of after a completed run, never a mix. Then an ingest that holds the
/// corpus makes the engine's own change wait its turn (busy), and the engine's change works
/// once the ingest is done.
#[test]
fn ingests_killed_at_random_points_leave_the_old_or_the_new_corpus() {
    use triage::{AskRequest, Engine, Route};
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let config = triage_host::fixtures::tiny_config(dir.path()).unwrap();
    let embedder = config.pipeline.embedder.clone();
    let write_jsonl = |name: &str, ids: std::ops::Range<usize>| {
        let path = dir.path().join(name);
        let lines: String = ids
            .map(|i| {
                format!(
                    "{{\"id\": \"n{i}\", \"text\": \"note {i} on lava, tides and the moon\"}}\n"
                )
            })
            .collect();
        std::fs::write(&path, lines).unwrap();
        path.to_string_lossy().into_owned()
    };
    let seed = write_jsonl("seed.jsonl", 0..2);
    let more = write_jsonl("more.jsonl", 2..302);
    let deletes: Vec<String> = (2..302).map(|i| format!("n{i}")).collect();
    let ingest_args = |adding: bool| {
        let mut args = vec!["ingest", "--corpus", "demo", "--embedder", &embedder];
        if adding {
            args.push(&more);
        } else {
            for id in &deletes {
                args.extend(["--delete", id.as_str()]);
            }
        }
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let out = triage_home(
        &home,
        &["ingest", "--corpus", "demo", "--embedder", &embedder, &seed],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // How long a whole run takes, to spread the kills over it.
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_triage"))
        .args(ingest_args(true))
        .env("TRIAGE_HOME", &home)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The kill window shrinks to what finished runs took: later runs are warm and can be much
    // faster than this first one, which left most kills landing after the end (3 of 20 once).
    let mut full_run_ms = started.elapsed().as_millis() as u64;
    let engine = Engine::new(config.clone()).unwrap().with_store(&home);
    let mut num_docs = 302;
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let (mut killed, mut finished) = (0, 0);
    for round in 0..20 {
        let adding = num_docs == 2;
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let wait_ms = (state >> 33) % (full_run_ms + full_run_ms / 5);
        let mut child = Command::new(env!("CARGO_BIN_EXE_triage"))
            .args(ingest_args(adding))
            .env("TRIAGE_HOME", &home)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        let _ = child.kill(); // SIGKILL; an error means it had exited already
        if child.wait().unwrap().success() {
            finished += 1;
            // It took at most `wait_ms`.
            full_run_ms = full_run_ms.min(wait_ms.max(1));
        } else {
            killed += 1;
        }
        let loaded = engine.load_corpus("demo").unwrap_or_else(|e| {
            panic!("round {round} (killed after {wait_ms} ms): the corpus does not open: {e}")
        });
        let before = num_docs;
        let after = if adding { 302 } else { 2 };
        assert!(
            loaded.num_documents == before || loaded.num_documents == after,
            "round {round}: {} documents, expected {before} or {after}",
            loaded.num_documents
        );
        num_docs = loaded.num_documents;
        let answer = engine
            .ask(&AskRequest {
                corpus: "demo".into(),
                question: "what pulls the tides".into(),
                route: Route::Rag,
                ..AskRequest::default()
            })
            .unwrap_or_else(|e| panic!("round {round}: the corpus does not answer: {e}"));
        assert!(!answer.decision.stages.is_empty());
    }
    assert!(
        killed >= 5,
        "{killed} of 20 runs were killed mid-way ({finished} finished)"
    );

    // A running ingest holds the corpus: the engine's change is refused as busy meanwhile. A
    // killed run's folder may still be there (the next finished run removes it): clear them,
    // so the next generation's folder appearing means this ingest holds the corpus.
    let live = std::fs::read_to_string(home.join("corpora/demo/CURRENT")).unwrap();
    for entry in std::fs::read_dir(home.join("corpora/demo")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("gen-") && name != live.trim() {
            std::fs::remove_dir_all(&path).unwrap();
        }
    }
    let big = write_jsonl("big.jsonl", 1000..21_000);
    let mut child = Command::new(env!("CARGO_BIN_EXE_triage"))
        .args(["ingest", "--corpus", "demo", "--embedder", &embedder, &big])
        .env("TRIAGE_HOME", &home)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // It holds the corpus once it has claimed the next generation's folder.
    let number: u64 = live.trim().trim_start_matches("gen-").parse().unwrap();
    wait_for_writer(&home.join(format!("corpora/demo/gen-{:06}", number + 1)));
    let doc = triage_retrieval::Document {
        id: "late".into(),
        title: "late".into(),
        text: "a document added by the engine".into(),
    };
    let busy = engine
        .add_documents("demo", std::slice::from_ref(&doc))
        .unwrap_err();
    assert_eq!(busy.kind(), triage::ErrorKind::Overloaded, "{busy}");
    assert!(child.wait().unwrap().success());
    let change = engine.add_documents("demo", &[doc]).unwrap();
    assert_eq!(change.corpus.num_documents, num_docs + 20_000 + 1);
}

/// `triage ingest --wait` killed (SIGKILL) at random points, 8 times, alternately adding 20
/// documents to a small corpus and deleting them again: some kills land while the new
/// generation's long-context prefix is being pinned (or saved). Every time, a restarted engine
/// opens the corpus at a stored generation (before or after, never a mix) and pins its prefix
/// again, and a question forced to long context answers over it.
#[test]
fn ingests_killed_while_pinning_reopen_at_a_stored_generation_and_pin_again() {
    use triage::{AskRequest, Engine, PinStatus, Route};
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let config = triage_host::fixtures::tiny_config(dir.path()).unwrap();
    let embedder = config.pipeline.embedder.clone();
    let model = dir.path().join("tiny.gguf");
    let toml = dir.path().join("tiny.toml");
    std::fs::write(
        &toml,
        format!(
            "[[models]]\nname = \"tiny\"\npath = {:?}\nkv_budget = \"512blocks\"\n\n\
             [pipeline]\nprefix_dir = {:?}\n",
            model.to_string_lossy(),
            dir.path().join("prefixes").to_string_lossy()
        ),
    )
    .unwrap();
    let write_jsonl = |name: &str, ids: std::ops::Range<usize>| {
        let path = dir.path().join(name);
        let lines: String = ids
            .map(|i| format!("{{\"id\": \"n{i}\", \"text\": \"note {i} on tides\"}}\n"))
            .collect();
        std::fs::write(&path, lines).unwrap();
        path.to_string_lossy().into_owned()
    };
    let seed = write_jsonl("seed.jsonl", 0..2);
    let more = write_jsonl("more.jsonl", 2..22);
    let ingest = |extra: Vec<String>| {
        let mut args: Vec<String> = ["ingest", "--corpus", "demo", "--embedder", &embedder]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend([
            "--wait".into(),
            "--config".into(),
            toml.to_string_lossy().into(),
        ]);
        args.extend(extra);
        Command::new(env!("CARGO_BIN_EXE_triage"))
            .args(args)
            .env("TRIAGE_HOME", &home)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let adding = || vec![more.clone()];
    let deleting = || {
        (2..22)
            .flat_map(|i| ["--delete".to_string(), format!("n{i}")])
            .collect::<Vec<_>>()
    };
    let out = ingest(vec![seed.clone()]).wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = std::time::Instant::now();
    let out = ingest(adding()).wait_with_output().unwrap();
    let full_run_ms = started.elapsed().as_millis() as u64;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("long-context prefix pinned"), "{said}");

    let mut num_docs = 22;
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut killed = 0;
    for round in 0..8 {
        let adding_now = num_docs == 2;
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let wait_ms = (state >> 33) % (full_run_ms + full_run_ms / 5);
        let mut child = ingest(if adding_now { adding() } else { deleting() });
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        let _ = child.kill(); // SIGKILL; an error means it had exited already
        if !child.wait().unwrap().success() {
            killed += 1;
        }
        // A restart: a fresh engine over the same store and prefix folder.
        let engine = Engine::new(config.clone()).unwrap().with_store(&home);
        let loaded = engine.load_corpus("demo").unwrap_or_else(|e| {
            panic!("round {round} (killed after {wait_ms} ms): the corpus does not open: {e}")
        });
        let (before, after) = (num_docs, if adding_now { 22 } else { 2 });
        assert!(
            loaded.num_documents == before || loaded.num_documents == after,
            "round {round}: {} documents, expected {before} or {after}",
            loaded.num_documents
        );
        num_docs = loaded.num_documents;
        assert!(
            matches!(loaded.pin, PinStatus::Pinned { .. }),
            "round {round}: the prefix is pinned again: {:?}",
            loaded.pin
        );
        let answer = engine
            .ask(&AskRequest {
                corpus: "demo".into(),
                question: "what are the notes on".into(),
                route: Route::Lc,
                ..AskRequest::default()
            })
            .unwrap_or_else(|e| panic!("round {round}: no long-context answer: {e}"));
        assert_eq!(answer.decision.corpus_generation, loaded.generation);
    }
    assert!(killed >= 3, "{killed} of 8 runs were killed mid-way");
}

/// A `triage eval` run directory of `n` forced-RAG answers on `split`, every third wrong, whose
/// grounding ("not verbatim") tells them apart.
fn rag_run(dir: &std::path::Path, split: &str, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let wrong = i % 3 == 0;
            let signals = serde_json::json!({"mean_entropy": 0.5, "span_mean_entropy": 0.5,
                "max_entropy": 1.0, "mean_nll": 0.3, "mean_top2_margin": 2.0, "declined": false});
            let grounding = serde_json::json!({"verbatim": if wrong { 0.0 } else { 1.0 },
                "chunk_rank": 1.0, "chunk_score": 0.5, "chunk_margin": 0.1,
                "unsupported_words": 0.0});
            let tau = serde_json::json!({"tau": 0.6, "model": "m", "estimator": "full_softmax",
                "unit": "nats", "window": 30});
            let monitor = serde_json::json!({"tau": tau, "trace": [], "in_answer_span": [],
                "mean": 0.5, "decided_at": null, "decision": "accept", "signals": signals,
                "grounding": grounding, "combined_p_wrong": null, "combined_threshold": null,
                "rag_answer": ""});
            let decision = serde_json::json!({"path": "rag", "reason": "", "forced": true,
                "estimated_costs": {}, "classifier": null, "gate": null, "retrieval": null,
                "monitor": monitor, "stages": [], "cost": 0.0});
            let score = serde_json::json!({"value": if wrong { 0.0 } else { 1.0 },
                "correct": !wrong, "em": null, "f1": null});
            serde_json::json!({"suite": "squad-v2", "split": split, "system": "rag",
                "group": format!("g{}", i % 5), "example": format!("e{i}"), "question": "q?",
                "kind": null, "depth": null, "golds": ["x"],
                "answer": if wrong { "y" } else { "x" }, "score": score, "path": "rag",
                "escalated": false, "prompt_tokens": 100, "cached_tokens": 0,
                "completion_tokens": 4, "stages": [], "cost": 0.0, "ms": 1.0,
                "rag_statistic": 0.5, "rag_mean_entropy": 0.5, "decision": decision})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("results.jsonl"), lines.join("\n") + "\n").unwrap();
}

#[test]
fn signals_studies_eval_runs_and_refuses_to_fit_on_test() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, test) = (dir.path().join("dev"), dir.path().join("test"));
    rag_run(&dev, "dev", 30);
    rag_run(&test, "test", 15);
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let out = triage(&[
        "signals",
        "--train",
        &s(&dev),
        "--test",
        &s(&test),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let study: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(study["test_answers"], 15);
    let not_verbatim = study["each"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "not_verbatim")
        .unwrap();
    assert_eq!(not_verbatim["auroc"], 1.0);
    assert!(study["combined"].as_f64().unwrap() > 0.95, "{study}");
    assert_clean_failure(
        &triage(&["signals", "--train", &s(&test), "--test", &s(&test)]),
        "fit on dev runs only",
    );
    // Dev runs alone: each of the 5 corpora is scored by what the other 4 fitted.
    let out = triage(&["signals", "--train", &s(&dev)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        md.contains("30 dev answers") && md.contains("each of 5 corpora"),
        "{md}"
    );
    assert_clean_failure(
        &triage(&[
            "signals",
            "--train",
            &s(&dir.path().join("none")),
            "--test",
            &s(&test),
        ]),
        "holds no results.jsonl",
    );
}
