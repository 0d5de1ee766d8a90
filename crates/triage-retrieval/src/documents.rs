//! Reading documents to ingest: plain text and Markdown files (one document each), JSON (a record
//! or a list of records) and JSONL (one record per line) with `id`, `title` and `text`;
//! directories recursively, in sorted order. Bad input is an error naming the file (and line).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{io_at, Result, RetrievalError};

/// Largest document accepted; bigger ones are refused rather than chunked into thousands of
/// pieces by mistake.
pub const MAX_DOCUMENT_BYTES: usize = 32 * 1024 * 1024;

pub use triage_types::Document;

/// Bounds on a document's id and title. Both go into the long-context prefix whole (a 10 KB id
/// became 10,000 tokens of prefill there), so they are refused beyond these rather than stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocumentLimits {
    /// Bytes of a document id (UTF-8).
    pub max_id_bytes: usize,
    /// Bytes of a document title (UTF-8).
    pub max_title_bytes: usize,
}

impl Default for DocumentLimits {
    fn default() -> Self {
        Self {
            max_id_bytes: 256,
            max_title_bytes: 1024,
        }
    }
}

impl DocumentLimits {
    /// Every document's id and title within bounds; the first that is not is an error naming
    /// the field (`documents[3].id`).
    pub fn check(&self, docs: &[Document]) -> Result<()> {
        for (i, d) in docs.iter().enumerate() {
            let fields = [
                ("id", d.id.len(), self.max_id_bytes),
                ("title", d.title.len(), self.max_title_bytes),
            ];
            if let Some((field, len, max)) = fields.into_iter().find(|(_, len, max)| len > max) {
                return Err(RetrievalError::Invalid(format!(
                    "documents[{i}].{field} is {len} bytes; at most {max}"
                )));
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct Record {
    id: serde_json::Value,
    #[serde(default)]
    title: Option<String>,
    text: String,
}

fn bad(path: &Path, message: impl Into<String>) -> RetrievalError {
    RetrievalError::BadDocument {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Every document under `path` (a file or a directory).
pub fn load_documents(path: &Path) -> Result<Vec<Document>> {
    let meta = std::fs::metadata(path).map_err(io_at(path))?;
    let mut files = Vec::new();
    if meta.is_dir() {
        collect_files(path, &mut files)?;
    } else {
        files.push(path.to_path_buf());
    }
    let mut docs = Vec::new();
    for file in files {
        docs.extend(load_file(&file)?);
    }
    Ok(docs)
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_at(dir))?
        .map(|e| e.map(|e| e.path()).map_err(io_at(dir)))
        .collect::<Result<_>>()?;
    entries.sort();
    for path in entries {
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, out)?;
        } else if kind_of(&path).is_some() {
            out.push(path);
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind {
    Text,
    Json,
    Jsonl,
}

fn kind_of(path: &Path) -> Option<FileKind> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "txt" | "md" | "markdown" | "text" => Some(FileKind::Text),
        "json" => Some(FileKind::Json),
        "jsonl" | "ndjson" => Some(FileKind::Jsonl),
        _ => None,
    }
}

fn load_file(path: &Path) -> Result<Vec<Document>> {
    let kind = kind_of(path)
        .ok_or_else(|| bad(path, "unsupported file type (.txt, .md, .json, .jsonl)"))?;
    let bytes = std::fs::read(path).map_err(io_at(path))?;
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(bad(path, format!("larger than {MAX_DOCUMENT_BYTES} bytes")));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        bad(
            path,
            format!("not UTF-8 (byte {})", e.utf8_error().valid_up_to()),
        )
    })?;
    let docs = match kind {
        FileKind::Text => vec![Document {
            id: path.display().to_string(),
            title: markdown_title(&text).unwrap_or_else(|| {
                path.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }),
            text,
        }],
        FileKind::Json => {
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| bad(path, e.to_string()))?;
            let records = match value {
                serde_json::Value::Array(items) => items,
                other => vec![other],
            };
            records
                .into_iter()
                .enumerate()
                .map(|(i, v)| record(path, &format!("record {i}"), v))
                .collect::<Result<_>>()?
        }
        FileKind::Jsonl => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, line)| {
                let v = serde_json::from_str(line)
                    .map_err(|e| bad(path, format!("line {}: {e}", i + 1)))?;
                record(path, &format!("line {}", i + 1), v)
            })
            .collect::<Result<_>>()?,
    };
    for d in &docs {
        if d.text.trim().is_empty() {
            return Err(bad(path, format!("document {:?} is empty", d.id)));
        }
    }
    Ok(docs)
}

