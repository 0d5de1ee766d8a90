//! What a gateway in front of several `triage serve` replicas relies on: the corpus routing
//! header on requests and responses, the metrics its scheduler scrapes, and the load SMG polls.

mod common;

use common::{sse_data, TestServer, MODEL};
use reqwest::Method;
use serde_json::{json, Value};

const HEADER: &str = "x-triage-corpus";

fn documents(n: usize) -> Value {
    (0..n)
        .map(|i| json!({"id": format!("d{i}"), "text": format!("the dog ran to park {i}")}))
        .collect()
}

/// A chat completion for the pipeline without a `triage` object: the header names the corpus.
fn question() -> Value {
    json!({
        "model": "triage",
        "messages": [{"role": "user", "content": "where did the dog run"}],
        "max_tokens": 3,
    })
}

async fn send(
    server: &TestServer,
    method: Method,
    path: &str,
    header: Option<&str>,
    body: &Value,
) -> (u16, Option<String>, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{}{path}", server.url))
        .json(body);
    if let Some(h) = header {
        request = request.header(HEADER, h);
    }
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    let corpus = r
        .headers()
        .get(HEADER)
        .map(|v| v.to_str().unwrap().to_string());
    (status, corpus, r.json().await.unwrap_or(Value::Null))
}

/// A gateway hashing on `x-triage-corpus` can send a bare question: the header alone names the
/// corpus; every routed response (plain, streamed, `/v1/route`, corpus changes) names the
/// generation that answered, which moves on with each change; a header that disagrees with the
/// body, or is malformed, is a 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corpus_header_routes_requests_and_names_the_generation() {
    let server = TestServer::start_routed(|c| {
        c.routing.lc_max_tokens = 3;
        c.routing.rag_max_tokens = 3;
    })
    .await;
    // The pipeline's alias is a listed model, after the served ones.
    let (_, models) = server.get("/v1/models").await;
    let models: Value = serde_json::from_str(&models).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [MODEL, "triage"]);
    assert_eq!(models["data"][1]["triage"]["role"], "pipeline");

    let body = json!({"name": "docs", "documents": documents(4)});
    let (status, corpus, created) = send(&server, Method::POST, "/v1/corpora", None, &body).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(corpus.as_deref(), Some("docs@1"));
    assert_eq!(created["result"]["corpus"]["generation"], 1);

    // The header alone; a stale generation is only a routing hint.
    for header in ["docs", "docs@7"] {
        let (status, corpus, answer) = send(
            &server,
            Method::POST,
            "/v1/chat/completions",
            Some(header),
            &question(),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(corpus.as_deref(), Some("docs@1"), "{header}");
        assert_eq!(answer["triage"]["route"]["corpus_generation"], 1);
    }
    let mut streamed = question();
    streamed["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .header(HEADER, "docs")
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[HEADER], "docs@1");
    assert_eq!(sse_data(&r.text().await.unwrap()).last().unwrap(), "[DONE]");
    let plan = json!({"question": "where did the dog run"});
    let (status, corpus, planned) =
        send(&server, Method::POST, "/v1/route", Some("docs"), &plan).await;
    assert_eq!(status, 200, "{planned}");
    assert_eq!(corpus.as_deref(), Some("docs@1"));

    // A change is a new generation, and answers say so.
    let more = json!({"documents": documents(5)});
    let path = "/v1/corpora/docs/documents";
    let (status, corpus, _) = send(&server, Method::POST, path, Some("docs"), &more).await;
    assert_eq!((status, corpus.as_deref()), (200, Some("docs@2")));
    let mut both = question();
    both["triage"] = json!({"corpus": "docs"});
    let (status, corpus, _) = send(
        &server,
        Method::POST,
        "/v1/chat/completions",
        Some("docs@1"),
        &both,
    )
    .await;
    assert_eq!((status, corpus.as_deref()), (200, Some("docs@2")));

    // Disagreeing or malformed headers, and no corpus at all.
    let cases = [
        ("/v1/chat/completions", Some("other"), both.clone()),
        ("/v1/chat/completions", Some("docs@x"), question()),
        ("/v1/chat/completions", Some("@2"), question()),
        ("/v1/corpora/docs/documents", Some("other"), more.clone()),
    ];
    for (path, header, body) in cases {
        let (status, _, error) = send(&server, Method::POST, path, header, &body).await;
        assert_eq!(status, 400, "{header:?}: {error}");
        assert_eq!(error["error"]["param"], HEADER, "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }
    let (status, _, error) = send(
        &server,
        Method::POST,
        "/v1/chat/completions",
        None,
        &question(),
    )
    .await;
    assert_eq!(status, 400, "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains(HEADER));
}

/// The value of the sample of `metric` whose labels include every one of `labels`.
fn sample(text: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// What an endpoint picker scrapes (names mapped in `docs/deploy.md`): queue and running
/// requests per model, KV-cache usage as a 0–1 gauge, the cache layout as an info metric with
/// vLLM's label names, and the prefix tokens resident per corpus and generation, which follow
/// the corpus as it changes and go when it is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_what_gateway_schedulers_read() {
    let server = TestServer::start_routed(|_| {}).await;
    let model = format!("model=\"{MODEL}\"");
    let (_, text) = server.get("/metrics").await;
    assert_eq!(
        sample(&text, "triage_requests_waiting", &[&model]),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "triage_requests_running", &[&model]),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "triage_kv_cache_usage_perc", &[&model]),
        Some(0.0)
    );
    // The layout's block count is the pool's (the block size is the test config's 4).
    let total = sample(&text, "triage_kv_blocks_total", &[&model]).unwrap();
    let layout = format!("num_gpu_blocks=\"{total}\"");
    assert_eq!(
        sample(
            &text,
            "triage_cache_config_info",
            &[&model, "block_size=\"4\"", &layout]
        ),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("triage_prefix_tokens_resident{"), "{text}");

    let body = json!({"name": "docs", "documents": documents(4)});
    let (status, _, created) = send(&server, Method::POST, "/v1/corpora", None, &body).await;
    assert_eq!(status, 201, "{created}");
    let prefix = created["result"]["corpus"]["prefix_tokens"]
        .as_f64()
        .unwrap();
    server.pinned_corpus("docs").await;
    let (_, text) = server.get("/metrics").await;
    // Only whole blocks (4 tokens in the test config) are pinned.
    let pinned_blocks = (prefix / 4.0).floor();
    let docs = ["corpus=\"docs\"", "generation=\"1\"", &model];
    assert_eq!(
        sample(&text, "triage_prefix_tokens_resident", &docs),
        Some(pinned_blocks * 4.0)
    );
    let usage = sample(&text, "triage_kv_cache_usage_perc", &[&model]).unwrap();
    assert!(
        (usage - pinned_blocks / total).abs() < 1e-9,
        "{usage} for {pinned_blocks} pinned blocks"
    );

    let more = json!({"documents": documents(6)});
    let path = "/v1/corpora/docs/documents";
    let (status, _, _) = send(&server, Method::POST, path, None, &more).await;
    assert_eq!(status, 200);
    server.pinned_corpus("docs").await;
    let (_, text) = server.get("/metrics").await;
    let gen2 = ["corpus=\"docs\"", "generation=\"2\""];
    assert!(sample(&text, "triage_prefix_tokens_resident", &gen2).unwrap() > prefix);
    assert!(!text.contains("generation=\"1\""), "{text}");

    let (status, _, _) = send(
        &server,
        Method::DELETE,
        "/v1/corpora/docs",
        None,
        &Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    let (_, text) = server.get("/metrics").await;
    assert!(!text.contains("triage_prefix_tokens_resident{"), "{text}");
}

/// `GET /v1/loads` (any query string) as the replica answers it now.
async fn loads(server: &TestServer) -> Value {
    let (status, text) = server
        .get("/v1/loads?include=core,disagg,queues,memory")
        .await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Polls `/v1/loads` until its one rank satisfies `want`; panics after 20 s.
async fn wait_for_load(server: &TestServer, want: impl Fn(&Value) -> bool) -> Value {
    let start = std::time::Instant::now();
    loop {
        let now = loads(server).await;
        if want(&now["loads"][0]) {
            return now;
        }
        assert!(start.elapsed().as_secs() < 20, "load never came: {now}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// What SMG polls to take a busy replica out of its hash ring (`docs/deploy.md`): SGLang's
/// `/v1/loads` shape, one rank, running and waiting requests, and a token usage that leaves out
/// the blocks pinned by corpus prefixes (a replica holding its corpus is not full for that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_report_running_and_waiting_requests_as_sglang_does() {
    let server = TestServer::start_routed(|c| c.models[0].max_num_seqs = 1).await;
    let body = json!({"name": "docs", "documents": documents(4)});
    let (status, _, created) = send(&server, Method::POST, "/v1/corpora", None, &body).await;
    assert_eq!(status, 201, "{created}");
    let idle = loads(&server).await;
    assert_eq!(
        idle,
        json!({"dp_rank_count": 1, "loads": [{"dp_rank": 0, "num_running_reqs": 0,
               "num_waiting_reqs": 0, "token_usage": 0.0}]}),
        "the pinned corpus is not load"
    );

    // One sequence at a time: the first long answer runs, the second waits behind it.
    let long = |content: &str| {
        json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
               "max_tokens": 4000, "ignore_eos": true, "stream": true})
    };
    let running = server.open(&long("hold the slot")).await;
    assert_eq!(running.status(), 200);
    let waiting = server.open(&long("wait behind it")).await;
    assert_eq!(waiting.status(), 200);
    let busy = wait_for_load(&server, |l| {
        l["num_running_reqs"] == 1 && l["num_waiting_reqs"] == 1
    })
    .await;
    let usage = busy["loads"][0]["token_usage"].as_f64().unwrap();
    assert!(usage > 0.0 && usage <= 1.0, "{busy}");

    drop((running, waiting));
    wait_for_load(&server, |l| {
        l["num_running_reqs"] == 0 && l["num_waiting_reqs"] == 0 && l["token_usage"] == 0.0
    })
    .await;
}
