//! Checking a downloaded file against the size and hash the Hub lists: sha256 for LFS files, the
//! git blob id for plain ones. hf-hub checks neither.

use std::path::Path;

use super::cache::{file_size, RepoCache};
use super::listing::{Digest, RepoFile};
use crate::error::{FetchError, IoContext, Result};

/// The sha256 (and, with `git`, the git blob id) of the file at `path`, under a "verify" bar.
pub fn hash_file(path: &Path, git: bool, progress: bool) -> Result<(String, Option<String>)> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    crate::hash::hash_file(
        path,
        git,
        progress,
        format!("verify {}", name.unwrap_or_default()),
    )
}

/// Checks the file at `pointer` against `file` and returns its sha256. On a mismatch the pointer
/// and its blob are removed, so the cache never offers the bad bytes, and the error names the
/// file, what the Hub lists and what arrived.
pub fn check(cache: &RepoCache, pointer: &Path, file: &RepoFile, progress: bool) -> Result<String> {
    let size = file_size(pointer).unwrap_or(0);
    let found = if size != file.size {
        Err(format!(
            "size mismatch for {}: the Hub lists {} bytes, got {size}",
            file.name, file.size
        ))
    } else {
        hash_matches(pointer, file, progress)?
    };
    found.map_err(|why| {
        cache.remove_entry(pointer);
        FetchError::Integrity(format!(
            "{why}; the download was removed from the cache, so the next fetch starts over"
        ))
    })
}

fn hash_matches(
    pointer: &Path,
    file: &RepoFile,
    progress: bool,
) -> Result<std::result::Result<String, String>> {
    let git = matches!(file.digest, Digest::GitSha1(_));
    let (sha256, git_id) = hash_file(pointer, git, progress)?;
    let (kind, got) = match &file.digest {
        Digest::Sha256(_) => ("sha256", sha256.clone()),
        Digest::GitSha1(_) => ("git blob id", git_id.unwrap_or_default()),
    };
    if got == file.digest.hex() {
        return Ok(Ok(sha256));
    }
    Ok(Err(format!(
        "{kind} mismatch for {}: the Hub lists {}, got {got}",
        file.name,
        file.digest.hex()
    )))
}

/// The sha256 of a file already in the cache: its blob's name when that is a sha256 (LFS blobs
/// are named by it), else hashed.
pub fn cached_sha256(pointer: &Path) -> Result<String> {
    let blob = std::fs::canonicalize(pointer).at(|| format!("reading {}", pointer.display()))?;
    let name = blob.file_name().map(|n| n.to_string_lossy().into_owned());
    match name {
        Some(name) if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(name),
        _ => Ok(hash_file(pointer, false, false)?.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_git_blob_id_is_gits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "hello\n").unwrap();
        let (sha256, git) = hash_file(&path, true, false).unwrap();
        // `printf 'hello\n' | git hash-object --stdin`, and `sha256sum`.
        assert_eq!(
            git.as_deref(),
            Some("ce013625030ba8dba906f756967f9e9ca394464a")
        );
        assert_eq!(
            sha256,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
    }
}
