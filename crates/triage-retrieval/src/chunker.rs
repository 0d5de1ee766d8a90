//! Token-aware chunking. A document splits into blocks at blank lines and Markdown headings;
//! headings and figure/table captions become chunks of their own, marked as such; paragraphs are
//! packed into chunks of at most `max_tokens`, and a paragraph longer than that is cut into
//! windows of `max_tokens` that overlap by `overlap_tokens`. Chunk ids hash the document id,
//! the kind and the text, so they stay the same across runs.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::documents::Document;
use crate::error::{Result, RetrievalError};

/// What a chunk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkKind {
    Text,
    Heading,
    Caption,
}

/// A piece of a document, the unit of retrieval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub id: String,
    pub doc_id: String,
    pub title: String,
    pub kind: ChunkKind,
    pub text: String,
    /// Byte range of `text` in the document.
    pub start: usize,
    pub end: usize,
    /// The whitespace between the previous chunk's end and `start` (blank lines between
    /// paragraphs, a line break after a heading), so the document can be laid out again as it
    /// was; empty for the first chunk and for a window overlapping the one before. Corpora
    /// stored before it existed read it as empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub separator: String,
}

/// Chunk sizes in tokens of the embedder's tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerConfig {
    pub max_tokens: usize,
    pub overlap_tokens: usize,
}

impl Default for ChunkerConfig {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            overlap_tokens: 32,
        }
    }
}

/// Token boundaries of a text, as byte ranges (special tokens excluded).
pub trait TokenOffsets {
    fn offsets(&self, text: &str) -> Result<Vec<(usize, usize)>>;
}

impl TokenOffsets for tokenizers::Tokenizer {
    fn offsets(&self, text: &str) -> Result<Vec<(usize, usize)>> {
        let enc = self
            .encode(text, false)
            .map_err(|e| RetrievalError::Invalid(format!("tokenizer: {e}")))?;
        Ok(enc.get_offsets().to_vec())
    }
}

/// Whitespace-separated words as tokens (tests and tokenizer-free callers).
#[derive(Debug, Clone, Copy, Default)]
pub struct WordOffsets;

impl TokenOffsets for WordOffsets {
    fn offsets(&self, text: &str) -> Result<Vec<(usize, usize)>> {
        let mut out = Vec::new();
        let mut start = None;
        for (i, c) in text.char_indices() {
            match (c.is_whitespace(), start) {
                (false, None) => start = Some(i),
                (true, Some(s)) => {
                    out.push((s, i));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            out.push((s, text.len()));
        }
        Ok(out)
    }
}

struct Block {
    kind: ChunkKind,
    start: usize,
    end: usize,
}

fn is_caption(line: &str) -> bool {
    let lower = line.trim_start().to_ascii_lowercase();
    ["figure", "fig.", "table"].iter().any(|p| {
        lower.strip_prefix(p).is_some_and(|rest| {
            let rest = rest.trim_start();
            rest.starts_with(|c: char| c.is_ascii_digit())
        })
    })
}

/// Blocks of `text`: paragraphs (split at blank lines), headings (lines starting with `#`) and
/// captions ("Figure 2: ...", "Table 1. ...").
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut para: Option<(usize, usize)> = None;
    let flush = |para: &mut Option<(usize, usize)>, out: &mut Vec<Block>| {
        if let Some((s, e)) = para.take() {
            let kind = if is_caption(&text[s..e]) {
                ChunkKind::Caption
            } else {
                ChunkKind::Text
            };
            out.push(Block {
                kind,
                start: s,
                end: e,
            });
        }
    };
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let (start, end) = (pos, pos + line.trim_end().len());
        pos += line.len();
        let trimmed = line.trim();
        if trimmed.is_empty() {
            flush(&mut para, &mut out);
        } else if trimmed.starts_with('#') {
            flush(&mut para, &mut out);
            let lead = line.len() - line.trim_start().len();
            out.push(Block {
                kind: ChunkKind::Heading,
                start: start + lead,
                end,
            });
        } else {
            let lead = line.len() - line.trim_start().len();
            para = Some(match para {
                Some((s, _)) => (s, end),
                None => (start + lead, end),
            });
        }
    }
    flush(&mut para, &mut out);
    out
}

