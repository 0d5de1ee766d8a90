//! Requests to the Hub through hf-hub's sync API: the repo's listing, and each file downloaded
//! into the cache (resumed from its `.part`, retried, locked) then checked against the listing.

use std::io::Read;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::api::Progress;
use hf_hub::{Cache, Repo, RepoType};
use indicatif::ProgressBar;

use super::cache::{file_size, RepoCache};
use super::id::HubId;
use super::listing::{Digest, RepoFile, RepoListing};
use super::settings::HubSettings;
use super::verify;
use crate::error::{FetchError, Result};
use crate::fetch::FetchStatus;

/// A file of the model, in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    /// The path inside the repo.
    pub name: String,
    /// `snapshots/<commit>/<name>` in the hub cache.
    pub path: PathBuf,
    pub size: u64,
    /// Known when this fetch checked the file or the Hub listed it.
    pub sha256: Option<String>,
    /// `Fetched` when downloaded now, `AlreadyPresent` when the cache had it.
    pub status: FetchStatus,
}

/// hf-hub's `Api` for one set of settings.
pub struct HubClient<'a> {
    api: Api,
    settings: &'a HubSettings,
    progress: bool,
}

impl<'a> HubClient<'a> {
    /// `progress`: draw bars (only when stderr is a terminal).
    pub fn new(settings: &'a HubSettings, progress: bool) -> Result<Self> {
        let api = ApiBuilder::from_cache(Cache::new(settings.cache_dir.clone()))
            .with_endpoint(settings.endpoint.clone())
            .with_token(settings.token.clone())
            .with_retries(settings.max_retries)
            .with_progress(false)
            .with_user_agent("triage", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| FetchError::Hub(format!("setting up the Hub client: {e}")))?;
        Ok(Self {
            api,
            settings,
            progress,
        })
    }

    /// The files of `id`'s revision with their sizes and hashes.
    pub fn list(&self, id: &HubId) -> Result<RepoListing> {
        let what = format!("listing {}@{}", id.repo, id.revision);
        let repo = Repo::with_revision(id.repo.clone(), RepoType::Model, id.revision.clone());
        let response = self
            .api
            .repo(repo)
            .info_request()
            .query("blobs", "true")
            .call()
            .map_err(|e| self.http_error(e, &what))?;
        let mut text = String::new();
        response
            .into_reader()
            .read_to_string(&mut text)
            .map_err(|e| FetchError::Hub(format!("{what}: reading the answer: {e}")))?;
        RepoListing::from_json(&id.repo, &text)
    }

    /// `file` of `repo` at `commit` in the cache: linked from a blob the cache already holds,
    /// else downloaded, then checked.
    pub fn fetch_file(
        &self,
        cache: &RepoCache,
        repo: &str,
        commit: &str,
        file: &RepoFile,
    ) -> Result<HubFile> {
        let pointer = cache.pointer(commit, &file.name);
        let blob = cache.blob(file.digest.hex());
        if let Some(found) = self.reuse(cache, &pointer, &blob, file)? {
            return Ok(found);
        }
        // A stale link would stop hf-hub from linking the new blob; a `.part` as long as the
        // file would make it ask for bytes past the end, forever.
        let _ = std::fs::remove_file(&pointer);
        remove_overlong_part(&blob, file.size);
        let what = format!("downloading {repo}/{}", file.name);
        let pinned = Repo::with_revision(repo.to_string(), RepoType::Model, commit.to_string());
        let got = self
            .api
            .repo(pinned)
            .download_with_progress(&file.name, Bar::new(self.progress))
            .map_err(|e| self.api_error(e, &what))?;
        if got != pointer {
            cache.remove_entry(&got);
            return Err(FetchError::Hub(format!(
                "{what}: the Hub answered with {}, not the listed commit {commit}",
                got.display()
            )));
        }
        let sha256 = verify::check(cache, &pointer, file, self.progress)?;
        Ok(hub_file(pointer, file, Some(sha256), FetchStatus::Fetched))
    }

