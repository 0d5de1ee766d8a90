//! Tokenizers: built from GGUF metadata the way llama.cpp reads it, or loaded from `tokenizer.json`.
//!
//! GGUF files carry a gpt2-style byte-level BPE vocabulary plus a `tokenizer.ggml.pre` name. llama.cpp
//! maps that name to a list of split regexes applied one after another; we rebuild exactly that as a
//! `tokenizers` pipeline (Split per regex, then ByteLevel without prefix space, then BPE). Names we do
//! not know are refused rather than guessed: a wrong split silently changes every prompt's tokens.
//! We never use candle's GGUF tokenizer helper: it adds a prefix space, which corrupts chat templates.

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{
    AddedToken, PaddingParams, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use crate::{ModelError, Result};

// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Token texts that end a turn in common chat formats. llama.cpp detects its end-of-generation set
/// by these texts too, because converters often record only one eos id.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<EOT>",
    "<end_of_utterance>",
];

// Split regexes, with llama.cpp's semantics (case-insensitive contractions spelled out).
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SINGLE_DIGIT_SPLIT: &str = r"\p{N}";

/// How one `tokenizer.ggml.pre` family splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PreTokenizerSpec {
    /// Applied in order; each regex splits the pieces the previous one left (matches kept).
    regexes: &'static [&'static str],
    /// A piece that is already a vocabulary entry becomes one token without merging (llama3).
    ignore_merges: bool,
    /// Whether llama.cpp adds BOS when the file has no `tokenizer.ggml.add_bos_token`.
    default_add_bos: bool,
}

/// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value; unknown names are an error.
fn pre_tokenizer_spec(pre: &str) -> Result<PreTokenizerSpec> {
    let spec = |regexes, ignore_merges, default_add_bos| PreTokenizerSpec {
        regexes,
        ignore_merges,
        default_add_bos,
    };
    match pre {
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => {
            Ok(spec(&[QWEN2_SPLIT], false, false))
        }
        "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" | "exaone" | "minerva-7b" => {
            Ok(spec(&[SINGLE_DIGIT_SPLIT, GPT2_SPLIT], false, false))
        }
        "gpt-2" | "phi-2" | "mpt" | "olmo" => Ok(spec(&[GPT2_SPLIT], false, false)),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => Ok(spec(&[LLAMA3_SPLIT], true, true)),
        other => Err(ModelError::UnknownPreTokenizer(other.to_string())),
    }
}

/// Builds a `tokenizers::Tokenizer` from GGUF metadata (gpt2-style BPE only), matching llama.cpp's
/// tokenization: control tokens become special added tokens (parsed only when special tokens are),
/// user-defined tokens become ordinary added tokens (always parsed), BOS/EOS are added by the
/// post-processor when `add_special_tokens` is set and the file asks for them.
pub fn tokenizer_from_gguf(metadata: &HashMap<String, Value>) -> Result<Tokenizer> {
    let model = meta_str(metadata, "tokenizer.ggml.model")?
        .ok_or_else(|| ModelError::MissingMetadata("tokenizer.ggml.model".into()))?;
    if model != "gpt2" {
        return Err(ModelError::UnsupportedTokenizerModel(model.to_string()));
    }
    let pre = meta_str(metadata, "tokenizer.ggml.pre")?
        .ok_or_else(|| ModelError::MissingMetadata("tokenizer.ggml.pre".into()))?;
    let spec = pre_tokenizer_spec(pre)?;
    let tokens = gguf_tokens(metadata)?;
    let token_types = meta_int_array(metadata, "tokenizer.ggml.token_type")?;
    if let Some(types) = &token_types {
        if types.len() != tokens.len() {
            return Err(ModelError::Tokenizer(format!(
                "{} token types for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
    }
    let merges = gguf_merges(metadata)?;
    let vocab = build_vocab(&tokens)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(tok_err)?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(build_pre_tokenizer(&spec)?));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    if let Some(types) = &token_types {
        add_gguf_added_tokens(&mut tokenizer, &tokens, types)?;
    }
    let ids = GgufSpecialIds::read(metadata, tokens.len(), spec.default_add_bos)?;
    install_post_processor(&mut tokenizer, &tokens, &ids)?;
    if let Some(pad) = ids.pad {
        tokenizer.with_padding(Some(PaddingParams {
            pad_id: pad,
            pad_token: tokens[pad as usize].clone(),
            ..PaddingParams::default()
        }));
    }
    Ok(tokenizer)
}

fn tok_err(err: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(err.to_string())
}

fn build_pre_tokenizer(spec: &PreTokenizerSpec) -> Result<PreTokenizerWrapper> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for regex in spec.regexes {
        let pattern = SplitPattern::Regex((*regex).to_string());
        let split =
            Split::new(pattern, SplitDelimiterBehavior::Isolated, false).map_err(tok_err)?;
        steps.push(split.into());
    }
    // The regexes above already split; ByteLevel only maps bytes to its printable alphabet.
    let byte_level = tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, false, false);
    steps.push(byte_level.into());
    Ok(Sequence::new(steps).into())
}

/// The token texts, with empty entries renamed the way llama.cpp renames them.
fn gguf_tokens(metadata: &HashMap<String, Value>) -> Result<Vec<String>> {
    let tokens = meta_str_array(metadata, "tokenizer.ggml.tokens")?
        .ok_or_else(|| ModelError::MissingMetadata("tokenizer.ggml.tokens".into()))?;
    Ok(tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.to_string()
            }
        })
        .collect())
}

