//! A Hugging Face model id as the user writes it: `org/repo[@revision][:QUANT]` or `org/repo/file`.

use std::fmt;

/// The revision used when the id names none, as on the Hub.
pub const DEFAULT_REVISION: &str = "main";

/// A model on the Hub: a repo at a revision, and which of its files make the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    /// `org/repo`.
    pub repo: String,
    /// A branch, tag or commit (`main` unless the id says `@revision`).
    pub revision: String,
    /// `:QUANT`: the `.gguf` file whose name carries this tag (as llama.cpp's `-hf org/repo:QUANT`).
    pub quant: Option<String>,
    /// `org/repo/path/in/repo`: exactly this file.
    pub file: Option<String>,
}

impl HubId {
    /// Parses `org/repo`, `org/repo:Q4_K_M`, `org/repo@v1.0`, `org/repo/sub/file.gguf`. `None`
    /// when `spec` is not such an id (a path like `/x`, `./x`, `dir/file.gguf`, a Windows path).
    pub fn parse(spec: &str) -> Option<Self> {
        let (rest, quant) = match spec.rsplit_once(':') {
            Some((rest, quant)) if is_quant_tag(quant) => (rest, Some(quant.to_string())),
            Some(_) => return None,
            None => (spec, None),
        };
        let (path, revision) = match rest.split_once('@') {
            Some((path, rev)) if is_revision(rev) => (path, rev.to_string()),
            Some(_) => return None,
            None => (rest, DEFAULT_REVISION.to_string()),
        };
        let mut parts = path.splitn(3, '/');
        let (org, name) = (parts.next()?, parts.next()?);
        if !is_repo_part(org) || !is_repo_part(name) {
            return None;
        }
        let file = parts.next().map(str::to_string);
        match &file {
            Some(file) if quant.is_some() || !is_repo_path(file) => return None,
            // `dir/model.gguf` is a local path that does not exist, not a repo called `model.gguf`.
            None if name.ends_with(".gguf") => return None,
            _ => {}
        }
        Some(Self {
            repo: format!("{org}/{name}"),
            revision,
            quant,
            file,
        })
    }
}

impl fmt::Display for HubId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repo)?;
        if let Some(file) = &self.file {
            write!(f, "/{file}")?;
        }
        if self.revision != DEFAULT_REVISION {
            write!(f, "@{}", self.revision)?;
        }
        if let Some(quant) = &self.quant {
            write!(f, ":{quant}")?;
        }
        Ok(())
    }
}

/// An org or repo name as the Hub allows them: letters, digits, `-`, `_`, `.`, not starting with
/// `-` or `.`, at most 96 characters.
fn is_repo_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 96
        && !part.starts_with(['-', '.'])
        && !part.contains("..")
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A quant tag (`Q4_K_M`, `q8_0`, `UD-Q4_K_XL`, `BF16`).
fn is_quant_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A git ref or commit (`main`, `v1.0`, `refs/pr/1`, a sha).
fn is_revision(rev: &str) -> bool {
    is_repo_path(rev)
        && rev
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// A relative path inside a repo that stays inside it: no empty, `.` or `..` part, no `\`.
pub(crate) fn is_repo_path(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(repo: &str, revision: &str, quant: Option<&str>, file: Option<&str>) -> HubId {
        HubId {
            repo: repo.into(),
            revision: revision.into(),
            quant: quant.map(Into::into),
            file: file.map(Into::into),
        }
    }

    #[test]
    fn ids_parse_with_revision_quant_and_file() {
        let cases = [
            (
                "Qwen/Qwen2.5-0.5B",
                id("Qwen/Qwen2.5-0.5B", "main", None, None),
            ),
            (
                "org/repo-GGUF:Q4_K_M",
                id("org/repo-GGUF", "main", Some("Q4_K_M"), None),
            ),
            (
                "org/repo@refs/pr/1:q8_0",
                id("org/repo", "refs/pr/1", Some("q8_0"), None),
            ),
            (
                "org/repo/sub/model-Q8_0.gguf",
                id("org/repo", "main", None, Some("sub/model-Q8_0.gguf")),
            ),
            (
                "org/repo/model.gguf@abc123",
                id("org/repo", "abc123", None, Some("model.gguf")),
            ),
        ];
        for (spec, want) in cases {
            let got = HubId::parse(spec);
            assert_eq!(got.as_ref(), Some(&want), "{spec}");
            assert_eq!(want.to_string(), spec, "round trip");
        }
    }

    #[test]
    fn paths_and_malformed_ids_are_not_ids() {
        for spec in [
            "qwen2.5-coder-0.5b",
            "/abs/path",
            "./rel/path",
            "../up/one",
            "dir/model.gguf",
            "C:\\models\\x.gguf",
            "C:/models/x",
            "org/repo:",
            "org/repo@",
            "org//repo",
            "org/repo/../etc/passwd",
            "org/repo/file.gguf:Q4_K_M",
            "-org/repo",
            "org/re po",
            "",
        ] {
            assert_eq!(HubId::parse(spec), None, "{spec:?}");
        }
    }
}