fn chunk_id(doc_id: &str, kind: ChunkKind, text: &str) -> String {
    let mut h = Sha256::new();
    h.update(doc_id.as_bytes());
    h.update([0, kind as u8]);
    h.update(text.as_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Split `doc` into chunks.
pub fn chunk_document(
    doc: &Document,
    tokens: &dyn TokenOffsets,
    config: &ChunkerConfig,
) -> Result<Vec<Chunk>> {
    if config.max_tokens == 0 || config.overlap_tokens >= config.max_tokens {
        return Err(RetrievalError::Invalid(format!(
            "chunk size {} with overlap {}: the overlap must be smaller",
            config.max_tokens, config.overlap_tokens
        )));
    }
    let text = &doc.text;
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut emit = |kind: ChunkKind, start: usize, end: usize| {
        let piece = text[start..end].trim();
        if piece.is_empty() {
            return;
        }
        let lead = text[start..end].len() - text[start..end].trim_start().len();
        let start = start + lead;
        let separator = match chunks.last() {
            Some(previous) if previous.end < start => text[previous.end..start].to_string(),
            _ => String::new(),
        };
        chunks.push(Chunk {
            id: chunk_id(&doc.id, kind, piece),
            doc_id: doc.id.clone(),
            title: doc.title.clone(),
            kind,
            text: piece.to_string(),
            start,
            end: start + piece.len(),
            separator,
        });
    };
    // A run of paragraphs being packed: byte range and token count.
    let mut run: Option<(usize, usize, usize)> = None;
    for block in blocks(text) {
        let offsets = tokens.offsets(&text[block.start..block.end])?;
        let n = offsets.len();
        if block.kind == ChunkKind::Text && n <= config.max_tokens {
            match run {
                Some((s, _, count)) if count + n <= config.max_tokens => {
                    run = Some((s, block.end, count + n))
                }
                _ => {
                    if let Some((s, e, _)) = run.take() {
                        emit(ChunkKind::Text, s, e);
                    }
                    run = Some((block.start, block.end, n));
                }
            }
            continue;
        }
        if let Some((s, e, _)) = run.take() {
            emit(ChunkKind::Text, s, e);
        }
        if n <= config.max_tokens {
            emit(block.kind, block.start, block.end);
            continue;
        }
        // Too long for one chunk: overlapping token windows.
        let step = config.max_tokens - config.overlap_tokens;
        let mut first = 0;
        loop {
            let last = (first + config.max_tokens).min(n) - 1;
            emit(
                block.kind,
                block.start + offsets[first].0,
                block.start + offsets[last].1,
            );
            if last + 1 >= n {
                break;
            }
            first += step;
        }
    }
    if let Some((s, e, _)) = run.take() {
        emit(ChunkKind::Text, s, e);
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Document {
        Document {
            id: "d".into(),
            title: "T".into(),
            text: text.into(),
        }
    }

    fn words(n: usize, from: usize) -> String {
        (from..from + n)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn paragraphs_pack_headings_and_captions_stand_alone() {
        let text = format!(
            "# Intro\n\n{}\n\n{}\n\nFigure 3: the setup.\n\n{}\n## Next\n{}",
            words(3, 0),
            words(4, 10),
            words(2, 20),
            words(5, 30)
        );
        let config = ChunkerConfig {
            max_tokens: 8,
            overlap_tokens: 2,
        };
        let chunks = chunk_document(&doc(&text), &WordOffsets, &config).unwrap();
        let kinds: Vec<ChunkKind> = chunks.iter().map(|c| c.kind).collect();
        use ChunkKind::*;
        assert_eq!(
            kinds,
            [Heading, Text, Caption, Text, Heading, Text],
            "{chunks:#?}"
        );
        assert_eq!(chunks[0].text, "# Intro");
        // 3 + 4 words fit in 8: the first two paragraphs share a chunk.
        assert!(chunks[1].text.starts_with("w0 w1 w2") && chunks[1].text.ends_with("w13"));
        assert_eq!(chunks[2].text, "Figure 3: the setup.");
        for c in &chunks {
            assert_eq!(&text[c.start..c.end], c.text, "offsets point at the text");
            assert_eq!(c.id.len(), 32);
        }
        // The whitespace between chunks is kept, so the document can be laid out again.
        let separators: Vec<&str> = chunks.iter().map(|c| c.separator.as_str()).collect();
        assert_eq!(separators, ["", "\n\n", "\n\n", "\n\n", "\n", "\n"]);
        let mut rebuilt = String::new();
        for c in &chunks {
            rebuilt.push_str(&c.separator);
            rebuilt.push_str(&c.text);
        }
        assert_eq!(rebuilt, text);
        // A corpus stored before separators existed still reads.
        let mut old = serde_json::to_value(&chunks[1]).unwrap();
        old.as_object_mut().unwrap().remove("separator");
        let read: Chunk = serde_json::from_value(old).unwrap();
        assert_eq!(read.separator, "");
        let again = chunk_document(&doc(&text), &WordOffsets, &config).unwrap();
        assert_eq!(chunks, again, "stable ids");
    }

    #[test]
    fn captions_are_marked_and_long_paragraphs_overlap() {
        let text = format!("Table 2. Results by model.\n\n{}", words(20, 0));
        let config = ChunkerConfig {
            max_tokens: 8,
            overlap_tokens: 3,
        };
        let chunks = chunk_document(&doc(&text), &WordOffsets, &config).unwrap();
        assert_eq!(chunks[0].kind, ChunkKind::Caption);
        let windows: Vec<&str> = chunks[1..].iter().map(|c| c.text.as_str()).collect();
        assert_eq!(windows[0], words(8, 0));
        assert_eq!(windows[1], words(8, 5), "windows overlap by 3 tokens");
        assert!(windows.last().unwrap().ends_with("w19"));
        assert_eq!(chunks[1].separator, "\n\n");
        assert!(
            chunks[2..].iter().all(|c| c.separator.is_empty()),
            "windows overlap"
        );
        assert!(chunk_document(
            &doc("x"),
            &WordOffsets,
            &ChunkerConfig {
                max_tokens: 4,
                overlap_tokens: 4
            }
        )
        .is_err());
    }
}