/// Merges are "left right"; the separator is the first space after the first byte, as llama.cpp
/// reads them (a left part can never be empty).
fn gguf_merges(metadata: &HashMap<String, Value>) -> Result<Merges> {
    let merges = meta_str_array(metadata, "tokenizer.ggml.merges")?
        .ok_or_else(|| ModelError::MissingMetadata("tokenizer.ggml.merges".into()))?;
    merges
        .into_iter()
        .map(|merge| {
            let pos = merge.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
            match pos {
                // The space is ASCII, so `pos` and `pos + 1` are char boundaries.
                Some(pos) => Ok((merge[..pos].to_string(), merge[pos + 1..].to_string())),
                None => Err(ModelError::Tokenizer(format!("malformed merge {merge:?}"))),
            }
        })
        .collect()
}

fn build_vocab(tokens: &[String]) -> Result<Vocab> {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(tok_err)?;
        if let Some(first) = vocab.insert(token.clone(), id) {
            // llama.cpp rejects such files too: one of the two ids could never be produced.
            return Err(ModelError::Tokenizer(format!(
                "token {token:?} appears twice (ids {first} and {id})"
            )));
        }
    }
    Ok(vocab)
}

/// Control and unknown tokens are special (split out only when parsing special tokens);
/// user-defined tokens are always split out, as llama.cpp does.
fn add_gguf_added_tokens(
    tokenizer: &mut Tokenizer,
    tokens: &[String],
    types: &[i64],
) -> Result<()> {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (token, &ty) in tokens.iter().zip(types) {
        match ty {
            TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => {
                special.push(AddedToken::from(token.clone(), true).normalized(false));
            }
            TOKEN_TYPE_USER_DEFINED => {
                user.push(AddedToken::from(token.clone(), false).normalized(false));
            }
            _ => {}
        }
    }
    tokenizer.add_special_tokens(special).map_err(tok_err)?;
    tokenizer.add_tokens(user).map_err(tok_err)?;
    // Added tokens that are vocabulary entries keep their ids; check that none got a new one.
    let size = tokenizer.get_vocab_size(true);
    if size != tokens.len() {
        return Err(ModelError::Tokenizer(format!(
            "added tokens grew the vocabulary from {} to {size}",
            tokens.len()
        )));
    }
    Ok(())
}

/// Special token ids and BOS/EOS flags as llama.cpp reads them from GGUF metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct GgufSpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

