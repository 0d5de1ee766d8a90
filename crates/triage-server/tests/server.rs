//! `triage serve` end to end on a tiny random model: every endpoint, streaming and not,
//! logprobs, stop strings, auth, cancellation, the queue limit, graceful shutdown, a table of
//! hostile requests, a bounded load test, and the official `openai` Python client.

mod common;

use std::time::{Duration, Instant};

use common::{chat_body, sse_data, TestServer, MODEL};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_in_openai_shapes() {
    let server = TestServer::start(|_| {}).await;
    let (status, body) = server.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "ok"
    );

    let (status, body) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["object"], "model");

    let (status, chat) = server
        .post("/v1/chat/completions", &chat_body("hello", 6))
        .await;
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["object"], "chat.completion");
    assert!(chat["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &chat["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["logprobs"], Value::Null);
    assert_eq!(choice["triage"]["entropies"].as_array().unwrap().len(), 6);
    assert!(choice["triage"]["mean_entropy"].as_f64().unwrap() > 0.0);
    let usage = &chat["usage"];
    assert_eq!(usage["completion_tokens"], 6);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + 6
    );
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());

    let body = json!({"model": MODEL, "prompt": "the sun", "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    let (status, completion) = server.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["object"], "text_completion");
    assert!(completion["choices"][0]["text"].is_string());
    assert_eq!(completion["usage"]["completion_tokens"], 5);

    // The engine publishes its gauges after the step that finished the request.
    server.wait_idle().await;
    let (status, metrics) = server.get("/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "triage_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
        "triage_time_to_first_token_seconds_count{model=\"tiny\"} 2",
        "triage_inter_token_latency_seconds_count{model=\"tiny\"} 9",
        "triage_requests_running{model=\"tiny\"} 0",
        "triage_requests_waiting{model=\"tiny\"} 0",
        "triage_kv_blocks_used{model=\"tiny\"} 0",
        "triage_kv_blocks_total{model=\"tiny\"} 2047",
        "triage_kv_blocks_pinned{model=\"tiny\"} 0",
        "triage_prefix_cache_queries_total{model=\"tiny\"}",
        "triage_prefix_cache_hits_total{model=\"tiny\"}",
        "triage_prompt_tokens_total{model=\"tiny\"}",
        "triage_generation_tokens_total{model=\"tiny\"} 11",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_gives_the_same_text_as_a_plain_request() {
    let server = TestServer::start(|_| {}).await;
    let (_, plain) = server
        .post("/v1/chat/completions", &chat_body("stream me", 8))
        .await;
    let mut body = chat_body("stream me", 8);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = server.stream("/v1/chat/completions", &body).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    let entropies = chunks
        .iter()
        .filter(|c| c["choices"][0]["triage"]["entropies"].is_array())
        .count();
    assert_eq!(entropies, 8, "every token's entropy is streamed");

    let body = json!({"model": MODEL, "prompt": "abc", "max_tokens": 3, "stream": true, "ignore_eos": true});
    let events = server.stream("/v1/completions", &body).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let tokens = chunks
        .iter()
        .filter(|c| c["choices"][0]["triage"].is_object())
        .count();
    assert_eq!(tokens, 3);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "no usage without include_usage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_in_both_formats() {
    let server = TestServer::start(|_| {}).await;
    let mut body = chat_body("probabilities", 4);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (status, chat) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{chat}");
    let content = chat["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 4);
    for entry in content {
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        assert!(entry["bytes"].is_array());
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        let best = top[0]["logprob"].as_f64().unwrap();
        assert!((entry["logprob"].as_f64().unwrap() - best).abs() < 1e-3);
    }
    let body = json!({"model": MODEL, "prompt": "xyz", "max_tokens": 3, "logprobs": 2, "temperature": 0, "ignore_eos": true});
    let (status, completion) = server.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{completion}");
    let lp = &completion["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 3);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_the_output() {
    let server = TestServer::start(|_| {}).await;
    let body = json!({"model": MODEL, "prompt": "aaaa", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let (_, full) = server.post("/v1/completions", &body).await;
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the middle of the greedy output: everything before it comes back.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 6, "greedy output too short: {text:?}");
    let stop: String = chars[3..5].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let mut stopped = body.clone();
    stopped["stop"] = json!([stop]);
    let (status, out) = server.post("/v1/completions", &stopped).await;
    assert_eq!(status, 200);
    assert_eq!(out["choices"][0]["text"], cut);
    assert_eq!(out["choices"][0]["finish_reason"], "stop");
}

/// A web page cannot drive a loopback server: a body must be declared JSON (415), the Host
/// must name the server (421; DNS rebinding), no CORS header invites a page in, and a bad path
/// parameter is an OpenAI error, not plain text. After each refusal the server is healthy and
/// answers a normal request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_a_web_page_could_forge_are_refused() {
    let server = TestServer::start(|_| {}).await;
    let client = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", server.url);
    let body = chat_body("hello", 2).to_string();
    let cases = [
        (
            client
                .post(&chat)
                .header("content-type", "text/plain")
                .body(body.clone()),
            415,
            "unsupported_media_type",
        ),
        (
            client
                .post(&chat)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body.clone()),
            415,
            "unsupported_media_type",
        ),
        (
            client.post(&chat).body(body.clone()),
            415,
            "unsupported_media_type",
        ),
        (
            client
                .post(&chat)
                .header("host", "evil.example:8080")
                .header("content-type", "application/json")
                .body(body.clone()),
            421,
            "misdirected_request",
        ),
        (
            client
                .get(format!("{}/v1/models", server.url))
                .header("host", "rebound.example"),
            421,
            "misdirected_request",
        ),
    ];
    for (request, status, code) in cases {
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), status);
        assert!(r.headers().get("access-control-allow-origin").is_none());
        let error: Value = r.json().await.unwrap();
        assert_eq!(error["error"]["code"], code, "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        assert!(error["error"]["message"].is_string());
        let (health, _) = server.get("/health").await;
        assert_eq!(health, 200);
    }
    let r = client
        .get(format!("{}/v1/corpora/%FF/documents", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let error: Value = r.json().await.unwrap();
    assert_eq!(error["error"]["param"], "name", "{error}");
    // A preflight gets no CORS grant.
    let r = client
        .request(reqwest::Method::OPTIONS, &chat)
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(!r.status().is_success());
    assert!(r.headers().get("access-control-allow-origin").is_none());
    // The same request, declared JSON and addressed to the server, answers.
    let (status, chat) = server
        .post("/v1/chat/completions", &chat_body("hello", 2))
        .await;
    assert_eq!(status, 200, "{chat}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_guards_v1_but_not_health() {
    let server = TestServer::start(|c| c.server.api_key = Some("sk-test".into())).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/models", server.url);
    let none = client.get(&url).send().await.unwrap();
    assert_eq!(none.status(), 401);
    let body: Value = none.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let wrong = client
        .get(&url)
        .bearer_auth("sk-tesT")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right = client
        .get(&url)
        .bearer_auth("sk-test")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
    let chat = client
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&chat_body("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 401);
    assert_eq!(server.get("/health").await.0, 200);
    assert_eq!(server.get("/metrics").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_frees_its_blocks() {
    let server = TestServer::start(|_| {}).await;
    let mut body = chat_body("a long answer please", 4000);
    body["stream"] = json!(true);
    let response = server.open(&body).await;
    let mut stream = response.bytes_stream();
    use futures_util::StreamExt;
    // Read until a token has arrived (the request holds blocks), then hang up.
    let mut seen = String::new();
    while !seen.contains("entropies") {
        let bytes = stream.next().await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&bytes));
    }
    drop(stream);
    // The engine notices at its next step and cancels; it does not run the 4,000 tokens.
    server.wait_abandoned(1).await;
    server.wait_idle().await;
    // Non-streaming too: a request whose client times out is cancelled.
    let slow = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&chat_body("a long answer please", 4000))
        .timeout(Duration::from_millis(30))
        .send()
        .await;
    assert!(slow.is_err(), "the client gave up first");
    server.wait_abandoned(2).await;
    server.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429() {
    let server = TestServer::start(|c| c.server.max_pending_requests = 1).await;
    let mut body = chat_body("hold the slot", 4000);
    body["stream"] = json!(true);
    let busy = server.open(&body).await;
    assert_eq!(busy.status(), 200);
    let (status, error) = server
        .post("/v1/chat/completions", &chat_body("me too", 2))
        .await;
    assert_eq!(status, 429);
    assert_eq!(error["error"]["code"], "queue_full");
    drop(busy);
    server.wait_idle().await;
    let (status, _) = server
        .post("/v1/chat/completions", &chat_body("now", 2))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish_then_stops() {
    let mut server = TestServer::start(|_| {}).await;
    let mut body = chat_body("finish me", 40);
    body["stream"] = json!(true);
    let response = server.open(&body).await;
    assert_eq!(response.status(), 200);
    server.signal_shutdown();
    let events = sse_data(&response.text().await.unwrap());
    assert_eq!(
        events.last().unwrap(),
        "[DONE]",
        "the in-flight stream ran to its end"
    );
    let task = server.task.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("server stopped")
        .unwrap()
        .unwrap();
    assert!(
        reqwest::get(format!("{}/health", server.url))
            .await
            .is_err(),
        "no longer accepting"
    );
}

/// An engine thread that is gone (stopped here; a panic ends it the same way) turns health to
/// 503 naming the model, and its requests get a 503 at once instead of waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_engine_turns_health_and_its_requests_to_503() {
    let server = TestServer::start(|_| {}).await;
    let worker = server.state.workers[0].clone();
    tokio::task::spawn_blocking(move || worker.shutdown(false))
        .await
        .unwrap();
    let (status, body) = server.get("/health").await;
    assert_eq!(status, 503, "{body}");
    let health: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["stopped"], json!([common::MODEL]), "{health}");
    let (status, error) = tokio::time::timeout(
        Duration::from_secs(10),
        server.post("/v1/chat/completions", &chat_body("hello", 2)),
    )
    .await
    .expect("answered, not hung");
    assert_eq!(status, 503, "{error}");
    assert_eq!(error["error"]["type"], "server_error", "{error}");
}

/// A malformed or hostile request and the status it must get.
struct Case {
    method: &'static str,
    path: String,
    body: Vec<u8>,
    headers: Vec<(&'static str, &'static str)>,
    status: u16,
}

fn case(method: &'static str, path: &str, body: impl Into<Vec<u8>>, status: u16) -> Case {
    Case {
        method,
        path: path.to_string(),
        body: body.into(),
        headers: vec![("content-type", "application/json")],
        status,
    }
}

/// Plain-model cases: bodies, parameters, paths and methods.
fn bad_requests() -> Vec<Case> {
    let chat = "/v1/chat/completions";
    let cmpl = "/v1/completions";
    let ok_msgs = r#"[{"role":"user","content":"hi"}]"#;
    let with = |extra: &str| format!(r#"{{"model":"tiny","messages":{ok_msgs},{extra}}}"#);
    let nested = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let long_stops = format!(r#""stop":["{0}","{0}","{0}","{0}"]"#, "s".repeat(2048));
    vec![
        case("POST", chat, "", 400),
        case("POST", chat, "{", 400),
        case("POST", chat, "[]", 400),
        case("POST", chat, "null", 400),
        case("POST", chat, nested, 400),
        case("POST", chat, b"{\"model\":\"tiny\xff\xfe\"}".to_vec(), 400),
        case("POST", chat, r#"{"messages":[]}"#, 400),
        case(
            "POST",
            chat,
            format!(r#"{{"model":"gpt-9","messages":{ok_msgs}}}"#),
            404,
        ),
        case("POST", chat, r#"{"model":"tiny"}"#, 400),
        case("POST", chat, r#"{"model":"tiny","messages":"hi"}"#, 400),
        case("POST", chat, r#"{"model":"tiny","messages":[]}"#, 400),
        case(
            "POST",
            chat,
            r#"{"model":"tiny","messages":[{"role":"user"}]}"#,
            400,
        ),
        case(
            "POST",
            chat,
            r#"{"model":"tiny","messages":[{"role":"alien","content":"x"}]}"#,
            400,
        ),
        case(
            "POST",
            chat,
            r#"{"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
            400,
        ),
        case("POST", chat, with(r#""temperature":-1"#), 400),
        case("POST", chat, with(r#""temperature":1e9"#), 400),
        case("POST", chat, with(r#""temperature":"hot""#), 400),
        case("POST", chat, with(r#""top_p":0"#), 400),
        case("POST", chat, with(r#""top_p":1.5"#), 400),
        case("POST", chat, with(r#""min_p":1.5"#), 400),
        case("POST", chat, with(r#""presence_penalty":3"#), 400),
        case("POST", chat, with(r#""frequency_penalty":-2.5"#), 400),
        case("POST", chat, with(r#""repetition_penalty":1e-45"#), 400),
        case("POST", chat, with(r#""repetition_penalty":0"#), 400),
        case("POST", chat, with(r#""max_tokens":-5"#), 400),
        case("POST", chat, with(r#""max_tokens":0"#), 400),
        case("POST", chat, with(r#""max_tokens":1.5"#), 400),
        case("POST", chat, with(r#""max_tokens":1e30"#), 400),
        case("POST", chat, with(r#""max_tokens":100000"#), 400),
        case("POST", chat, with(r#""n":3"#), 400),
        case("POST", chat, with(r#""stream":"yes""#), 400),
        case(
            "POST",
            chat,
            with(r#""logprobs":true,"top_logprobs":50"#),
            400,
        ),
        case("POST", chat, with(r#""stop":["a","b","c","d","e"]"#), 400),
        case("POST", chat, with(&long_stops), 400),
        case("POST", chat, with(r#""stop":[""]"#), 400),
        case("POST", chat, with(r#""seed":"abc""#), 400),
        case(
            "POST",
            chat,
            format!(
                r#"{{"model":"tiny","messages":[{{"role":"user","content":"{}"}}]}}"#,
                "word ".repeat(2000)
            ),
            400,
        ),
        case("POST", cmpl, r#"{"model":"tiny"}"#, 400),
        case("POST", cmpl, r#"{"model":"tiny","prompt":["a","b"]}"#, 400),
        case("POST", cmpl, r#"{"model":"tiny","prompt":""}"#, 400),
        case("POST", cmpl, r#"{"model":"tiny","prompt":[999999]}"#, 400),
        case(
            "POST",
            cmpl,
            r#"{"model":"tiny","prompt":"x","echo":true}"#,
            400,
        ),
        case(
            "POST",
            cmpl,
            r#"{"model":"tiny","prompt":"x","logprobs":21}"#,
            400,
        ),
        case(
            "POST",
            cmpl,
            format!(r#"{{"model":"tiny","prompt":"{}"}}"#, "x".repeat(70_000)),
            413,
        ),
        case("GET", chat, "", 405),
        case("PUT", chat, with(""), 405),
        case("DELETE", "/v1/models", "", 405),
        case("GET", "/v1/nothing", "", 404),
        case("GET", "/../../etc/passwd", "", 404),
        Case {
            headers: vec![("content-type", "text/plain")],
            ..case("POST", chat, with(r#""max_tokens":2"#), 415)
        },
        Case {
            headers: vec![],
            ..case("POST", chat, with(r#""max_tokens":2"#), 415)
        },
        Case {
            headers: vec![
                ("content-type", "application/json"),
                ("host", "evil.example"),
            ],
            ..case("POST", chat, with(r#""max_tokens":2"#), 421)
        },
    ]
}

/// Pipeline and corpus cases, against a server holding corpora `docs` and `c2` (its limit of
/// two), at most 3 documents per request and 2,000 bytes per corpus.
fn bad_pipeline_and_corpus_requests() -> Vec<Case> {
    let chat = "/v1/chat/completions";
    let ask = |extra: &str, triage: &str| {
        format!(
            r#"{{"model":"triage","messages":[{{"role":"user","content":"where did the dog run"}}],{extra}"triage":{triage}}}"#
        )
    };
    let docs = |n: usize, text_len: usize| {
        let list: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"id":"n{i}","text":"{}"}}"#, "t".repeat(text_len)))
            .collect();
        format!("[{}]", list.join(","))
    };
    let corpus = r#"{"corpus":"docs"}"#;
    vec![
        case(
            "POST",
            chat,
            r#"{"model":"triage","messages":[{"role":"user","content":"q"}]}"#,
            400,
        ),
        case("POST", chat, ask("", r#"{"corpus":"nope"}"#), 404),
        case(
            "POST",
            chat,
            ask("", r#"{"corpus":"docs","route":"sideways"}"#),
            400,
        ),
        case("POST", chat, ask("", r#"{"corpus":"docs","tau":-1}"#), 400),
        case(
            "POST",
            chat,
            ask("", r#"{"corpus":"docs","color":"red"}"#),
            400,
        ),
        case("POST", chat, ask("", r#""docs""#), 400),
        case("POST", chat, ask(r#""n":2,"#, corpus), 400),
        case("POST", chat, ask(r#""logprobs":true,"#, corpus), 400),
        case("POST", chat, ask(r#""stop":["x"],"#, corpus), 400),
        case("POST", chat, ask(r#""temperature":0.7,"#, corpus), 400),
        case("POST", chat, ask(r#""ignore_eos":true,"#, corpus), 400),
        case("POST", chat, ask(r#""max_tokens":100000,"#, corpus), 400),
        case(
            "POST",
            chat,
            r#"{"model":"triage","messages":[{"role":"user","content":"  "}],"triage":{"corpus":"docs"}}"#,
            400,
        ),
        case("POST", "/v1/route", r#"{"corpus":"docs"}"#, 400),
        case(
            "POST",
            "/v1/route",
            r#"{"corpus":"nope","question":"q"}"#,
            404,
        ),
        case(
            "POST",
            "/v1/corpora",
            r#"{"name":"docs","documents":[]}"#,
            400,
        ),
        case(
            "POST",
            "/v1/corpora",
            r#"{"name":"c3","documents":[]}"#,
            400,
        ),
        case(
            "POST",
            "/v1/corpora",
            r#"{"name":"../etc","documents":[]}"#,
            400,
        ),
        case("POST", "/v1/corpora", r#"{"name":"","documents":[]}"#, 400),
        case("POST", "/v1/corpora", r#"{"documents":[]}"#, 400),
        case(
            "POST",
            "/v1/corpora/docs/documents",
            format!(r#"{{"documents":{}}}"#, docs(4, 5)),
            400,
        ),
        case(
            "POST",
            "/v1/corpora/docs/documents",
            format!(r#"{{"documents":{}}}"#, docs(1, 3000)),
            413,
        ),
        case(
            "POST",
            "/v1/corpora/docs/documents",
            r#"{"documents":[{"id":"","text":"x"}]}"#,
            400,
        ),
        case(
            "POST",
            "/v1/corpora/docs/documents",
            r#"{"documents":[{"id":"a","text":"x"},{"id":"a","text":"y"}]}"#,
            400,
        ),
        case(
            "POST",
            "/v1/corpora/docs/documents",
            r#"{"documents":[{"id":"a"}]}"#,
            400,
        ),
        case(
            "POST",
            "/v1/corpora/nope/documents",
            format!(r#"{{"documents":{}}}"#, docs(1, 5)),
            404,
        ),
        case(
            "DELETE",
            "/v1/corpora/docs/documents",
            r#"{"ids":["missing"]}"#,
            400,
        ),
        case(
            "DELETE",
            "/v1/corpora/docs/documents",
            r#"{"ids":["1","2","3","4"]}"#,
            400,
        ),
        case("DELETE", "/v1/corpora/nope", "", 404),
        case("GET", "/v1/corpora/%FF/documents", "", 400),
        case("GET", "/v1/corpora/nope/documents", "", 404),
    ]
}

/// Send `c`; the status and the body.
async fn send_case(client: &reqwest::Client, url: &str, c: &Case) -> (u16, String) {
    let mut request = client
        .request(c.method.parse().unwrap(), format!("{url}{}", c.path))
        .body(c.body.clone());
    for (name, value) in &c.headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// Every hostile request gets its 4xx with an OpenAI error body, and after each one the server
/// is healthy and answers a normal request, on the plain models and on the pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_client_errors_and_the_server_stays_up() {
    let server = TestServer::start_routed(|c| {
        c.server.max_body_bytes = 64 * 1024;
        c.pipeline.limits.max_corpora = 2;
        c.pipeline.limits.max_documents_per_request = 3;
        c.pipeline.limits.max_corpus_bytes = 2000;
    })
    .await;
    for name in ["docs", "c2"] {
        let body = json!({"name": name, "documents": [
            {"id": "1", "text": "the cat sat on the mat"},
            {"id": "2", "text": "the dog ran to the park"},
        ]});
        let (status, _, created) = server
            .send(reqwest::Method::POST, "/v1/corpora", &body)
            .await;
        assert_eq!(status, 201, "{created}");
    }
    let client = reqwest::Client::new();
    let mut cases = bad_requests();
    cases.extend(bad_pipeline_and_corpus_requests());
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let normal = ask("where did the dog run", json!({"corpus": "docs"}));
    for c in &cases {
        let (status, text) = send_case(&client, &server.url, c).await;
        let short: String = String::from_utf8_lossy(&c.body).chars().take(100).collect();
        let what = format!("{} {} {short}", c.method, c.path);
        assert_eq!(status, c.status, "{what}: {text}");
        let error: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{what}: not an OpenAI error body: {text}"));
        assert!(error["error"]["message"].is_string(), "{what}: {text}");
        assert!(error["error"]["type"].is_string(), "{what}: {text}");
        assert!(!text.contains("/tmp/"), "{what}: a server path: {text}");
        assert_eq!(server.get("/health").await.0, 200, "{what}");
        let (status, answer) = server
            .post("/v1/chat/completions", &chat_body("hello", 2))
            .await;
        assert_eq!(status, 200, "after {what}: {answer}");
    }
    // An id or title past its limit (both go into the long-context prefix whole) is refused by
    // name before anything is stored.
    for (doc, field) in [
        (
            json!({"id": "i".repeat(10 * 1024), "text": "x"}),
            "documents[0].id",
        ),
        (
            json!({"id": "t", "title": "t".repeat(1025), "text": "x"}),
            "documents[0].title",
        ),
    ] {
        let body = json!({ "documents": [doc] });
        let (status, error) = server.post("/v1/corpora/docs/documents", &body).await;
        assert_eq!(status, 400, "{error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{error}");
    }
    let (status, answer) = server.post("/v1/chat/completions", &normal).await;
    assert_eq!(status, 200, "{answer}");
    let (status, docs) = server.get("/v1/corpora/docs/documents").await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&docs).unwrap()["data"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "no refused change reached the corpus: {docs}"
    );
    server.wait_no_requests().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_test_64_streaming_clients() {
    let server = TestServer::start(|c| c.models[0].max_num_seqs = 64).await;
    let url = format!("{}/v1/chat/completions", server.url);
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut ttfts = Vec::new();
            let mut errors = 0;
            for j in 0..3 {
                let mut body = chat_body(&format!("client {i} request {j}"), 8);
                body["stream"] = json!(true);
                let sent = Instant::now();
                let Ok(response) = client.post(&url).json(&body).send().await else {
                    errors += 1;
                    continue;
                };
                if response.status() != 200 {
                    errors += 1;
                    continue;
                }
                use futures_util::StreamExt;
                let mut stream = response.bytes_stream();
                let mut text = String::new();
                let mut first = None;
                while let Some(Ok(bytes)) = stream.next().await {
                    text.push_str(&String::from_utf8_lossy(&bytes));
                    if first.is_none() && text.contains("\"triage\"") {
                        first = Some(sent.elapsed());
                    }
                }
                match (first, text.trim_end().ends_with("data: [DONE]")) {
                    (Some(t), true) => ttfts.push(t),
                    _ => errors += 1,
                }
            }
            (ttfts, errors)
        }));
    }
    let mut ttfts = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (mut times, e) = t.await.unwrap();
        ttfts.append(&mut times);
        errors += e;
    }
    ttfts.sort();
    let pct = |p: f64| ttfts[((ttfts.len() - 1) as f64 * p) as usize];
    server.wait_idle().await;
    eprintln!(
        "load: 64 clients x 3 requests in {:.1} s, errors {errors}, ttft p50 {:?} p95 {:?}, blocks in use after {}",
        start.elapsed().as_secs_f64(),
        pct(0.5),
        pct(0.95),
        server.blocks_used()
    );
    assert_eq!(errors, 0);
    assert_eq!(ttfts.len(), 192);
    assert_eq!(server.blocks_used(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_client_works_unchanged() {
    let server = TestServer::start(|c| c.server.api_key = Some("sk-python".into())).await;
    let python = std::env::var("TRIAGE_TEST_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/pyenv/bin/python").to_string()
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let output = tokio::process::Command::new(&python)
        .arg(script)
        .arg(format!("{}/v1", server.url))
        .arg("sk-python")
        .arg(MODEL)
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!("cannot run {python}: {e}; scripts/test installs the openai client there")
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "openai client failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

fn documents() -> Value {
    let docs: Vec<Value> = (0..6)
        .map(|i| {
            json!({"id": format!("d{i}"), "title": format!("doc {i}"),
                   "text": format!("the cat sat on mat {i} and the dog ran to the park while the bird sang {i}")})
        })
        .collect();
    Value::Array(docs)
}

/// The case of issue 52 on the routed server: a document with a 10 KB id is a 400 naming the
/// field; two small changes after it each return with their generation stored and its pin
/// `pinning` (or already `pinned`), never waiting behind a prefill; `GET /v1/corpora/{name}`
/// then reports the newest generation `pinned`, and a question forced to long context over it
/// reads the pinned prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_changes_return_before_the_prefix_is_pinned_and_report_the_pin() {
    let server = TestServer::start_routed(|c| {
        c.routing.lc_max_tokens = 4;
    })
    .await;
    use reqwest::Method;
    let (status, _, created) = server
        .send(
            Method::POST,
            "/v1/corpora",
            &json!({"name": "docs", "documents": documents()}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let long_id = json!({"documents": [{"id": "x".repeat(10_000), "text": "a long id"}]});
    let (status, _, refused) = server
        .send(Method::POST, "/v1/corpora/docs/documents", &long_id)
        .await;
    assert_eq!(status, 400, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("documents[0].id"), "{refused}");

    for (i, generation) in [(7, 2), (8, 3)] {
        let doc = json!({"documents": [{"id": format!("d{i}"), "text": format!("note {i} on the tides")}]});
        let (status, _, changed) = server
            .send(Method::POST, "/v1/corpora/docs/documents", &doc)
            .await;
        assert_eq!(status, 200, "{changed}");
        let corpus = &changed["result"]["corpus"];
        assert_eq!(corpus["generation"], generation, "{changed}");
        let state = corpus["pin"]["state"].as_str().unwrap();
        assert!(state == "pinning" || state == "pinned", "{changed}");
        if state == "pinning" {
            let total = corpus["pin"]["tokens_total"].as_u64().unwrap();
            assert!(total > 0 && corpus["pin"]["tokens_done"].as_u64().unwrap() <= total);
        }
    }
    let corpus = server.pinned_corpus("docs").await;
    assert_eq!(corpus["object"], "corpus");
    assert_eq!(corpus["generation"], 3, "{corpus}");
    assert_eq!(corpus["documents"], 8, "{corpus}");
    assert_eq!(corpus["pin"]["state"], "pinned", "{corpus}");
    let tokens = corpus["pin"]["tokens"].as_u64().unwrap();
    assert!(tokens > 0 && tokens <= corpus["prefix_tokens"].as_u64().unwrap());

    let (status, route, body) = server
        .send(
            Method::POST,
            "/v1/chat/completions",
            &ask(
                "where did the dog run",
                json!({"corpus": "docs", "route": "lc"}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(route.as_deref(), Some("lc"));
    let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= tokens, "{cached} cached of the {tokens} pinned");

    let (status, body) = server.get("/v1/corpora/nope").await;
    assert_eq!(status, 404, "{body}");
}

/// `body` with `key` set to `value`.
fn with(mut body: Value, key: &str, value: Value) -> Value {
    body[key] = value;
    body
}

fn ask(question: &str, triage: Value) -> Value {
    json!({
        "model": "triage",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "triage": triage,
    })
}

/// The routing pipeline over HTTP: corpora are created, listed, changed; chat completions with
/// `model: "triage"` answer over them with the path in a header and the decision record in the
/// body; a second escalation reports the corpus prefix as cached; streaming gives the same text
/// with the record in its last chunk; `/v1/route` decides without answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_answers_over_corpora_managed_by_the_api() {
    let server = TestServer::start_routed(|c| {
        c.routing.lc_max_tokens = 4;
        c.routing.rag_max_tokens = 4;
        c.routing.prices.long_context.cached_prompt = 100.0;
    })
    .await;
    use reqwest::Method;
    let (status, _, created) = server
        .send(
            Method::POST,
            "/v1/corpora",
            &json!({"name": "docs", "documents": documents()}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["result"]["added"], 6);
    let prefix = created["result"]["corpus"]["prefix_tokens"]
        .as_u64()
        .unwrap();
    let pinned = server.pinned_corpus("docs").await;
    assert_eq!(pinned["pin"]["from"], "computed", "{pinned}");
    assert_eq!(pinned["pinned_from"], "computed", "{pinned}");
    let (status, list) = server.get("/v1/corpora").await;
    assert_eq!(status, 200);
    let list: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["data"][0]["name"], "docs");
    assert_eq!(list["data"][0]["documents"], 6);

    for _ in 0..2 {
        let (status, route, body) = server
            .send(
                Method::POST,
                "/v1/chat/completions",
                &ask(
                    "where did the dog run",
                    json!({"corpus": "docs", "route": "lc"}),
                ),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(route.as_deref(), Some("lc"));
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "triage");
        assert_eq!(body["triage"]["route"]["path"], "lc");
        assert!(body["choices"][0]["message"]["content"].is_string());
        let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        // Block size 4: every whole block of the corpus prefix was pinned when it loaded.
        assert!(cached >= prefix / 4 * 4, "{cached} cached of {prefix}");
    }

    // τ = 0 escalates; a forced rag route keeps the RAG answer whatever its entropy.
    let (_, route, body) = server
        .send(
            Method::POST,
            "/v1/chat/completions",
            &ask(
                "where did the dog run",
                json!({"corpus": "docs", "tau": 0.0}),
            ),
        )
        .await;
    assert_eq!(route.as_deref(), Some("lc"), "{body}");
    assert_eq!(body["triage"]["route"]["monitor"]["decision"], "escalate");
    let escalated = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, route, body) = server
        .send(
            Method::POST,
            "/v1/chat/completions",
            &ask(
                "where did the dog run",
                json!({"corpus": "docs", "route": "rag", "tau": 0.0}),
            ),
        )
        .await;
    assert_eq!(route.as_deref(), Some("rag"), "{body}");
    assert_eq!(body["triage"]["route"]["forced"], true);
    let plain = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();

    // Streaming gives the same texts; the path comes first (header and first chunk), the
    // record in the last chunk, and a replaced RAG answer is never streamed.
    for (triage, expected_route, expected_text) in [
        (
            json!({"corpus": "docs", "route": "rag", "tau": 0.0}),
            "rag",
            &plain,
        ),
        (json!({"corpus": "docs", "tau": 0.0}), "lc", &escalated),
    ] {
        let mut streamed = ask("where did the dog run", triage);
        streamed["stream"] = json!(true);
        let r = server.open(&streamed).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-triage-route"], expected_route);
        let data = sse_data(&r.text().await.unwrap());
        assert_eq!(data.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(chunks[0]["triage"]["path"], expected_route);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(&text, expected_text);
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(last["triage"]["route"]["path"], expected_route);
    }

    let (status, route, planned) = server
        .send(
            Method::POST,
            "/v1/route",
            &json!({"corpus": "docs", "question": "where did the dog run"}),
        )
        .await;
    assert_eq!(status, 200, "{planned}");
    assert_eq!(route.as_deref(), Some("rag"));
    assert_eq!(planned["path"], "rag");
    assert!(planned["route"]["reason"]
        .as_str()
        .unwrap()
        .contains("may still escalate"));
    assert!(planned["route"]["estimated_costs"]["lc"].as_f64().unwrap() > 0.0);

    let (status, _, changed) = server
        .send(
            Method::DELETE,
            "/v1/corpora/docs/documents",
            &json!({"ids": ["d0", "d1"]}),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["result"]["deleted"], 2);
    let (status, _, added) = server
        .send(
            Method::POST,
            "/v1/corpora/docs/documents",
            &json!({"documents": [{"id": "d9", "text": "a fox jumped over the fence"}]}),
        )
        .await;
    assert_eq!(status, 200, "{added}");
    assert_eq!(added["result"]["added"], 1);
    let (status, docs) = server.get("/v1/corpora/docs/documents").await;
    assert_eq!(status, 200);
    let docs: Value = serde_json::from_str(&docs).unwrap();
    let ids: Vec<&str> = docs["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["d2", "d3", "d4", "d5", "d9"]);
}

/// `DELETE /v1/corpora/{name}` removes a corpus: it is no longer listed, questions over it are
/// 404s, and deleting it again is a 404 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_corpus_is_gone() {
    let server = TestServer::start_routed(|_| {}).await;
    use reqwest::Method;
    let body = json!({"name": "gone", "documents": documents()});
    let (status, _, created) = server.send(Method::POST, "/v1/corpora", &body).await;
    assert_eq!(status, 201, "{created}");
    let (status, _, deleted) = server
        .send(Method::DELETE, "/v1/corpora/gone", &Value::Null)
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["deleted"], true);
    let (_, list) = server.get("/v1/corpora").await;
    assert!(!list.contains("gone"), "{list}");
    let (status, _, error) = server
        .send(
            Method::POST,
            "/v1/chat/completions",
            &ask("where did the dog run", json!({"corpus": "gone"})),
        )
        .await;
    assert_eq!(status, 404, "{error}");
    let (status, _, error) = server
        .send(Method::DELETE, "/v1/corpora/gone", &Value::Null)
        .await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["code"], "corpus_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pipeline_requests_are_client_errors() {
    let server = TestServer::start_routed(|_| {}).await;
    use reqwest::Method;
    let (status, _, _) = server
        .send(
            Method::POST,
            "/v1/corpora",
            &json!({"name": "docs", "documents": documents()}),
        )
        .await;
    assert_eq!(status, 201);
    let cases = [
        (ask("q", Value::Null), 400, Some("triage")),
        (
            ask("q", json!({"corpus": "docs", "route": "sideways"})),
            400,
            Some("triage.route"),
        ),
        (
            ask("q", json!({"corpus": "docs", "tau": -1.0})),
            400,
            Some("triage.tau"),
        ),
        (
            ask("q", json!({"corpus": "docs", "surprise": 1})),
            400,
            Some("triage"),
        ),
        (ask("q", json!({"corpus": "nope"})), 404, Some("corpus")),
        (
            with(ask("q", json!({"corpus": "docs"})), "n", json!(2)),
            400,
            Some("n"),
        ),
        (
            with(ask("q", json!({"corpus": "docs"})), "logprobs", json!(true)),
            400,
            Some("logprobs"),
        ),
        (
            with(
                ask("q", json!({"corpus": "docs"})),
                "temperature",
                json!(0.7),
            ),
            400,
            Some("temperature"),
        ),
        (
            with(ask("q", json!({"corpus": "docs"})), "stop", json!(["x"])),
            400,
            Some("stop"),
        ),
        (ask("  ", json!({"corpus": "docs"})), 400, Some("messages")),
    ];
    for (body, expected, param) in cases {
        let (status, _, error) = server
            .send(Method::POST, "/v1/chat/completions", &body)
            .await;
        assert_eq!(status, expected, "{body} → {error}");
        assert_eq!(error["error"]["param"].as_str(), param, "{error}");
        assert!(error["error"]["message"].is_string());
    }
    // A routed answer longer than the context is the caller's mistake, as on a plain model.
    let mut long = ask(
        "where did the dog run",
        json!({"corpus": "docs", "route": "lc"}),
    );
    long["max_tokens"] = json!(5000);
    let (status, _, e) = server
        .send(Method::POST, "/v1/chat/completions", &long)
        .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["code"], "context_length_exceeded", "{e}");
    let (status, _, e) = server
        .send(
            Method::POST,
            "/v1/corpora",
            &json!({"name": "docs", "documents": []}),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    let (status, _, e) = server
        .send(
            Method::DELETE,
            "/v1/corpora/docs/documents",
            &json!({"ids": ["missing"]}),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    let (status, _, e) = server
        .send(
            Method::POST,
            "/v1/corpora/nope/documents",
            &json!({"documents": []}),
        )
        .await;
    assert_eq!(status, 404, "{e}");
    let (status, _, e) = server
        .send(Method::POST, "/v1/route", &json!({"corpus": "docs"}))
        .await;
    assert_eq!(status, 400, "{e}");
    // The server is still up and answering.
    let (status, _, _) = server
        .send(
            Method::POST,
            "/v1/chat/completions",
            &ask("where", json!({"corpus": "docs", "route": "rag"})),
        )
        .await;
    assert_eq!(status, 200);
}

/// Issue 20: a sampling parameter out of its sane range is a 400 naming it, before anything
/// runs (a repetition penalty of 1e-45 used to reach the sampler and cut off every request on
/// the model), and so is a stop string past the bound on what the stop checker holds back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_sampling_is_a_400_naming_the_parameter() {
    let server = TestServer::start(|_| {}).await;
    let cases = [
        ("repetition_penalty", json!(1e-45)),
        ("repetition_penalty", json!(1000)),
        ("temperature", json!(1e30)),
        ("stop", json!(["x".repeat(1025)])),
        ("stop", json!(["ok", "é".repeat(600)])),
    ];
    for (param, value) in cases {
        let mut body = chat_body("hi", 4);
        body[param] = value;
        let (status, error) = server.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{param}: {error}");
        assert_eq!(error["error"]["param"], param, "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    }
    let mut body = chat_body("hi", 4);
    body["repetition_penalty"] = json!(1.3);
    body["stop"] = json!(["y".repeat(1024)]);
    assert_eq!(server.post("/v1/chat/completions", &body).await.0, 200);
    assert_eq!(server.get("/health").await.0, 200);
    server.wait_idle().await;
}

/// Issue 20: requests the engine cancels at a forced shutdown are not reported as finished with
/// `"stop"`: a plain request gets a 503 with OpenAI's error body, a stream ends with an error
/// chunk and no `finish_reason`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cancelled_at_shutdown_are_errors_not_stops() {
    let mut server = TestServer::start(|c| c.server.shutdown_timeout_s = 0).await;
    let url = format!("{}/v1/chat/completions", server.url);
    let plain = tokio::spawn({
        let url = url.clone();
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .json(&chat_body("a long answer please", 4000))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    });
    let mut body = chat_body("another long answer", 4000);
    body["stream"] = json!(true);
    let response = reqwest::Client::new()
        .post(&url)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let start = Instant::now();
    while server.pending() < 2 || server.blocks_used() == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "both in flight");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.signal_shutdown();
    let events = sse_data(&response.text().await.unwrap());
    let last_json: Value = events
        .iter()
        .rev()
        .find(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .unwrap();
    assert!(last_json["error"]["message"].is_string(), "{events:?}");
    assert!(
        events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .all(|c| c["choices"][0]["finish_reason"].is_null()),
        "no chunk reports a normal finish: {events:?}"
    );
    let (status, error) = plain.await.unwrap();
    assert_eq!(status, 503, "{error}");
    assert!(error["error"]["message"].is_string(), "{error}");
}

/// A pipeline request holds a queue ticket on the base model like a plain one (429 beyond the
/// limit, for plain requests too), and a client that goes away stops its run at the next token
/// instead of costing a whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_requests_take_a_queue_ticket_and_stop_when_their_client_goes_away() {
    let server = TestServer::start_routed(|c| {
        c.server.max_pending_requests = 1;
        c.routing.rag_max_tokens = 4000;
    })
    .await;
    let (status, _, created) = server
        .send(
            reqwest::Method::POST,
            "/v1/corpora",
            &json!({"name": "docs", "documents": documents()}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    // A plain request holding the model's one slot turns a pipeline request away.
    let mut hold = chat_body("hold the slot", 4000);
    hold["stream"] = json!(true);
    let busy = server.open(&hold).await;
    assert_eq!(busy.status(), 200);
    let question = |q: &str, max_tokens: u64| {
        let mut body = ask(q, json!({"corpus": "docs", "route": "rag"}));
        body["max_tokens"] = json!(max_tokens);
        body
    };
    let (status, error) = server
        .post(
            "/v1/chat/completions",
            &question("where did the dog run", 4),
        )
        .await;
    assert_eq!(status, 429, "{error}");
    assert_eq!(error["error"]["code"], "queue_full");
    drop(busy);
    server.wait_no_requests().await;
    // The random model ends some answers early: find a question it answers at length (greedy,
    // so the same question runs at least as long again).
    let mut long = None;
    for q in [
        "where did the dog run",
        "what did the bird do",
        "which mat",
        "who sat",
        "why",
    ] {
        let (status, answer) = server.post("/v1/chat/completions", &question(q, 600)).await;
        assert_eq!(status, 200, "{answer}");
        if answer["usage"]["completion_tokens"] == 600 {
            long = Some(q);
            break;
        }
    }
    let q = long.expect("one of the questions is answered at length");
    let mut body = question(q, 3000);
    body["stream"] = json!(true);
    let response = server.open(&body).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    use futures_util::StreamExt;
    let mut seen = String::new();
    let has_text = |seen: &str| {
        sse_data(seen).iter().any(|d| {
            serde_json::from_str::<Value>(d).is_ok_and(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            })
        })
    };
    while !has_text(&seen) {
        let bytes = stream.next().await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&bytes));
    }
    // A pipeline request in flight holds the slot too.
    let (status, _) = server
        .post("/v1/chat/completions", &chat_body("plain", 2))
        .await;
    assert_eq!(status, 429, "the pipeline's ticket counts for the model");
    drop(stream);
    server.wait_abandoned(1).await;
    server.wait_no_requests().await;
    let (status, answer) = server
        .post("/v1/chat/completions", &chat_body("plain", 2))
        .await;
    assert_eq!(status, 200, "{answer}");
}

/// Read from `stream` until the server closes it (or 10 s pass); what it sent.
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Duration::from_secs(10);
    loop {
        match tokio::time::timeout(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

/// Slow or idle clients cannot hold the server: a connection that sends no request, half a
/// header, or nothing after its last answer is closed after the header timeout; a body that
/// trickles in gets a 408; and with every connection slot taken by idle clients a new request
/// waits for one to be closed instead of being served never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_cut_off() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let server = TestServer::start(|c| {
        c.server.header_timeout_s = 1;
        c.server.body_timeout_s = 1;
        c.server.max_connections = 2;
    })
    .await;
    let addr = server.url.trim_start_matches("http://").to_string();

    let mut silent = TcpStream::connect(&addr).await.unwrap();
    assert!(read_until_closed(&mut silent).await.is_some(), "silent");
    let mut half = TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    assert!(
        read_until_closed(&mut half).await.is_some(),
        "half a header"
    );
    let mut kept = TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let answered = read_until_closed(&mut kept)
        .await
        .expect("idle, then closed");
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");

    let mut trickle = TcpStream::connect(&addr).await.unwrap();
    trickle
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":",
        )
        .await
        .unwrap();
    let answer = read_until_closed(&mut trickle).await.expect("answered");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"request_timeout\""), "{answer}");

    // Both slots held by clients that send nothing: a request gets through once the header
    // timeout has closed one of them, not before.
    let _idle: Vec<TcpStream> = vec![
        TcpStream::connect(&addr).await.unwrap(),
        TcpStream::connect(&addr).await.unwrap(),
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (status, _) = server
        .post("/v1/chat/completions", &chat_body("hello", 2))
        .await;
    assert_eq!(status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "served while both slots were held"
    );
}
