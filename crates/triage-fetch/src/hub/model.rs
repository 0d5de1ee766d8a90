//! A model from the Hub: fetched into the hub cache, or found there without a request.

use std::path::PathBuf;

use super::cache::{file_size, RepoCache};
use super::client::{HubClient, HubFile};
use super::id::HubId;
use super::listing::RepoListing;
use super::pick::{pick, shards, Pick};
use super::settings::HubSettings;
use crate::error::{FetchError, IoContext, Result};
use crate::fetch::FetchStatus;

/// A model in the hub cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubModel {
    pub id: HubId,
    /// The commit of the snapshot the files are in.
    pub commit: String,
    /// What the loader opens: the snapshot folder (safetensors) or the one file (GGUF).
    pub path: PathBuf,
    pub files: Vec<HubFile>,
}

/// Fetches `id` into the hub cache: lists the revision, picks the model's files, downloads those
/// the cache lacks, checks them, then points `refs/<revision>` at the commit. Offline, only what
/// the cache holds resolves. `progress`: bars on a terminal.
pub fn fetch_hub(id: &HubId, settings: &HubSettings, progress: bool) -> Result<HubModel> {
    if settings.offline {
        return cached(id, settings).map_err(|why| offline_error(id, &why));
    }
    let client = HubClient::new(settings, progress)?;
    let listing = client.list(id)?;
    let cache = RepoCache::new(&settings.cache_dir, &id.repo);
    let picked = pick(&listing.names(), id)?;
    let mut files = Vec::new();
    for name in picked.files() {
        files.push(fetch_listed(&client, &cache, id, &listing, &name)?);
    }
    if let Pick::Safetensors {
        index: Some(index), ..
    } = &picked
    {
        for shard in read_shards(&cache, id, &listing.commit, index)? {
            files.push(fetch_listed(&client, &cache, id, &listing, &shard)?);
        }
    }
    if id.revision != listing.commit {
        cache.write_ref(&id.revision, &listing.commit)?;
        // hf-hub, given the commit as revision, wrote `refs/<commit>`; Python writes none.
        cache.remove_ref(&listing.commit);
    }
    Ok(HubModel {
        path: model_path(&cache, &listing.commit, &picked),
        commit: listing.commit,
        id: id.clone(),
        files,
    })
}

/// `id` from the cache when its snapshot holds the whole model, with no request; else fetched
/// (unless offline).
pub fn resolve_hub(id: &HubId, settings: &HubSettings, progress: bool) -> Result<HubModel> {
    match cached(id, settings) {
        Ok(model) => Ok(model),
        Err(why) if settings.offline => Err(offline_error(id, &why)),
        Err(why) => fetch_hub(id, settings, progress).map_err(|e| {
            e.context(format_args!(
                "{id} is not in the Hugging Face cache ({why}); fetching it from {}",
                settings.endpoint
            ))
        }),
    }
}

fn fetch_listed(
    client: &HubClient,
    cache: &RepoCache,
    id: &HubId,
    listing: &RepoListing,
    name: &str,
) -> Result<HubFile> {
    let file = listing.get(name).ok_or_else(|| {
        FetchError::NotFound(format!(
            "{}@{} has no file {name}, which its model needs",
            id.repo, listing.commit
        ))
    })?;
    client.fetch_file(cache, &id.repo, &listing.commit, file)
}

fn read_shards(cache: &RepoCache, id: &HubId, commit: &str, index: &str) -> Result<Vec<String>> {
    let path = cache.pointer(commit, index);
    let text = std::fs::read_to_string(&path).at(|| format!("reading {}", path.display()))?;
    shards(&text, &id.repo)
}

fn model_path(cache: &RepoCache, commit: &str, picked: &Pick) -> PathBuf {
    match picked {
        Pick::Safetensors { .. } => cache.snapshot(commit),
        Pick::File(name) => cache.pointer(commit, name),
    }
}

/// The model from the snapshot `refs/<revision>` names, if that holds every file it needs;
/// else why not.
fn cached(id: &HubId, settings: &HubSettings) -> std::result::Result<HubModel, String> {
    let cache = RepoCache::new(&settings.cache_dir, &id.repo);
    let commit = cache
        .commit_of(&id.revision)
        .ok_or_else(|| format!("no refs/{} under {}", id.revision, cache.dir().display()))?;
    let snapshot = cache.snapshot(&commit);
    let in_snapshot = |e: FetchError| format!("{}: {e}", snapshot.display());
    let picked = pick(&cache.snapshot_files(&commit), id).map_err(in_snapshot)?;
    let mut names = picked.files();
    if let Pick::Safetensors {
        index: Some(index), ..
    } = &picked
    {
        names.extend(read_shards(&cache, id, &commit, index).map_err(in_snapshot)?);
    }
    let mut files = Vec::new();
    for name in names {
        let path = cache.pointer(&commit, &name);
        let size =
            file_size(&path).ok_or_else(|| format!("{} lacks {name}", snapshot.display()))?;
        files.push(HubFile {
            name,
            path,
            size,
            sha256: None,
            status: FetchStatus::AlreadyPresent,
        });
    }
    Ok(HubModel {
        path: model_path(&cache, &commit, &picked),
        commit,
        id: id.clone(),
        files,
    })
}

fn offline_error(id: &HubId, why: &str) -> FetchError {
    FetchError::NotFound(format!(
        "{id} is not in the Hugging Face cache ({why}) and HF_HUB_OFFLINE is set, so nothing is \
         downloaded: fetch it first with `triage models fetch {id}` without HF_HUB_OFFLINE"
    ))
}