impl GgufSpecialIds {
    fn read(md: &HashMap<String, Value>, num_tokens: usize, default_add_bos: bool) -> Result<Self> {
        let id = |key: &str| -> Result<Option<u32>> {
            match meta_u32(md, key)? {
                Some(id) if id as usize >= num_tokens => Err(ModelError::Tokenizer(format!(
                    "{key} = {id} is outside the vocabulary ({num_tokens} tokens)"
                ))),
                other => Ok(other),
            }
        };
        Ok(Self {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: meta_bool(md, "tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos),
            add_eos: meta_bool(md, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
        })
    }
}

/// Adds BOS/EOS around encodings when `add_special_tokens` is set and the file asks for it.
fn install_post_processor(
    tokenizer: &mut Tokenizer,
    tokens: &[String],
    ids: &GgufSpecialIds,
) -> Result<()> {
    let mut single = Vec::new();
    let mut specials = Vec::new();
    // Template keys are our own names, so token texts containing ':' or '$' cannot confuse the
    // template parser.
    let mut push_special = |key: &str, id: Option<u32>, flag_name: &str| -> Result<()> {
        let id = id.ok_or_else(|| {
            ModelError::Tokenizer(format!("{flag_name} is set but the token id is missing"))
        })?;
        let text = tokens[id as usize].clone();
        specials.push(SpecialToken::new(key.to_string(), vec![id], vec![text]).map_err(tok_err)?);
        Ok(())
    };
    if ids.add_bos {
        push_special("bos", ids.bos, "tokenizer.ggml.add_bos_token")?;
        single.push("bos");
    }
    single.push("$A");
    if ids.add_eos {
        push_special("eos", ids.eos, "tokenizer.ggml.add_eos_token")?;
        single.push("eos");
    }
    if specials.is_empty() {
        return Ok(());
    }
    let pair: Vec<String> = single
        .iter()
        .map(|p| p.to_string())
        .chain(single.iter().map(|p| {
            if *p == "$A" {
                "$B:1".to_string()
            } else {
                p.to_string()
            }
        }))
        .collect();
    let processor = TemplateProcessing::builder()
        .try_single(single)
        .map_err(tok_err)?
        .try_pair(pair)
        .map_err(tok_err)?
        .special_tokens(specials)
        .build()
        .map_err(tok_err)?;
    tokenizer.with_post_processor(Some(processor));
    Ok(())
}

// ---- GGUF metadata access (integer types vary between converters) ----

fn type_err(key: &str, expected: &str, found: &Value) -> ModelError {
    ModelError::Tokenizer(format!(
        "metadata {key}: expected {expected}, found {:?}",
        found.value_type()
    ))
}

fn meta_str<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<Option<&'a str>> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(type_err(key, "a string", other)),
    }
}

fn meta_bool(md: &HashMap<String, Value>, key: &str) -> Result<Option<bool>> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(type_err(key, "a bool", other)),
    }
}

fn value_as_i64(value: &Value) -> Option<i64> {
    match value {
        Value::U8(v) => Some(i64::from(*v)),
        Value::I8(v) => Some(i64::from(*v)),
        Value::U16(v) => Some(i64::from(*v)),
        Value::I16(v) => Some(i64::from(*v)),
        Value::U32(v) => Some(i64::from(*v)),
        Value::I32(v) => Some(i64::from(*v)),
        Value::U64(v) => i64::try_from(*v).ok(),
        Value::I64(v) => Some(*v),
        _ => None,
    }
}

fn meta_u32(md: &HashMap<String, Value>, key: &str) -> Result<Option<u32>> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => value_as_i64(v)
            .and_then(|i| u32::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| type_err(key, "a non-negative integer", v)),
    }
}

fn meta_array<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<Option<&'a [Value]>> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(other) => Err(type_err(key, "an array", other)),
    }
}

