//! Golden tests: GGUF tokenizers and chat templates against llama.cpp's ids and jinja2's renders.
//!
//! The golden files are tests/golden/tokenizer_<model>.json at the repository root, written by
//! scripts/golden/make_tokenizer_golden.py. The models are the real fetched GGUF files; a missing
//! file fails the test (run `triage models fetch`), it never skips.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::quantized::gguf_file;
use serde::Deserialize;
use triage_models::chat_template::{ChatMessage, ChatTemplate};
use triage_models::paths::fetched_gguf;
use triage_models::tokenizer::TextTokenizer;

#[derive(Debug, Deserialize)]
struct Golden {
    producer: String,
    cases: Vec<Case>,
    chats: Vec<Chat>,
}

#[derive(Debug, Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    ids_plain: Vec<u32>,
}

#[derive(Debug, Deserialize)]
struct Chat {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    expected: String,
}

fn golden(model: &str) -> Golden {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(format!("tokenizer_{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn metadata(model: &str) -> HashMap<String, gguf_file::Value> {
    let path = fetched_gguf(model);
    let mut file = std::fs::File::open(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `triage models fetch` to download {model}",
            path.display()
        )
    });
    gguf_file::Content::read(&mut file)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .metadata
}

struct Loaded {
    golden: Golden,
    tokenizer: TextTokenizer,
    metadata: HashMap<String, gguf_file::Value>,
}

/// Loaded once per model: building a 150k-token vocabulary is the slow part of these tests.
fn load(model: &str) -> &'static Loaded {
    static QWEN_LOADED: OnceLock<Loaded> = OnceLock::new();
    static SMOLLM_LOADED: OnceLock<Loaded> = OnceLock::new();
    let cell = match model {
        QWEN => &QWEN_LOADED,
        SMOLLM => &SMOLLM_LOADED,
        other => panic!("no golden file for {other}"),
    };
    cell.get_or_init(|| {
        let metadata = metadata(model);
        let tokenizer = TextTokenizer::from_gguf(&metadata).expect("tokenizer from GGUF");
        Loaded {
            golden: golden(model),
            tokenizer,
            metadata,
        }
    })
}

/// Every golden text must tokenize to llama.cpp's ids, with and without special-token parsing.
fn check_ids(model: &str) {
    let Loaded {
        golden, tokenizer, ..
    } = load(model);
    assert!(
        golden.cases.len() >= 25,
        "{model}: only {} golden texts",
        golden.cases.len()
    );
    let mut failures = Vec::new();
    for case in &golden.cases {
        let ids = tokenizer.encode(&case.text, false, true).expect("encode");
        if ids != case.ids {
            failures.push(format!(
                "{:?}\n   ours  {ids:?}\n   llama {:?}",
                case.text, case.ids
            ));
        }
        let plain = tokenizer.encode(&case.text, false, false).expect("encode");
        if plain != case.ids_plain {
            failures.push(format!(
                "{:?} (special tokens as text)\n   ours  {plain:?}\n   llama {:?}",
                case.text, case.ids_plain
            ));
        }
    }
    let total = golden.cases.len() * 2;
    eprintln!(
        "{model}: {}/{total} encodings match {}",
        total - failures.len(),
        golden.producer
    );
    assert!(
        failures.is_empty(),
        "{model}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// decode(encode(s)) == s, in one go and streamed one id at a time.
fn check_round_trip(model: &str) {
    let Loaded {
        golden, tokenizer, ..
    } = load(model);
    for case in &golden.cases {
        let ids = tokenizer.encode(&case.text, false, true).expect("encode");
        let text = tokenizer.decode(&ids, false).expect("decode");
        assert_eq!(text, case.text, "{model}: decode(encode(s)) != s");
        let mut stream = tokenizer.stream_decoder(false);
        let mut streamed = String::new();
        for &id in &ids {
            if let Some(piece) = stream.step(tokenizer, id).expect("stream step") {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "{model}: partial character in {piece:?}"
                );
                streamed.push_str(&piece);
            }
        }
        streamed.extend(stream.flush(tokenizer).expect("flush"));
        assert_eq!(streamed, case.text, "{model}: streamed decode != s");
    }
}

/// The model's own template renders the golden conversations exactly as jinja2 did.
fn check_chat_template(model: &str) {
    let Loaded {
        golden,
        tokenizer,
        metadata,
    } = load(model);
    let source = match metadata.get("tokenizer.chat_template") {
        Some(gguf_file::Value::String(s)) => s.clone(),
        other => panic!("{model}: no tokenizer.chat_template string: {other:?}"),
    };
    assert_eq!(tokenizer.chat_template(), Some(source.as_str()));
    let bos = tokenizer.bos_token().expect("bos text");
    let eos = tokenizer.eos_token().expect("eos text");
    let template = ChatTemplate::new(&source, &bos, &eos).expect("template compiles");
    assert!(!golden.chats.is_empty());
    for chat in &golden.chats {
        let rendered = template
            .render(&chat.messages, chat.add_generation_prompt)
            .expect("render");
        assert_eq!(rendered, chat.expected, "{model}: {:?}", chat.messages);
        // The rendered prompt must tokenize with its role markers as single special tokens.
        let ids = tokenizer.encode(&rendered, false, true).expect("encode");
        let im_start = tokenizer
            .inner()
            .token_to_id("<|im_start|>")
            .expect("<|im_start|>");
        let turns = chat.messages.len() + usize::from(chat.add_generation_prompt);
        let num_im_start = ids.iter().filter(|&&id| id == im_start).count();
        assert!(
            num_im_start >= turns,
            "{model}: {num_im_start} <|im_start|> for {turns} turns"
        );
    }
}

fn check_special_ids(model: &str, eos_texts: &[&str]) {
    let Loaded { tokenizer, .. } = load(model);
    let eos = tokenizer.eos_token_id().expect("eos id");
    assert!(tokenizer.is_eos(eos));
    for text in eos_texts {
        let id = tokenizer.inner().token_to_id(text).expect(text);
        assert!(
            tokenizer.eos_token_ids().contains(&id),
            "{model}: {text} not an eos id"
        );
    }
    assert!(
        !tokenizer.add_bos(),
        "{model}: GGUF says add_bos_token = false"
    );
}

const QWEN: &str = "qwen2.5-coder-0.5b";
const SMOLLM: &str = "smollm2-135m";

#[test]
fn qwen_ids_match_llama_cpp() {
    check_ids(QWEN);
}

#[test]
fn smollm_ids_match_llama_cpp() {
    check_ids(SMOLLM);
}

#[test]
fn qwen_round_trip() {
    check_round_trip(QWEN);
}

#[test]
fn smollm_round_trip() {
    check_round_trip(SMOLLM);
}

#[test]
fn qwen_chat_template() {
    check_chat_template(QWEN);
}

#[test]
fn smollm_chat_template() {
    check_chat_template(SMOLLM);
}

#[test]
fn qwen_special_ids() {
    check_special_ids(QWEN, &["<|im_end|>", "<|endoftext|>"]);
}

#[test]
fn smollm_special_ids() {
    check_special_ids(SMOLLM, &["<|im_end|>", "<|endoftext|>"]);
}
