//! Pinned prefixes of an `LlmEngine`: prefill once and keep resident (the routing pipeline pins
//! each corpus in the long-context model), save to disk, and restore after a restart.

use std::path::{Path, PathBuf};

use triage_core::{hash_prefix, PrefixHandle};

use std::sync::mpsc::Receiver;

use super::{LlmEngine, RequestId, StreamEvent};
use crate::generate::{EntropySettings, FinishReason, GenerateRequest, Prompt};
use crate::prefix_store::{self, PrefixKey, PrefixMiss, StoredPrefix};
use crate::sampler::SamplingParams;
use crate::weights_hash::weights_sha256;
use crate::{EngineError, Result};

/// Where the KV of a pinned prefix came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixSource {
    /// Already in the block pool.
    Cache,
    /// Read from a persisted file.
    Disk,
    /// Prefilled now; the first `reused_tokens` of it were found in the cache (a corpus grown
    /// at its end prefills only the new part).
    Computed { reused_tokens: usize },
}

impl LlmEngine {
    /// The shapes a persisted prefix's KV blocks depend on.
    fn kv_shapes(&self) -> String {
        let cfg = self.model.transformer.config();
        format!(
            "{:?}|l{}|kv{}x{}|v{}",
            cfg.arch, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size
        )
    }