fn meta_str_array<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(items) = meta_array(md, key)? else {
        return Ok(None);
    };
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.as_str()),
            other => Err(type_err(key, "an array of strings", other)),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn meta_int_array(md: &HashMap<String, Value>, key: &str) -> Result<Option<Vec<i64>>> {
    let Some(items) = meta_array(md, key)? else {
        return Ok(None);
    };
    items
        .iter()
        .map(|v| value_as_i64(v).ok_or_else(|| type_err(key, "an array of integers", v)))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

// ---- The wrapper the engine uses ----

/// A tokenizer with the ids and texts the engine needs: BOS/EOS, the end-of-generation set, the
/// chat template source, plus encoding with or without parsing special tokens.
pub struct TextTokenizer {
    tokenizer: Tokenizer,
    /// Clone of `tokenizer` that treats special-token texts as plain text; built on first use.
    literal_specials: OnceLock<Tokenizer>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_id", &self.eos_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("add_bos", &self.add_bos)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl TextTokenizer {
    /// From GGUF metadata: see [`tokenizer_from_gguf`]. The chat template is
    /// `tokenizer.chat_template` when present.
    pub fn from_gguf(metadata: &HashMap<String, Value>) -> Result<Self> {
        let tokenizer = tokenizer_from_gguf(metadata)?;
        let num_tokens = tokenizer.get_vocab_size(true);
        let ids = GgufSpecialIds::read(metadata, num_tokens, false)?;
        let declared = [ids.eos, ids.eot, ids.eom].into_iter().flatten().collect();
        let chat_template = meta_str(metadata, "tokenizer.chat_template")?.map(str::to_string);
        Self::assemble(tokenizer, ids.bos, ids.eos, declared, chat_template)
    }

    /// From a `tokenizer.json` (safetensors models). BOS/EOS texts and the chat template come from
    /// `tokenizer_config.json` beside it, extra end ids from `generation_config.json`, when present.
    pub fn from_tokenizer_json(path: &Path) -> Result<Self> {
        let tokenizer = Tokenizer::from_file(path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        let config = read_json_if_exists(&dir.join("tokenizer_config.json"))?;
        let token_id = |field: &str| -> Result<Option<u32>> {
            let Some(text) = config
                .as_ref()
                .and_then(|c| token_text_field(c.get(field)?))
            else {
                return Ok(None);
            };
            tokenizer.token_to_id(&text).map(Some).ok_or_else(|| {
                ModelError::Tokenizer(format!("{field} {text:?} is not in the vocabulary"))
            })
        };
        let bos = token_id("bos_token")?;
        let eos = token_id("eos_token")?;
        let mut declared: Vec<u32> = eos.into_iter().collect();
        if let Some(gen) = read_json_if_exists(&dir.join("generation_config.json"))? {
            declared.extend(json_ids(gen.get("eos_token_id")));
        }
        let chat_template = config.as_ref().and_then(chat_template_field);
        Self::assemble(tokenizer, bos, eos, declared, chat_template)
    }

    fn assemble(
        tokenizer: Tokenizer,
        bos_token_id: Option<u32>,
        eos_token_id: Option<u32>,
        declared_eos: Vec<u32>,
        chat_template: Option<String>,
    ) -> Result<Self> {
        let mut eos_token_ids = declared_eos;
        eos_token_ids.extend(
            END_OF_TURN_TEXTS
                .iter()
                .filter_map(|t| tokenizer.token_to_id(t)),
        );
        let mut seen = std::collections::HashSet::new();
        eos_token_ids.retain(|id| seen.insert(*id));
        // Whatever the source says, what counts is whether encoding with specials adds BOS.
        let empty = tokenizer.encode_fast("", true).map_err(tok_err)?;
        let add_bos = bos_token_id.is_some() && empty.get_ids().first() == bos_token_id.as_ref();
        Ok(Self {
            tokenizer,
            literal_specials: OnceLock::new(),
            bos_token_id,
            eos_token_id,
            eos_token_ids,
            add_bos,
            chat_template,
        })
    }

    /// Token ids of `text`. `add_special` adds BOS/EOS as the model asks; `parse_special` turns
    /// special-token texts such as `<|im_start|>` into their ids (otherwise they are plain text).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let tokenizer = if parse_special {
            &self.tokenizer
        } else {
            self.literal_tokenizer()
        };
        let encoding = tokenizer.encode_fast(text, add_special).map_err(tok_err)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of a rendered chat: the template's text with its special tokens parsed, the
    /// messages' text with special-token strings kept as text.
    pub fn encode_parts(&self, parts: &[crate::chat_template::PromptPart]) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        for part in parts {
            match part {
                crate::chat_template::PromptPart::Template(t) => {
                    ids.extend(self.encode(t, false, true)?)
                }
                crate::chat_template::PromptPart::Content(t) => {
                    ids.extend(self.encode(t, false, false)?)
                }
            }
        }
        Ok(ids)
    }

    /// The first special token (`<|im_end|>`, ...) written out in `text`, if any.
    pub fn special_token_in(&self, text: &str) -> Option<String> {
        self.tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .find(|c| text.contains(c.as_str()))
    }

    fn literal_tokenizer(&self) -> &Tokenizer {
        self.literal_specials.get_or_init(|| {
            let mut tokenizer = self.tokenizer.clone();
            tokenizer.set_encode_special_tokens(true);
            tokenizer
        })
    }

    /// Text of `ids`; invalid UTF-8 becomes U+FFFD. `skip_special` drops special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.tokenizer.decode(ids, skip_special).map_err(tok_err)
    }

    /// A streaming decoder for one generated sequence.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder {
        StreamDecoder::new(skip_special)
    }

    /// The BOS id, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// The EOS id the model file names, if any.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// Every id that ends generation: the declared eos/eot/eom ids plus the end-of-turn tokens
    /// (`<|im_end|>`, `<|endoftext|>`, ...) present in the vocabulary.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The text of the BOS token, for chat templates (empty when there is none).
    pub fn bos_token(&self) -> Result<String> {
        self.token_text(self.bos_token_id)
    }

    /// The text of the EOS token, for chat templates (empty when there is none).
    pub fn eos_token(&self) -> Result<String> {
        self.token_text(self.eos_token_id)
    }

    fn token_text(&self, id: Option<u32>) -> Result<String> {
        id.map_or(Ok(String::new()), |id| self.decode(&[id], false))
    }

    /// The model's own chat template source, if it ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

