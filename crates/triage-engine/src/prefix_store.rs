//! Persisted prefixes: the KV blocks of a pinned prefix saved as one safetensors file, keyed by
//! the content hash of the model's weights, the KV dtype and layout, and a hash of the tokens,
//! so replicas on other machines (sharing the directory) find each other's files and never
//! overwrite a different prefix. A file is written once, under a temporary name first. Loading
//! checks the key, the exact tokens and a sha256 of the contents; any mismatch is a miss
//! (recompute), never wrong output.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use sha2::{Digest, Sha256};

use crate::{EngineError, Result};

const FORMAT: &str = "triage-prefix-v2";

/// What a stored prefix must match to be used: the weights, the cache layout and the tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixKey {
    /// sha256 of the weights (`weights_hash::weights_sha256`).
    pub weights_sha256: String,
    /// The shapes the KV blocks depend on (architecture, layers, KV heads, head size).
    pub shapes: String,
    /// The KV cache's dtype (`f32`, `bf16`, ...).
    pub kv_dtype: String,
    pub block_size: usize,
    /// Chained hash of the prefix's full blocks, seeded with the weights' hash (see
    /// `triage_core::hash_prefix`): equal on every machine, whatever the model is called there.
    pub tokens_hash: u64,
}

impl PrefixKey {
    /// The name of this prefix's file (and of its object in a shared store): one per (weights,
    /// KV dtype, block size, tokens).
    pub fn file_name(&self) -> String {
        let weights: String = self.weights_sha256.chars().take(16).collect();
        format!(
            "{weights}-{}-b{}-{:016x}.safetensors",
            self.kv_dtype, self.block_size, self.tokens_hash
        )
    }

    /// Where this prefix lives under `dir`.
    pub fn path_in(&self, dir: &Path) -> PathBuf {
        dir.join(self.file_name())
    }

    fn metadata(&self, num_tokens: usize, checksum: &str) -> HashMap<String, String> {
        HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("weights_sha256".to_string(), self.weights_sha256.clone()),
            ("shapes".to_string(), self.shapes.clone()),
            ("kv_dtype".to_string(), self.kv_dtype.clone()),
            ("block_size".to_string(), self.block_size.to_string()),
            (
                "tokens_hash".to_string(),
                format!("{:016x}", self.tokens_hash),
            ),
            ("num_tokens".to_string(), num_tokens.to_string()),
            ("sha256".to_string(), checksum.to_string()),
        ])
    }
}

/// KV contents of a prefix's full blocks, per layer `[num_blocks, block_size, kv_heads, head_dim]`.
#[derive(Debug)]
pub struct StoredPrefix {
    pub k: Vec<Tensor>,
    pub v: Vec<Tensor>,
}

/// Why a stored prefix was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixMiss {
    NotFound,
    /// The file exists but belongs to other tokens, another model or layout, or is corrupt.
    Mismatch(String),
}