    /// The part of `tokens` that fills whole blocks (only full blocks are cached and pinned).
    pub(super) fn full_blocks<'t>(&self, tokens: &'t [u32]) -> &'t [u32] {
        let bs = self.scheduler.kv().block_size();
        &tokens[..tokens.len() / bs * bs]
    }

    /// The key the full blocks `full` of a prefix are stored under: the weights' content hash
    /// (memoised, see `weights_hash`), the KV layout and dtype, and the tokens.
    pub fn prefix_key(&self, full: &[u32]) -> Result<PrefixKey> {
        let bs = self.scheduler.kv().block_size();
        let weights_sha256 = weights_sha256(&self.model.path)?;
        let tokens_hash = hash_prefix(full, bs, &weights_sha256, None)
            .last()
            .map_or(0, |h| h.0);
        Ok(PrefixKey {
            shapes: self.kv_shapes(),
            kv_dtype: self.cache.dtype().as_str().to_string(),
            block_size: bs,
            tokens_hash,
            weights_sha256,
        })
    }

    /// Keep the full blocks of `tokens` resident, prefilling them first unless already cached.
    /// Other requests keep running while the prefix is prefilled.
    pub fn pin_prefix(&mut self, tokens: &[u32]) -> Result<(PrefixHandle, PrefixSource)> {
        self.pin_blocking(tokens, None)
    }

    /// Start pinning `tokens`: done at once when the blocks are cached (or, with `dir`, in a
    /// persisted file); otherwise its prefill is queued like any request and
    /// [`LlmEngine::finish_pin`] completes it once [`PendingPin::is_done`]. A caller that
    /// serves other requests keeps stepping meanwhile, so nobody waits for a corpus prefill.
    pub fn start_pin(&mut self, tokens: &[u32], dir: Option<&Path>) -> Result<PinStart> {
        let full = self.full_blocks(tokens).to_vec();
        if let Some(handle) = self.scheduler.kv_mut().pin_prefix(&full, None) {
            return Ok(PinStart::Done(handle, PrefixSource::Cache));
        }
        if let Some(dir) = dir {
            if let Ok(handle) = self.load_prefix(&full, dir)? {
                return Ok(PinStart::Done(handle, PrefixSource::Disk));
            }
        }
        let request = GenerateRequest {
            prompt: Prompt::Tokens(full.clone()),
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: Some(1),
                ignore_eos: true,
                ..SamplingParams::default()
            },
            entropy: EntropySettings::default(),
        };
        let (id, events) = self.add_request(&request)?;
        Ok(PinStart::Pending(PendingPin {
            full,
            dir: dir.map(Path::to_path_buf),
            id,
            events,
        }))
    }

    /// Pin a prefix whose prefill has finished, saving it under its directory if it had one.
    /// A failed save keeps the pin (the file only spares the next start a prefill) and comes
    /// back as the second value.
    pub fn finish_pin(
        &mut self,
        pending: PendingPin,
    ) -> Result<(PrefixHandle, PrefixSource, Option<EngineError>)> {
        let finished = pending.events.try_iter().find_map(|event| match event {
            StreamEvent::Finished { reason, usage } => Some((reason, usage)),
            _ => None,
        });
        let reused_tokens = finished
            .as_ref()
            .map_or(0, |(_, usage)| usage.cached_tokens);
        if let Some((FinishReason::Error(message), _)) = finished {
            return Err(EngineError::Invalid(format!(
                "prefilling the {}-token prefix failed: {message}",
                pending.full.len()
            )));
        }
        let handle = self
            .scheduler
            .kv_mut()
            .pin_prefix(&pending.full, None)
            .ok_or_else(|| {
                EngineError::Invalid(format!(
                    "prefix of {} tokens was evicted before it could be pinned (KV pool too small)",
                    pending.full.len()
                ))
            })?;
        let saved = match &pending.dir {
            Some(dir) => self.save_prefix(&pending.full, &handle, dir).err(),
            None => None,
        };
        Ok((handle, PrefixSource::Computed { reused_tokens }, saved))
    }

    /// [`LlmEngine::start_pin`] and [`LlmEngine::finish_pin`] with the engine stepped in between
    /// (a caller that owns the engine alone).
    fn pin_blocking(
        &mut self,
        tokens: &[u32],
        dir: Option<&Path>,
    ) -> Result<(PrefixHandle, PrefixSource)> {
        let pending = match self.start_pin(tokens, dir)? {
            PinStart::Done(handle, source) => return Ok((handle, source)),
            PinStart::Pending(pending) => pending,
        };
        while !pending.is_done(self) {
            self.step()?;
        }
        let (handle, source, unsaved) = self.finish_pin(pending)?;
        if let Some(e) = unsaved {
            tracing::warn!(error = %e, "a pinned prefix could not be saved; the next start prefills it again");
        }
        Ok((handle, source))
    }

    /// Let a pinned prefix be evicted again.
    pub fn unpin_prefix(&mut self, handle: &PrefixHandle) {
        self.scheduler.kv_mut().unpin_prefix(handle);
    }

    /// Write the pinned prefix `handle` of `tokens` under `dir`; returns the file written.
    pub fn save_prefix(
        &self,
        tokens: &[u32],
        handle: &PrefixHandle,
        dir: &Path,
    ) -> Result<PathBuf> {
        let full = self.full_blocks(tokens);
        if handle.num_tokens != full.len() {
            return Err(EngineError::Invalid(format!(
                "handle covers {} tokens, the prefix has {} in full blocks",
                handle.num_tokens,
                full.len()
            )));
        }
        let key = self.prefix_key(full)?;
        let (k, v) = self.cache.read_blocks(&handle.blocks)?;
        let path = key.path_in(dir);
        prefix_store::save(&path, &key, full, &StoredPrefix { k, v })?;
        if let Some(remote) = &self.prefix_remote {
            remote.publish(&key.file_name(), &path)?;
        }
        Ok(path)
    }

    /// Pin the prefix `tokens` from its file under `dir`. A missing, foreign or corrupt file is a
    /// miss (`Ok(Err(..))`) and leaves the pool untouched.
    pub fn load_prefix(
        &mut self,
        tokens: &[u32],
        dir: &Path,
    ) -> Result<std::result::Result<PrefixHandle, PrefixMiss>> {
        let full = self.full_blocks(tokens).to_vec();
        let key = self.prefix_key(&full)?;
        let device = self.model.transformer.device().clone();
        let num_layers = self.cache.num_layers();
        let path = key.path_in(dir);
        let mut found = prefix_store::load(&path, &key, &full, num_layers, &device)?;
        if found
            .as_ref()
            .is_err_and(|miss| *miss == PrefixMiss::NotFound)
            && self.fetch_from_remote(&key, &path)
        {
            found = prefix_store::load(&path, &key, &full, num_layers, &device)?;
        }
        let stored = match found {
            Ok(stored) => stored,
            Err(miss) => return Ok(Err(miss)),
        };
        // A file whose checksum holds but whose blocks are shaped for another layout (forged,
        // or written by a build with another cache layout) is a miss, before any block is taken.
        let shape = self
            .cache
            .blocks_shape(full.len() / self.cache.block_size())?;
        if let Some(bad) = stored.k.iter().chain(&stored.v).find(|t| t.dims() != shape) {
            return Ok(Err(PrefixMiss::Mismatch(format!(
                "stored blocks of shape {:?}, the cache takes {shape:?}",
                bad.dims()
            ))));
        }
        let Some((handle, to_fill)) = self.scheduler.kv_mut().import_prefix(&full, None) else {
            return Err(EngineError::Invalid(format!(
                "no room for a {}-token prefix in the KV pool",
                full.len()
            )));
        };
        if !to_fill.is_empty() {
            let blocks: Vec<u32> = to_fill.iter().map(|&i| handle.blocks[i]).collect();
            let rows = candle_core::Tensor::new(
                to_fill
                    .iter()
                    .map(|&i| i as u32)
                    .collect::<Vec<_>>()
                    .as_slice(),
                &device,
            )?;
            let pick = |t: &candle_core::Tensor| t.index_select(&rows, 0);
            let k = stored
                .k
                .iter()
                .map(pick)
                .collect::<candle_core::Result<Vec<_>>>()?;
            let v = stored
                .v
                .iter()
                .map(pick)
                .collect::<candle_core::Result<Vec<_>>>()?;
            self.cache.write_blocks(&blocks, &k, &v)?;
        }
        Ok(Ok(handle))
    }

    /// Copy the prefix `key` from the shared store (if one is set) to `path`; whether it did. A
    /// store that cannot be reached is a miss (the prefix is computed), not a failed pin.
    fn fetch_from_remote(&self, key: &PrefixKey, path: &Path) -> bool {
        let Some(remote) = &self.prefix_remote else {
            return false;
        };
        remote
            .fetch(&key.file_name(), path)
            .inspect_err(|e| tracing::warn!(error = %e, "fetching a prefix from the shared store failed; computing it"))
            .unwrap_or(false)
    }

    /// Pin `tokens` as a long-lived prefix: from the pool if cached, else from its file under
    /// `dir`, else prefill it now and save it there for the next start (a failed save keeps
    /// the pin).
    pub fn pin_persisted_prefix(
        &mut self,
        tokens: &[u32],
        dir: &Path,
    ) -> Result<(PrefixHandle, PrefixSource)> {
        self.pin_blocking(tokens, Some(dir))
    }
}

/// How [`LlmEngine::start_pin`] went.
#[derive(Debug)]
pub enum PinStart {
    /// Pinned already, from the cache or a file.
    Done(PrefixHandle, PrefixSource),
    /// Its prefill is queued.
    Pending(PendingPin),
}

/// A prefix whose prefill is queued; [`LlmEngine::finish_pin`] pins it once done.
#[derive(Debug)]
pub struct PendingPin {
    full: Vec<u32>,
    dir: Option<PathBuf>,
    id: RequestId,
    events: Receiver<StreamEvent>,
}

impl PendingPin {
    /// The request that prefills it.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// Whether its prefill has finished (or was refused).
    pub fn is_done(&self, engine: &LlmEngine) -> bool {
        !engine.states.contains_key(&self.id)
    }
}
