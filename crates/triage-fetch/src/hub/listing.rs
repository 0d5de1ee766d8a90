//! A repo's file list as the Hub's `api/models/{repo}/revision/{rev}?blobs=true` gives it: each
//! file's size and hash, the values downloads are checked against.

use serde::Deserialize;

use super::id::is_repo_path;
use crate::error::{FetchError, Result};

/// One revision of a repo: its commit and files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoListing {
    /// The commit the revision named when listed (40 hex digits).
    pub commit: String,
    pub files: Vec<RepoFile>,
}

/// A file of a repo and what its bytes must hash to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    /// The path inside the repo.
    pub name: String,
    pub size: u64,
    pub digest: Digest,
}

/// The hash the Hub reports for a file; it also names the file's blob in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Digest {
    /// A Git LFS file: sha256 of the content.
    Sha256(String),
    /// A plain git file: its git blob id (sha1 of `blob <size>\0` and the content).
    GitSha1(String),
}

impl Digest {
    /// The hex digest, which is the blob's file name in the cache.
    pub fn hex(&self) -> &str {
        match self {
            Digest::Sha256(hex) | Digest::GitSha1(hex) => hex,
        }
    }
}

#[derive(Deserialize)]
struct RawListing {
    sha: String,
    siblings: Vec<RawFile>,
}

#[derive(Deserialize)]
struct RawFile {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<RawLfs>,
}

#[derive(Deserialize)]
struct RawLfs {
    sha256: String,
    size: u64,
}

impl RepoListing {
    /// Parses the API's JSON, refusing values that could not name a cache path safely.
    pub fn from_json(repo: &str, text: &str) -> Result<Self> {
        let bad = |why: String| FetchError::Hub(format!("the Hub's listing of {repo}: {why}"));
        let raw: RawListing =
            serde_json::from_str(text).map_err(|e| bad(format!("not the JSON expected: {e}")))?;
        if !is_hex(&raw.sha, 40) {
            return Err(bad(format!("commit {:?} is not a sha1", raw.sha)));
        }
        let files = raw
            .siblings
            .into_iter()
            .map(|f| file_of(f).map_err(&bad))
            .collect::<Result<_>>()?;
        Ok(Self {
            commit: raw.sha,
            files,
        })
    }

    /// The file called `name`.
    pub fn get(&self, name: &str) -> Option<&RepoFile> {
        self.files.iter().find(|f| f.name == name)
    }

    /// Every file's name, in the listing's order.
    pub fn names(&self) -> Vec<String> {
        self.files.iter().map(|f| f.name.clone()).collect()
    }
}

fn file_of(raw: RawFile) -> std::result::Result<RepoFile, String> {
    let name = raw.rfilename;
    if !is_repo_path(&name) {
        return Err(format!("file name {name:?} leaves the repo"));
    }
    let (size, digest) = match (raw.lfs, raw.size, raw.blob_id) {
        (Some(lfs), _, _) if is_hex(&lfs.sha256, 64) => (lfs.size, Digest::Sha256(lfs.sha256)),
        (None, Some(size), Some(id)) if is_hex(&id, 40) => (size, Digest::GitSha1(id)),
        _ => {
            return Err(format!(
                "{name} has no size and hash (was ?blobs=true sent?)"
            ))
        }
    };
    Ok(RepoFile { name, size, digest })
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn lfs_and_plain_files_get_their_hash() {
        let json = serde_json::json!({
            "sha": SHA,
            "siblings": [
                {"rfilename": "config.json", "size": 12, "blobId": SHA},
                {"rfilename": "model.safetensors", "size": 135, "blobId": SHA,
                 "lfs": {"sha256": "ab".repeat(32), "size": 4096, "pointerSize": 135}},
            ]
        });
        let listing = RepoListing::from_json("o/r", &json.to_string()).unwrap();
        assert_eq!(listing.commit, SHA);
        assert_eq!(listing.files[0].digest, Digest::GitSha1(SHA.into()));
        let model = listing.get("model.safetensors").unwrap();
        assert_eq!(model.size, 4096, "the LFS size, not the pointer's");
        assert_eq!(model.digest, Digest::Sha256("ab".repeat(32)));
    }

    #[test]
    fn unsafe_or_incomplete_listings_are_refused() {
        let cases = [
            serde_json::json!({"sha": "../../x", "siblings": []}),
            serde_json::json!({"sha": SHA, "siblings": [{"rfilename": "../x", "size": 1, "blobId": SHA}]}),
            serde_json::json!({"sha": SHA, "siblings": [{"rfilename": "config.json"}]}),
            serde_json::json!({"sha": SHA, "siblings": [{"rfilename": "a", "size": 1,
                "lfs": {"sha256": "../../etc", "size": 1}}]}),
        ];
        for json in cases {
            let err = RepoListing::from_json("o/r", &json.to_string()).unwrap_err();
            assert!(err.to_string().contains("o/r"), "{err}");
        }
    }
}