fn read_json_if_exists(path: &Path) -> Result<Option<serde_json::Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))
}

/// `"<s>"` or `{"content": "<s>", ...}` (AddedToken form).
fn token_text_field(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(map) => map.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `"..."` or `[{"name": "default", "template": "..."}, ...]`.
fn chat_template_field(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(named) => {
            let template_of =
                |v: &serde_json::Value| v.get("template")?.as_str().map(str::to_string);
            named
                .iter()
                .find(|v| v.get("name").and_then(|n| n.as_str()) == Some("default"))
                .or_else(|| named.first())
                .and_then(template_of)
        }
        _ => None,
    }
}

/// An id or a list of ids (`generation_config.json`'s `eos_token_id`).
fn json_ids(value: Option<&serde_json::Value>) -> Vec<u32> {
    let as_id = |v: &serde_json::Value| v.as_u64().and_then(|i| u32::try_from(i).ok());
    match value {
        Some(serde_json::Value::Array(items)) => items.iter().filter_map(as_id).collect(),
        Some(v) => as_id(v).into_iter().collect(),
        None => Vec::new(),
    }
}

/// Most tokens one UTF-8 character can be spread over in a byte-level vocabulary; past this many
/// pending tokens the text is not going to become valid, so it is emitted lossily.
const MAX_PENDING_TOKENS: usize = 8;

/// Turns generated ids into text incrementally, emitting only complete characters: a character
/// whose UTF-8 bytes are split across tokens is held back until its last byte arrives.
///
/// It keeps a short window of recent ids and emits the difference between decoding the window with
/// and without the unemitted ids, so decoders that depend on context (leading-space rules) work too.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    skip_special: bool,
    window: Vec<u32>,
    /// `window[..num_emitted]` has been emitted; its text is `emitted_text`.
    num_emitted: usize,
    emitted_text: String,
}

impl StreamDecoder {
    /// An empty decoder; `skip_special` drops special tokens from the text.
    pub fn new(skip_special: bool) -> Self {
        Self {
            skip_special,
            window: Vec::new(),
            num_emitted: 0,
            emitted_text: String::new(),
        }
    }

    /// Feeds one id; returns the newly completed text, if any.
    pub fn step(&mut self, tokenizer: &TextTokenizer, id: u32) -> Result<Option<String>> {
        self.window.push(id);
        let text = tokenizer.decode(&self.window, self.skip_special)?;
        let pending = self.window.len() - self.num_emitted;
        if text.ends_with(char::REPLACEMENT_CHARACTER) && pending < MAX_PENDING_TOKENS {
            return Ok(None);
        }
        let Some(new_text) = text.strip_prefix(self.emitted_text.as_str()) else {
            // The decoder rewrote earlier text (context-dependent); restart the window here.
            return self.restart_window(tokenizer);
        };
        if new_text.is_empty() {
            return Ok(None);
        }
        let new_text = new_text.to_string();
        // The ids just emitted become the context for the next ones.
        self.window.drain(..self.num_emitted);
        self.num_emitted = self.window.len();
        self.emitted_text = tokenizer.decode(&self.window, self.skip_special)?;
        Ok(Some(new_text))
    }