    /// The file from the cache when it holds it at the listed size: the pointer, or a blob of
    /// another snapshot (or Python's) linked in. LFS files are trusted by size (their blob is
    /// named by its sha256); small plain files are hashed, and fetched again on a mismatch.
    fn reuse(
        &self,
        cache: &RepoCache,
        pointer: &Path,
        blob: &Path,
        file: &RepoFile,
    ) -> Result<Option<HubFile>> {
        if file_size(pointer) != Some(file.size) {
            if file_size(blob) != Some(file.size) {
                return Ok(None);
            }
            cache.link(blob, pointer)?;
        }
        let sha256 = match &file.digest {
            Digest::Sha256(hex) => hex.clone(),
            Digest::GitSha1(_) => match verify::check(cache, pointer, file, false) {
                Ok(sha256) => sha256,
                Err(FetchError::Integrity(_)) => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        let path = pointer.to_path_buf();
        Ok(Some(hub_file(
            path,
            file,
            Some(sha256),
            FetchStatus::AlreadyPresent,
        )))
    }

    fn api_error(&self, e: ApiError, what: &str) -> FetchError {
        match e {
            ApiError::RequestError(e) => self.http_error(*e, what),
            ApiError::TooManyRetries(e) => {
                let what = format!("{what} (retried {} times)", self.settings.max_retries);
                self.api_error(*e, &what)
            }
            ApiError::IoError(e) => FetchError::Hub(format!(
                "{what}: {e}; what arrived is kept: run again to resume"
            )),
            ApiError::LockAcquisition(path) => FetchError::Hub(format!(
                "{what}: another process holds {} and is downloading the same file",
                path.display()
            )),
            ApiError::MissingHeader(h) | ApiError::InvalidHeader(h) => FetchError::Hub(format!(
                "{what}: {} answered without a valid {h} header, which a Hugging Face Hub sends \
                 (is HF_ENDPOINT a Hub?)",
                self.settings.endpoint
            )),
            other => FetchError::Hub(format!("{what}: {other}")),
        }
    }

    fn http_error(&self, e: ureq::Error, what: &str) -> FetchError {
        let endpoint = &self.settings.endpoint;
        match e {
            ureq::Error::Status(code @ (401 | 403), _) => FetchError::NotFound(format!(
                "{what}: {endpoint} refused access ({code}): the repo is gated or private, or does \
                 not exist; {}",
                self.token_hint()
            )),
            ureq::Error::Status(404, _) => FetchError::NotFound(format!(
                "{what}: no such repo, revision or file on {endpoint} (404)"
            )),
            ureq::Error::Status(code, _) => {
                FetchError::Hub(format!("{what}: {endpoint} answered HTTP {code}"))
            }
            ureq::Error::Transport(t) => {
                FetchError::Hub(format!("{what}: cannot reach {endpoint}: {t}"))
            }
        }
    }

    fn token_hint(&self) -> &'static str {
        match self.settings.token {
            None => {
                "set HF_TOKEN to a token that has access (or log in with `hf auth login`, \
                 which writes the token file)"
            }
            Some(_) => {
                "the token given (HF_TOKEN or the token file) has no access: accept the repo's \
                 terms on its page, or use another token"
            }
        }
    }
}

fn hub_file(
    path: PathBuf,
    file: &RepoFile,
    sha256: Option<String>,
    status: FetchStatus,
) -> HubFile {
    HubFile {
        name: file.name.clone(),
        path,
        size: file.size,
        sha256,
        status,
    }
}

/// hf-hub resumes from `blobs/<hash>.part` with `Range: bytes=<len>-`; one that already holds
/// the whole file (killed before the rename) or more cannot be resumed, so it starts over.
fn remove_overlong_part(blob: &Path, size: u64) {
    let part = blob.with_extension("part");
    if file_size(&part).is_some_and(|len| len >= size) {
        let _ = std::fs::remove_file(part);
    }
}

/// hf-hub's progress callbacks drawn with triage's bar style.
struct Bar(ProgressBar);

impl Bar {
    fn new(progress: bool) -> Self {
        Self(crate::fetch::bytes_bar(progress, 0, String::new()))
    }
}

impl Progress for Bar {
    fn init(&mut self, size: usize, filename: &str) {
        self.0.set_length(size as u64);
        self.0.set_position(0);
        self.0.set_message(filename.to_string());
    }

    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }

    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}
