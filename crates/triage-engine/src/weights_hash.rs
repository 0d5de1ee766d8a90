//! The content hash of a model's weights: sha256 of the GGUF file, or of a safetensors
//! folder's files (names and contents, in name order). It is the identity a persisted prefix is
//! keyed by, so every machine holding the same weights finds the same files, whatever the path
//! or the modification time. Hashing a gigabyte takes seconds, so for weights past 64 MiB the
//! result is memoised under `$TRIAGE_HOME/cache/weights-sha256`, keyed by this machine's path,
//! size and modification time (smaller ones, like the tests' tiny models, hash in no time).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use crate::{EngineError, Result};

/// Weights smaller than this are hashed every time rather than memoised.
const MEMO_MIN_BYTES: u64 = 64 << 20;

/// sha256 (hex) of the weights at `path`.
pub fn weights_sha256(path: &Path) -> Result<String> {
    let memo_dir = triage_models::paths::triage_home()
        .join("cache")
        .join("weights-sha256");
    weights_sha256_in(path, &memo_dir, MEMO_MIN_BYTES)
}

/// [`weights_sha256`], from the memo under `memo_dir` when the weights are unchanged since they
/// were hashed there, memoising weights of `memo_min_bytes` and more.
fn weights_sha256_in(path: &Path, memo_dir: &Path, memo_min_bytes: u64) -> Result<String> {
    let io = |e: std::io::Error| EngineError::Invalid(format!("{}: {e}", path.display()));
    let files = weight_files(path).map_err(io)?;
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()
        .map_err(io)?;
    let memo = (bytes >= memo_min_bytes)
        .then(|| stamp(path, &files).map(|name| memo_dir.join(name)))
        .transpose()
        .map_err(io)?;
    if let Some(hash) = memo.as_deref().and_then(read_memo) {
        return Ok(hash);
    }
    let hash = if path.is_dir() {
        let mut folder = Sha256::new();
        for file in &files {
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
            folder.update(name.unwrap_or_default().as_bytes());
            folder.update([0]);
            folder.update(file_sha256(file).map_err(io)?.as_bytes());
        }
        format!("{:x}", folder.finalize())
    } else {
        file_sha256(path).map_err(io)?
    };
    if let Some(memo) = memo {
        // A memo that cannot be written only costs the next start the hashing again.
        let written = std::fs::create_dir_all(memo_dir).and_then(|()| {
            let tmp = memo.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &hash)?;
            std::fs::rename(&tmp, &memo)
        });
        if let Err(e) = written {
            tracing::debug!(error = %e, "could not memoise a weights hash");
        }
    }
    Ok(hash)
}

/// A memo's hash, if it holds one.
fn read_memo(memo: &Path) -> Option<String> {
    let text = std::fs::read_to_string(memo).ok()?;
    let hash = text.trim();
    (hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then(|| hash.to_string())
}

/// The regular files that make up the weights: the file itself, or a folder's files by name.
fn weight_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// The memo's file name: a hash of the canonical path and each file's name, size and
/// modification time, so any change to the weights is a new memo.
fn stamp(path: &Path, files: &[PathBuf]) -> std::io::Result<String> {
    let mut h = Sha256::new();
    h.update(std::fs::canonicalize(path)?.to_string_lossy().as_bytes());
    for file in files {
        let meta = std::fs::metadata(file)?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        h.update(format!("|{}|{}|{mtime}", file.display(), meta.len()).as_bytes());
    }
    Ok(format!("{:x}", h.finalize()))
}

fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_follows_the_content_not_the_path_and_is_memoised() {
        let dir = tempfile::tempdir().unwrap();
        let memo = dir.path().join("memo");
        let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
        std::fs::write(&a, b"weights").unwrap();
        std::fs::write(&b, b"weights").unwrap();
        let hash = weights_sha256_in(&a, &memo, 0).unwrap();
        // sha256("weights"), as `sha256sum` prints it.
        assert_eq!(
            hash,
            "9a129038d9a00aed0cf6a7ea059ca50a813449061ab87848cf1a13eafdf33b2c"
        );
        assert_eq!(weights_sha256_in(&b, &memo, 0).unwrap(), hash);
        assert_eq!(std::fs::read_dir(&memo).unwrap().count(), 2);
        // A memo is trusted while the file is unchanged: a forged memo proves it is read.
        let forged = "0".repeat(64);
        for entry in std::fs::read_dir(&memo).unwrap() {
            std::fs::write(entry.unwrap().path(), &forged).unwrap();
        }
        assert_eq!(weights_sha256_in(&a, &memo, 0).unwrap(), forged);
        // A changed file (another size) is hashed again.
        std::fs::write(&a, b"other weights").unwrap();
        let changed = weights_sha256_in(&a, &memo, 0).unwrap();
        // Small weights are not memoised.
        let before = std::fs::read_dir(&memo).unwrap().count();
        weights_sha256_in(&b, &memo, 1 << 20).unwrap();
        assert_eq!(std::fs::read_dir(&memo).unwrap().count(), before);
        assert_ne!(changed, forged);
        assert_ne!(changed, hash);
        // A folder hashes its files' names and contents.
        let folder = dir.path().join("st");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("model.safetensors"), b"weights").unwrap();
        let first = weights_sha256_in(&folder, &memo, 0).unwrap();
        std::fs::write(folder.join("config.json"), b"{}").unwrap();
        assert_ne!(weights_sha256_in(&folder, &memo, 0).unwrap(), first);
    }
}
