//! Which of a repo's files make the model triage loads: the safetensors folder's files, or one
//! GGUF picked by quant tag as llama.cpp's `-hf org/repo:QUANT` does. Works on names only, so
//! the same choice is made on the Hub's listing and on a cached snapshot.

use std::collections::BTreeSet;

use super::id::{is_repo_path, HubId};
use crate::error::{FetchError, Result};

/// The files a safetensors model needs besides its weights.
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
/// Files the loader reads when present.
const OPTIONAL: [&str; 4] = [
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];
/// The index of a sharded safetensors model.
pub const INDEX: &str = "model.safetensors.index.json";
/// The weights of an unsharded safetensors model.
const SINGLE: &str = "model.safetensors";
/// The tag picked in a GGUF-only repo when the id names none (llama.cpp's default).
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// What to fetch from a repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// A safetensors folder: these files, then the shards `index` names once it is read.
    Safetensors {
        files: Vec<String>,
        index: Option<String>,
    },
    /// One file: a GGUF, or the file the id names.
    File(String),
}

impl Pick {
    /// The files to fetch first (the index among them; its shards come after).
    pub fn files(&self) -> Vec<String> {
        match self {
            Pick::Safetensors { files, .. } => files.clone(),
            Pick::File(name) => vec![name.clone()],
        }
    }
}

/// The files of `names` (a repo's) that make the model `id` names.
pub fn pick(names: &[String], id: &HubId) -> Result<Pick> {
    let has = |name: &str| names.iter().any(|n| n == name);
    if let Some(file) = &id.file {
        if has(file) {
            return Ok(Pick::File(file.clone()));
        }
        return Err(FetchError::NotFound(format!(
            "{} has no file {file}; it has: {}",
            id.repo,
            some_of(names.iter())
        )));
    }
    if let Some(tag) = &id.quant {
        return pick_gguf(names, &id.repo, tag, true);
    }
    if has("config.json") && (has(INDEX) || has(SINGLE)) {
        return pick_safetensors(names, &id.repo);
    }
    if names.iter().any(|n| is_gguf(n)) {
        return pick_gguf(names, &id.repo, DEFAULT_QUANT, false);
    }
    Err(FetchError::NotFound(format!(
        "{} has neither a safetensors model (config.json with {SINGLE} or {INDEX}) nor a .gguf \
         file; it has: {}",
        id.repo,
        some_of(names.iter())
    )))
}

fn pick_safetensors(names: &[String], repo: &str) -> Result<Pick> {
    let has = |name: &str| names.iter().any(|n| n == name);
    if let Some(missing) = REQUIRED.iter().find(|f| !has(f)) {
        return Err(FetchError::NotFound(format!(
            "{repo} has no {missing}, which triage needs to load a safetensors model"
        )));
    }
    let index = has(INDEX).then(|| INDEX.to_string());
    let weights = index.clone().unwrap_or_else(|| SINGLE.to_string());
    let files = REQUIRED
        .iter()
        .chain(OPTIONAL.iter().filter(|f| has(f)))
        .map(|f| f.to_string())
        .chain([weights])
        .collect();
    Ok(Pick::Safetensors { files, index })
}

