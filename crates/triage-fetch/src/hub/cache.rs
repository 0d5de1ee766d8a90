//! One repo's folder in the hub cache, in the layout Python's `huggingface_hub` and hf-hub share:
//! `models--org--repo/{blobs/<hash>, snapshots/<commit>/<file> → ../../blobs/<hash>, refs/<rev>}`.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};

/// `models--org--repo/` under a hub cache folder.
#[derive(Debug, Clone)]
pub struct RepoCache {
    dir: PathBuf,
}

impl RepoCache {
    pub fn new(cache_dir: &Path, repo: &str) -> Self {
        Self {
            dir: cache_dir.join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    /// Where `name` of `commit` lives (a symlink to its blob).
    pub fn pointer(&self, commit: &str, name: &str) -> PathBuf {
        self.snapshot(commit).join(name)
    }

    pub fn blob(&self, hash: &str) -> PathBuf {
        self.dir.join("blobs").join(hash)
    }

    fn ref_path(&self, revision: &str) -> PathBuf {
        self.dir.join("refs").join(revision)
    }

    /// The commit `revision` stands for here: what `refs/<revision>` holds, or the revision
    /// itself when it is a commit with a snapshot (Python writes no ref for those).
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if let Ok(text) = fs::read_to_string(self.ref_path(revision)) {
            let commit = text.trim();
            let safe = !commit.is_empty() && !commit.contains(['/', '\\']) && commit != "..";
            return safe.then(|| commit.to_string());
        }
        let is_commit = revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit());
        (is_commit && self.snapshot(revision).is_dir()).then(|| revision.to_string())
    }

    /// Points `refs/<revision>` at `commit` (a whole-file replace, so a reader never sees half).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        let path = self.ref_path(revision);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).at(|| format!("creating {}", parent.display()))?;
        }
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        fs::write(&tmp, commit).at(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &path).at(|| format!("writing {}", path.display()))
    }

    /// Removes `refs/<revision>` if there is one.
    pub fn remove_ref(&self, revision: &str) {
        let _ = fs::remove_file(self.ref_path(revision));
    }

    /// Makes `pointer` a relative symlink to `blob`, as Python does (a copy where there are no
    /// symlinks).
    pub fn link(&self, blob: &Path, pointer: &Path) -> Result<()> {
        let parent = pointer.parent().unwrap_or(&self.dir);
        fs::create_dir_all(parent).at(|| format!("creating {}", parent.display()))?;
        let _ = fs::remove_file(pointer);
        let depth = pointer
            .strip_prefix(&self.dir)
            .map_or(0, |rel| rel.components().count() - 1);
        let target = (0..depth).fold(PathBuf::new(), |p, _| p.join(".."));
        let target = target.join(blob.strip_prefix(&self.dir).unwrap_or(blob));
        symlink(&target, pointer).at(|| format!("linking {}", pointer.display()))
    }

    /// Removes `pointer` and the blob it leads to: a file that failed its check must not stay
    /// in the cache as if it were good.
    pub fn remove_entry(&self, pointer: &Path) {
        if let Ok(blob) = fs::canonicalize(pointer) {
            let _ = fs::remove_file(blob);
        }
        let _ = fs::remove_file(pointer);
    }

    /// Every file of the snapshot of `commit`, as repo paths (`sub/file`), sorted.
    pub fn snapshot_files(&self, commit: &str) -> Vec<String> {
        let root = self.snapshot(commit);
        let mut names = Vec::new();
        collect_files(&root, &root, &mut names);
        names.sort();
        names
    }
}

fn collect_files(root: &Path, dir: &Path, names: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            collect_files(root, &path, names);
        } else if path.is_file() {
            if let Ok(rel) = path.strip_prefix(root) {
                names.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    let blob = link.parent().unwrap_or(Path::new(".")).join(target);
    fs::copy(blob, link).map(|_| ())
}

/// The size of the file at `path` (through symlinks), if it is one.
pub fn file_size(path: &Path) -> Option<u64> {
    fs::metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_and_survive_moving_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(&dir.path().join("hub"), "o/r");
        let blob = cache.blob("abc");
        fs::create_dir_all(blob.parent().unwrap()).unwrap();
        fs::write(&blob, "bytes").unwrap();
        let pointer = cache.pointer("c0", "sub/file.bin");
        cache.link(&blob, &pointer).unwrap();
        assert_eq!(fs::read_to_string(&pointer).unwrap(), "bytes");
        fs::rename(dir.path().join("hub"), dir.path().join("moved")).unwrap();
        let moved = RepoCache::new(&dir.path().join("moved"), "o/r");
        assert_eq!(moved.snapshot_files("c0"), vec!["sub/file.bin".to_string()]);
        assert_eq!(
            fs::read_to_string(moved.pointer("c0", "sub/file.bin")).unwrap(),
            "bytes"
        );
    }

    #[test]
    fn refs_name_commits_and_commits_name_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(dir.path(), "o/r");
        assert_eq!(cache.commit_of("main"), None);
        cache.write_ref("main", "c1").unwrap();
        assert_eq!(cache.commit_of("main").as_deref(), Some("c1"));
        let sha = "a".repeat(40);
        assert_eq!(cache.commit_of(&sha), None, "no snapshot yet");
        fs::create_dir_all(cache.snapshot(&sha)).unwrap();
        assert_eq!(cache.commit_of(&sha), Some(sha));
    }

    #[test]
    fn removing_an_entry_removes_its_blob() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(dir.path(), "o/r");
        let blob = cache.blob("bad");
        fs::create_dir_all(blob.parent().unwrap()).unwrap();
        fs::write(&blob, "x").unwrap();
        let pointer = cache.pointer("c", "f");
        cache.link(&blob, &pointer).unwrap();
        cache.remove_entry(&pointer);
        assert!(!blob.exists() && fs::symlink_metadata(&pointer).is_err());
    }
}
