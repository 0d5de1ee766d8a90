//! The long-context prompt: the whole corpus first, the question last, rendered through the
//! model's chat template and tokenized in two parts so the corpus part is the same token
//! sequence for every question. That part is pinned (and persisted) in the long-context model's
//! cache when the corpus is loaded; an escalation then prefills only the question.

use std::collections::HashMap;

use triage_models::chat_template::ChatMessage;
use triage_models::model::Model;
use triage_retrieval::Corpus;

use crate::error::{Result, RouterError};
use crate::generator::{Generator, ModelRole};
use crate::{RoutePath, RoutingConfig};

/// Tokens kept free after a corpus prefix for the question and the answer.
pub const QUESTION_HEADROOM: usize = 256;

/// A corpus's long-context form, or why it has none.
pub type LongContextOrWhy = std::result::Result<LongContextPrompt, String>;

/// The long-context prompt of `corpus`, or why it has none: the lc path is not allowed, the
/// corpus is empty, or it is too long for the model with a question and an answer.
pub fn long_context_prompt(
    generator: &mut dyn Generator,
    corpus: &Corpus,
    config: &RoutingConfig,
) -> Result<LongContextOrWhy> {
    if !config.allows(RoutePath::Lc) {
        return Ok(Err("the lc path is not allowed".into()));
    }
    if corpus.chunks().is_empty() {
        return Ok(Err("the corpus is empty".into()));
    }
    let model = generator.model(ModelRole::LongContext)?;
    let lc = LongContextPrompt::new(&model, &corpus_text(corpus))?;
    let limit = model.context_length();
    let needed = lc.prefix.len() + QUESTION_HEADROOM + config.lc_max_tokens;
    if needed > limit {
        return Ok(Err(format!(
            "the corpus is {} tokens; with the question and answer it needs {needed}, the \
             long-context model holds {limit}",
            lc.prefix.len()
        )));
    }
    Ok(Ok(lc))
}

const SYSTEM: &str = "You answer questions about the documents the user provides. Answer with \
the answer only, in a few words, taken from the documents.";

/// Stands for the question while the template renders; split out afterwards.
const MARKER: &str = "\u{1}QUESTION\u{1}";

/// The documents of `corpus` reassembled from their chunks (overlaps removed, the whitespace
/// between chunks as it was), in the corpus's
/// order (documents added later come last, so an appended document leaves the tokens before it,
/// and their cached blocks, as they were), each under a `[doc_id] title` line.
pub fn corpus_text(corpus: &Corpus) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut docs: HashMap<&str, Vec<&triage_retrieval::Chunk>> = HashMap::new();
    for chunk in corpus.chunks() {
        let entry = docs.entry(chunk.doc_id.as_str()).or_insert_with(|| {
            order.push(chunk.doc_id.as_str());
            Vec::new()
        });
        entry.push(chunk);
    }
    let docs = order
        .into_iter()
        .filter_map(|id| docs.remove(id).map(|c| (id, c)));
    let mut out = String::new();
    for (doc_id, mut chunks) in docs {
        chunks.sort_by_key(|c| (c.start, c.end));
        let title = chunks.first().map_or("", |c| c.title.as_str());
        out.push_str(&format!("[{doc_id}] {title}\n"));
        let mut end = 0;
        for c in chunks {
            if c.end <= end {
                continue;
            }
            // Chunk boundaries are token boundaries of the document, so `end - start` falls on a
            // character boundary of `c.text` (which is the document's `start..end`).
            let skip = end.saturating_sub(c.start);
            let piece = c.text.get(skip..).unwrap_or(&c.text);
            if c.start > end && end > 0 {
                // The document's own whitespace; a corpus stored before chunks kept it has none.
                out.push_str(if c.separator.is_empty() {
                    " "
                } else {
                    &c.separator
                });
            }
            out.push_str(piece);
            end = c.end;
        }
        out.push_str("\n\n");
    }
    out
}

/// A corpus prepared for one long-context model.
#[derive(Debug, Clone)]
pub struct LongContextPrompt {
    /// The shared part: template opening, instructions and the whole corpus.
    pub prefix: Vec<u32>,
    /// The template's text after the question (closing the user turn, opening the answer).
    suffix_after_question: String,
}

impl LongContextPrompt {
    /// Render the long-context chat for `corpus_text` with `model`'s template. The corpus and the
    /// questions are message text: special-token strings in them stay text.
    pub fn new(model: &Model, corpus_text: &str) -> Result<Self> {
        let documents = format!("Documents:\n\n{corpus_text}");
        let user = format!("{documents}Question: {MARKER}");
        let messages = [
            ChatMessage::new("system", SYSTEM),
            ChatMessage::new("user", user),
        ];
        let parts = model
            .chat_template
            .render_parts(&messages, true)?
            .filter(|p| p.len() == 5)
            .ok_or_else(|| {
                RouterError::Invalid(
                    "the long-context model's chat template rewrites message text, so the \
                     corpus prefix cannot be cut from it"
                        .into(),
                )
            })?;
        // The prefix ends where the corpus does; "Question: " travels with each question, so a
        // tokenizer merge across the boundary can never change the cached tokens.
        let mut prefix = model.tokenizer.encode_parts(&parts[..3])?;
        prefix.extend(model.tokenizer.encode(&documents, false, false)?);
        Ok(Self {
            prefix,
            suffix_after_question: parts[4].text().to_string(),
        })
    }

    /// The full prompt for `question`: the cached prefix, then the question's own tokens.
    pub fn tokens(&self, model: &Model, question: &str) -> Result<Vec<u32>> {
        let mut ids = self.prefix.clone();
        let asked = format!("Question: {}", question.trim());
        ids.extend(model.tokenizer.encode(&asked, false, false)?);
        ids.extend(
            model
                .tokenizer
                .encode(&self.suffix_after_question, false, true)?,
        );
        Ok(ids)
    }
}