/// The one `.gguf` whose path carries `tag` (`asked`: the id named it; else the default).
fn pick_gguf(names: &[String], repo: &str, tag: &str, asked: bool) -> Result<Pick> {
    let ggufs: Vec<&String> = names.iter().filter(|n| is_gguf(n)).collect();
    let tagged: Vec<&String> = ggufs.iter().copied().filter(|n| has_tag(n, tag)).collect();
    let (split, whole): (Vec<&String>, Vec<&String>) = tagged.iter().partition(|n| is_split(n));
    match (whole.as_slice(), split.first()) {
        ([one], _) => Ok(Pick::File(one.to_string())),
        ([], Some(first)) => Err(FetchError::Invalid(format!(
            "{repo}:{tag} is a GGUF split into {} files ({first}, ...); triage loads one file: \
             merge them with llama.cpp's `llama-gguf-split --merge` and give the merged file's path",
            split.len()
        ))),
        ([], None) if !asked => Err(FetchError::NotFound(format!(
            "{repo} holds GGUF files but no {tag} one, the default: name one with \
             `{repo}:TAG`; its GGUF files: {}",
            some_of(ggufs.into_iter())
        ))),
        ([], None) => Err(FetchError::NotFound(format!(
            "{repo} has no .gguf file tagged {tag}; its GGUF files: {}",
            some_of(ggufs.into_iter())
        ))),
        (several, _) => Err(FetchError::Invalid(format!(
            "{repo}:{tag} matches several files ({}): name one with `{repo}/FILE`",
            some_of(several.iter().copied())
        ))),
    }
}

/// A model GGUF (`mmproj-*` files hold vision projectors, not models).
fn is_gguf(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    base.ends_with(".gguf") && !base.starts_with("mmproj")
}

/// Whether `tag` appears in `name` as a whole word: `Q4_K` is not in `Q4_K_M`, nor `F16` in
/// `BF16`. Case-insensitive.
fn has_tag(name: &str, tag: &str) -> bool {
    let (name, tag) = (name.to_ascii_lowercase(), tag.to_ascii_lowercase());
    let stem = name.strip_suffix(".gguf").unwrap_or(&name);
    stem.match_indices(&tag).any(|(at, _)| {
        let before = stem[..at].chars().next_back();
        let after = stem[at + tag.len()..].chars().next();
        before.is_none_or(|c| !c.is_ascii_alphanumeric())
            && after.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_')
    })
}

/// llama.cpp's split files: `name-00001-of-00003.gguf`.
fn is_split(name: &str) -> bool {
    let stem = name.strip_suffix(".gguf").unwrap_or(name).as_bytes();
    let Some(tail) = stem.len().checked_sub(15).map(|at| &stem[at..]) else {
        return false;
    };
    let digits = |range: std::ops::Range<usize>| tail[range].iter().all(u8::is_ascii_digit);
    tail[0] == b'-' && digits(1..6) && &tail[6..10] == b"-of-" && digits(10..15)
}

/// The shards a safetensors index names, each once, relative to the repo's root.
pub fn shards(index_json: &str, repo: &str) -> Result<Vec<String>> {
    let bad = |why: String| FetchError::Invalid(format!("{INDEX} of {repo}: {why}"));
    let json: serde_json::Value =
        serde_json::from_str(index_json).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut shards = BTreeSet::new();
    for file in map.values() {
        match file.as_str() {
            Some(name) if is_repo_path(name) && name.ends_with(".safetensors") => {
                shards.insert(name.to_string());
            }
            _ => {
                return Err(bad(format!(
                    "{file} is not a .safetensors file in the repo"
                )))
            }
        }
    }
    if shards.is_empty() {
        return Err(bad("the weight_map is empty".into()));
    }
    Ok(shards.into_iter().collect())
}