    fn restart_window(&mut self, tokenizer: &TextTokenizer) -> Result<Option<String>> {
        let pending = self.window.split_off(self.num_emitted);
        let text = tokenizer.decode(&pending, self.skip_special)?;
        self.window = pending;
        self.num_emitted = self.window.len();
        self.emitted_text = text.clone();
        Ok((!text.is_empty()).then_some(text))
    }

    /// Emits whatever is still held back (lossily), at the end of generation.
    pub fn flush(&mut self, tokenizer: &TextTokenizer) -> Result<Option<String>> {
        if self.num_emitted == self.window.len() {
            return Ok(None);
        }
        let text = tokenizer.decode(&self.window, self.skip_special)?;
        let rest = match text.strip_prefix(self.emitted_text.as_str()) {
            Some(rest) => rest.to_string(),
            None => tokenizer.decode(&self.window[self.num_emitted..], self.skip_special)?,
        };
        self.num_emitted = self.window.len();
        self.emitted_text = text;
        Ok((!rest.is_empty()).then_some(rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's byte-to-printable-char map.
    fn byte_chars() -> Vec<char> {
        let printable =
            |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut next = 256u32;
        (0u8..=255)
            .map(|b| {
                if printable(b) {
                    char::from(b)
                } else {
                    let c = char::from_u32(next).unwrap();
                    next += 1;
                    c
                }
            })
            .collect()
    }

    /// A toy GGUF vocabulary: the 256 byte tokens, a few merges, two control tokens and one
    /// user-defined token.
    fn toy_metadata(pre: &str) -> HashMap<String, Value> {
        let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
        let merges = ["h e", "l l", "he ll", "Ġ w"];
        for m in merges {
            tokens.push(m.replace(' ', ""));
        }
        let mut types = vec![1i32; tokens.len()];
        for (text, ty) in [("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool_call>", 4)] {
            tokens.push(text.to_string());
            types.push(ty);
        }
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        let im_end = (tokens.len() - 2) as u32;
        HashMap::from([
            (
                "tokenizer.ggml.model".to_string(),
                Value::String("gpt2".into()),
            ),
            ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
            ("tokenizer.ggml.tokens".to_string(), strings(tokens)),
            (
                "tokenizer.ggml.merges".to_string(),
                strings(merges.map(String::from).to_vec()),
            ),
            (
                "tokenizer.ggml.token_type".to_string(),
                Value::Array(types.into_iter().map(Value::I32).collect()),
            ),
            (
                "tokenizer.ggml.eos_token_id".to_string(),
                Value::U32(im_end),
            ),
            ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(0)),
            (
                "tokenizer.ggml.add_bos_token".to_string(),
                Value::Bool(false),
            ),
        ])
    }

    #[test]
    fn text_tokenizer_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TextTokenizer>();
        assert_send_sync::<StreamDecoder>();
    }

    #[test]
    fn unknown_pre_tokenizer_is_refused() {
        let err = TextTokenizer::from_gguf(&toy_metadata("mystery")).unwrap_err();
        assert!(
            matches!(err, ModelError::UnknownPreTokenizer(ref p) if p == "mystery"),
            "{err}"
        );
    }

    #[test]
    fn non_bpe_model_is_refused() {
        let mut md = toy_metadata("qwen2");
        md.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        let err = TextTokenizer::from_gguf(&md).unwrap_err();
        assert!(
            matches!(err, ModelError::UnsupportedTokenizerModel(_)),
            "{err}"
        );
    }

    #[test]
    fn missing_pre_tokenizer_is_an_error() {
        let mut md = toy_metadata("qwen2");
        md.remove("tokenizer.ggml.pre");
        let err = TextTokenizer::from_gguf(&md).unwrap_err();
        assert!(matches!(err, ModelError::MissingMetadata(_)), "{err}");
    }

    #[test]
    fn merges_and_special_tokens() {
        let tok = TextTokenizer::from_gguf(&toy_metadata("qwen2")).unwrap();
        let hello = tok.encode("hello", false, true).unwrap();
        assert_eq!(tok.decode(&hello, false).unwrap(), "hello");
        assert_eq!(hello.len(), 2, "he+ll merged, then o: {hello:?}");
        let im_start = tok.inner().token_to_id("<|im_start|>").unwrap();
        assert_eq!(
            tok.encode("<|im_start|>", false, true).unwrap(),
            vec![im_start]
        );
        let literal = tok.encode("<|im_start|>", false, false).unwrap();
        assert!(
            literal.len() > 1 && !literal.contains(&im_start),
            "{literal:?}"
        );
        // User-defined tokens are split out even when special tokens are not parsed.
        let tool = tok.inner().token_to_id("<tool_call>").unwrap();
        assert_eq!(tok.encode("<tool_call>", false, false).unwrap(), vec![tool]);
        assert_eq!(tok.decode(&[im_start, tool], true).unwrap(), "<tool_call>");
    }

    #[test]
    fn eos_ids_include_end_of_turn_tokens() {
        let tok = TextTokenizer::from_gguf(&toy_metadata("smollm")).unwrap();
        let im_end = tok.inner().token_to_id("<|im_end|>").unwrap();
        assert_eq!(tok.eos_token_id(), Some(im_end));
        assert_eq!(tok.eos_token_ids(), &[im_end]);
        assert!(tok.is_eos(im_end));
        assert_eq!(tok.eos_token().unwrap(), "<|im_end|>");
    }

    #[test]
    fn add_bos_follows_metadata() {
        let mut md = toy_metadata("qwen2");
        let tok = TextTokenizer::from_gguf(&md).unwrap();
        assert!(!tok.add_bos());
        assert_eq!(tok.encode("he", true, true).unwrap().len(), 1);
        md.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(true));
        let tok = TextTokenizer::from_gguf(&md).unwrap();
        assert!(tok.add_bos());
        let ids = tok.encode("he", true, true).unwrap();
        assert_eq!(ids[0], tok.bos_token_id().unwrap());
        assert_eq!(ids.len(), 2);
        assert_eq!(tok.encode("he", false, true).unwrap().len(), 1);
    }