fn record(path: &Path, at: &str, value: serde_json::Value) -> Result<Document> {
    let r: Record = serde_json::from_value(value).map_err(|e| {
        bad(
            path,
            format!("{at}: {e} (records need \"id\" and \"text\")"),
        )
    })?;
    let id = match r.id {
        serde_json::Value::String(s) if !s.is_empty() => s,
        serde_json::Value::Number(n) => n.to_string(),
        other => {
            return Err(bad(
                path,
                format!("{at}: id must be a non-empty string or a number, got {other}"),
            ))
        }
    };
    Ok(Document {
        id,
        title: r.title.unwrap_or_default(),
        text: r.text,
    })
}

/// The first Markdown heading's text, if the document starts with one.
fn markdown_title(text: &str) -> Option<String> {
    let first = text.lines().find(|l| !l.trim().is_empty())?;
    let title = first
        .trim_start()
        .strip_prefix('#')?
        .trim_start_matches('#')
        .trim();
    (!title.is_empty()).then(|| title.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_supported_format_and_refuses_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("a.md"), "# Alpha\n\nbody").unwrap();
        std::fs::write(root.join("sub/b.txt"), "plain").unwrap();
        std::fs::write(
            root.join("c.json"),
            r#"[{"id": 1, "title": "t", "text": "x"}]"#,
        )
        .unwrap();
        std::fs::write(
            root.join("d.jsonl"),
            "{\"id\": \"d1\", \"text\": \"y\"}\n\n",
        )
        .unwrap();
        std::fs::write(root.join("ignored.bin"), [0u8, 1, 2]).unwrap();
        std::fs::write(root.join(".hidden.txt"), "no").unwrap();
        let docs = load_documents(root).unwrap();
        let ids: Vec<&str> = docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(docs.len(), 4, "{ids:?}");
        assert_eq!(docs[0].title, "Alpha");
        assert!(ids.contains(&"1") && ids.contains(&"d1"));

        std::fs::write(root.join("bad.txt"), [0xffu8, 0xfe]).unwrap();
        let e = load_documents(&root.join("bad.txt"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not UTF-8"), "{e}");
        std::fs::write(root.join("empty.txt"), "  \n").unwrap();
        assert!(load_documents(&root.join("empty.txt"))
            .unwrap_err()
            .to_string()
            .contains("empty"));
        std::fs::write(root.join("e.jsonl"), "{\"id\": \"x\"}\n").unwrap();
        let e = load_documents(&root.join("e.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1"), "{e}");
        assert!(load_documents(&root.join("missing.txt")).is_err());
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    fn doc(id: &str, title: &str) -> Document {
        Document {
            id: id.into(),
            title: title.into(),
            text: "text".into(),
        }
    }

    #[test]
    fn ids_and_titles_past_their_limits_are_named() {
        let limits = DocumentLimits::default();
        let ok = [doc(&"i".repeat(256), &"t".repeat(1024))];
        limits.check(&ok).expect("at the limits");
        let long_id = [doc("a", ""), doc(&"i".repeat(10 * 1024), "")];
        let err = limits.check(&long_id).expect_err("a 10 KB id").to_string();
        assert!(
            err.contains("documents[1].id") && err.contains("10240"),
            "{err}"
        );
        let long_title = [doc("a", &"é".repeat(513))];
        let err = limits
            .check(&long_title)
            .expect_err("a 1026-byte title")
            .to_string();
        assert!(
            err.contains("documents[0].title") && err.contains("1026"),
            "{err}"
        );
    }
}