/// Up to 12 of `names`, for an error message.
fn some_of<'a>(names: impl ExactSizeIterator<Item = &'a String>) -> String {
    let total = names.len();
    if total == 0 {
        return "no files".to_string();
    }
    let shown: Vec<&str> = names.take(12).map(String::as_str).collect();
    let more = total - shown.len();
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{}{tail}", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn id(spec: &str) -> HubId {
        HubId::parse(spec).unwrap()
    }

    const GGUF_REPO: &[&str] = &[
        "README.md",
        "Model-Q4_K_M.gguf",
        "Model-Q4_K_S.gguf",
        "Model-IQ4_XS.gguf",
        "Model-Q8_0.gguf",
        "Model-BF16.gguf",
        "mmproj-Model-F16.gguf",
        "Big/Model-Q6_K-00001-of-00002.gguf",
        "Big/Model-Q6_K-00002-of-00002.gguf",
    ];

    #[test]
    fn a_safetensors_repo_gives_config_tokenizer_and_weights_only() {
        let repo = names(&[
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "model.safetensors",
            "consolidated.safetensors",
            "pytorch_model.bin",
            "original/params.json",
            "README.md",
        ]);
        let want = Pick::Safetensors {
            files: names(&[
                "config.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "generation_config.json",
                "model.safetensors",
            ]),
            index: None,
        };
        assert_eq!(pick(&repo, &id("o/r")).unwrap(), want);
    }

    #[test]
    fn a_sharded_repo_gives_its_index_and_the_shards_it_names() {
        let repo = names(&["config.json", "tokenizer.json", INDEX, "x-1.safetensors"]);
        let pick = pick(&repo, &id("o/r")).unwrap();
        assert_eq!(pick.files().last().map(String::as_str), Some(INDEX));
        let index = r#"{"metadata": {}, "weight_map": {"a": "m-2.safetensors",
            "b": "m-1.safetensors", "c": "m-2.safetensors"}}"#;
        assert_eq!(
            shards(index, "o/r").unwrap(),
            names(&["m-1.safetensors", "m-2.safetensors"])
        );
        for bad in [
            r#"{"weight_map": {"a": "../x.safetensors"}}"#,
            r#"{"weight_map": {}}"#,
            "[]",
        ] {
            assert!(shards(bad, "o/r").is_err(), "{bad}");
        }
    }

    #[test]
    fn a_quant_tag_picks_one_gguf_by_whole_word() {
        let repo = names(GGUF_REPO);
        for (spec, want) in [
            ("o/r:Q4_K_M", "Model-Q4_K_M.gguf"),
            ("o/r:q8_0", "Model-Q8_0.gguf"),
            ("o/r:IQ4_XS", "Model-IQ4_XS.gguf"),
            ("o/r:bf16", "Model-BF16.gguf"),
            ("o/r", "Model-Q4_K_M.gguf"),
        ] {
            assert_eq!(
                pick(&repo, &id(spec)).unwrap(),
                Pick::File(want.into()),
                "{spec}"
            );
        }
    }

    #[test]
    fn a_missing_split_or_unknown_tag_is_a_clear_error() {
        let repo = names(GGUF_REPO);
        let err = |spec: &str| pick(&repo, &id(spec)).unwrap_err().to_string();
        let missing = err("o/r:Q2_K");
        assert!(missing.contains("no .gguf file tagged Q2_K"), "{missing}");
        assert!(
            missing.contains("Model-Q8_0.gguf"),
            "lists the files: {missing}"
        );
        assert!(
            err("o/r:F16").contains("no .gguf file tagged"),
            "mmproj is not a model"
        );
        assert!(err("o/r:Q6_K").contains("llama-gguf-split --merge"));
        let no_default = pick(&names(&["a-Q8_0.gguf"]), &id("o/r")).unwrap_err();
        assert!(no_default.to_string().contains("o/r:TAG"), "{no_default}");
        let two = pick(&names(&["a-Q8_0.gguf", "b-Q8_0.gguf"]), &id("o/r:Q8_0")).unwrap_err();
        assert!(two.to_string().contains("several"), "{two}");
        let nothing = pick(&names(&["README.md"]), &id("o/r")).unwrap_err();
        assert!(nothing.to_string().contains("README.md"), "{nothing}");
        let no_tok = pick(&names(&["config.json", "model.safetensors"]), &id("o/r"));
        assert!(no_tok.unwrap_err().to_string().contains("tokenizer.json"));
    }

    #[test]
    fn a_named_file_is_taken_as_is() {
        let repo = names(GGUF_REPO);
        let got = pick(&repo, &id("o/r/Big/Model-Q6_K-00001-of-00002.gguf")).unwrap();
        assert_eq!(got, Pick::File("Big/Model-Q6_K-00001-of-00002.gguf".into()));
        assert!(pick(&repo, &id("o/r/nope.gguf")).is_err());
    }
}