    #[test]
    fn smollm_splits_digits() {
        let tok = TextTokenizer::from_gguf(&toy_metadata("smollm")).unwrap();
        assert_eq!(tok.encode("123", false, true).unwrap().len(), 3);
    }

    #[test]
    fn stream_decoder_holds_back_split_characters() {
        let tok = TextTokenizer::from_gguf(&toy_metadata("qwen2")).unwrap();
        let text = "héllo 中文 😀 world<|im_end|>";
        let ids = tok.encode(text, false, true).unwrap();
        let mut stream = tok.stream_decoder(false);
        let mut out = String::new();
        let mut pieces = 0;
        for &id in &ids {
            if let Some(piece) = stream.step(&tok, id).unwrap() {
                assert!(!piece.contains(char::REPLACEMENT_CHARACTER), "{piece:?}");
                out.push_str(&piece);
                pieces += 1;
            }
        }
        assert_eq!(stream.flush(&tok).unwrap(), None);
        assert_eq!(out, text);
        assert!(
            pieces < ids.len(),
            "multi-byte characters must be held back"
        );
    }

    #[test]
    fn stream_decoder_flushes_incomplete_tail() {
        let tok = TextTokenizer::from_gguf(&toy_metadata("qwen2")).unwrap();
        let ids = tok.encode("a中", false, true).unwrap();
        let mut stream = tok.stream_decoder(true);
        let mut out = String::new();
        for &id in &ids[..ids.len() - 1] {
            out.extend(stream.step(&tok, id).unwrap());
        }
        assert_eq!(out, "a");
        assert_eq!(stream.flush(&tok).unwrap().as_deref(), Some("\u{FFFD}"));
    }

    #[test]
    fn tokenizer_json_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = tokenizer_from_gguf(&toy_metadata("qwen2")).unwrap();
        let path = dir.path().join("tokenizer.json");
        gguf.save(&path, false).unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"eos_token": {"content": "<|im_end|>"}, "chat_template": "{{ messages }}"}"#,
        )
        .unwrap();
        let tok = TextTokenizer::from_tokenizer_json(&path).unwrap();
        let im_end = tok.inner().token_to_id("<|im_end|>").unwrap();
        assert_eq!(tok.eos_token_id(), Some(im_end));
        assert_eq!(tok.chat_template(), Some("{{ messages }}"));
        assert_eq!(tok.bos_token_id(), None);
        let ids = tok.encode("hello <|im_end|>", false, true).unwrap();
        assert_eq!(
            ids,
            gguf.encode_fast("hello <|im_end|>", false)
                .unwrap()
                .get_ids()
        );
    }
}