/// Write `prefix` for `tokens` to `path` atomically (a temporary file unique to this process
/// and moment, then a rename), unless a valid file for this key and these tokens is there
/// already (another replica wrote it): each file is written once. Returns whether it wrote.
pub fn save(path: &Path, key: &PrefixKey, tokens: &[u32], prefix: &StoredPrefix) -> Result<bool> {
    let io = |e: std::io::Error| EngineError::Invalid(format!("{}: {e}", path.display()));
    let num_layers = prefix.k.len();
    if let Ok(bytes) = std::fs::read(path) {
        if parse(&bytes, key, tokens, num_layers).is_ok() {
            return Ok(false);
        }
    }
    let token_tensor = Tensor::new(tokens, &Device::Cpu)?;
    let mut named: Vec<(String, Tensor)> = vec![("tokens".to_string(), token_tensor)];
    for (i, (k, v)) in prefix.k.iter().zip(&prefix.v).enumerate() {
        named.push((format!("k.{i}"), k.to_device(&Device::Cpu)?));
        named.push((format!("v.{i}"), v.to_device(&Device::Cpu)?));
    }
    let checksum = checksum(&named)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // Unique across replicas sharing the directory: the process id alone may repeat across
    // machines, the moment too, both together practically never.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_extension(format!("tmp{}-{nanos}", std::process::id()));
    let meta = key.metadata(tokens.len(), &checksum);
    safetensors::serialize_to_file(named.iter().map(|(n, t)| (n.as_str(), t)), Some(meta), &tmp)
        .map_err(|e| EngineError::Invalid(format!("{}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(true)
}

/// Read the prefix for `tokens` from `path` onto `device`, or say why it cannot be used.
pub fn load(
    path: &Path,
    key: &PrefixKey,
    tokens: &[u32],
    num_layers: usize,
    device: &Device,
) -> Result<std::result::Result<StoredPrefix, PrefixMiss>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Err(PrefixMiss::NotFound)),
        Err(e) => return Err(EngineError::Invalid(format!("{}: {e}", path.display()))),
    };
    Ok(parse(&bytes, key, tokens, num_layers).and_then(|named| {
        let mut named: HashMap<String, Tensor> = named.into_iter().collect();
        let mut take = |name: String| {
            named
                .remove(&name)
                .ok_or_else(|| PrefixMiss::Mismatch(format!("no tensor {name}")))
                .and_then(|t| t.to_device(device).map_err(|e| miss(e.to_string())))
        };
        let k = (0..num_layers)
            .map(|i| take(format!("k.{i}")))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let v = (0..num_layers)
            .map(|i| take(format!("v.{i}")))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(StoredPrefix { k, v })
    }))
}

fn miss(message: impl Into<String>) -> PrefixMiss {
    PrefixMiss::Mismatch(message.into())
}

/// Check the header against `key`, the stored tokens against `tokens` and the checksum.
fn parse(
    bytes: &[u8],
    key: &PrefixKey,
    tokens: &[u32],
    num_layers: usize,
) -> std::result::Result<Vec<(String, Tensor)>, PrefixMiss> {
    let (_, header) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| miss(e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let num_tokens = tokens.len().to_string();
    let expected = key.metadata(tokens.len(), "");
    for field in [
        "format",
        "weights_sha256",
        "shapes",
        "kv_dtype",
        "block_size",
        "tokens_hash",
    ] {
        if meta.get(field) != expected.get(field) {
            return Err(miss(format!(
                "{field} is {:?}, expected {:?}",
                meta.get(field),
                expected.get(field)
            )));
        }
    }
    if meta.get("num_tokens") != Some(&num_tokens) {
        return Err(miss("token count differs"));
    }
    let stored = safetensors::SafeTensors::deserialize(bytes).map_err(|e| miss(e.to_string()))?;
    let mut named = Vec::with_capacity(1 + 2 * num_layers);
    let mut names = vec!["tokens".to_string()];
    for i in 0..num_layers {
        names.push(format!("k.{i}"));
        names.push(format!("v.{i}"));
    }
    for name in names {
        let view = stored.tensor(&name).map_err(|e| miss(e.to_string()))?;
        let t = candle_core::safetensors::Load::load(&view, &Device::Cpu)
            .map_err(|e| miss(e.to_string()))?;
        named.push((name, t));
    }
    let stored_tokens = named[0]
        .1
        .to_vec1::<u32>()
        .map_err(|e| miss(e.to_string()))?;
    if stored_tokens != tokens {
        return Err(miss(
            "stored tokens differ (a corrupt file or a hash collision)",
        ));
    }
    let sum = checksum(&named).map_err(|e| miss(e.to_string()))?;
    if meta.get("sha256") != Some(&sum) {
        return Err(miss("checksum mismatch (corrupt file)"));
    }
    Ok(named)
}

/// sha256 over every tensor's name, dtype, shape and bytes, in order.
fn checksum(named: &[(String, Tensor)]) -> Result<String> {
    let mut hasher = Sha256::new();
    for (name, t) in named {
        hasher.update(name.as_bytes());
        hasher.update(format!("{:?}{:?}", t.dtype(), t.dims()).as_bytes());
        let bytes: Vec<u8> = match t.dtype() {
            DType::U32 => t
                .flatten_all()?
                .to_vec1::<u32>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            _ => t
                .flatten_all()?
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        };
        hasher.update(&bytes);
    }
    Ok(format!("{:x}", hasher.finalize()))
}
