//! `TriageConfig`: the one configuration file of triage, read by `triage serve`, the other
//! commands and `triage::Engine`: the models by role (`[[models]]`), the pipeline's embedder and
//! corpora (`[pipeline]`), the stages' settings (`[routing]`), and the server's listener and
//! limits (top-level keys, read by the server only).
//!
//! The library's earlier file spelled three things differently; they still load, each with a
//! deprecation warning: a `[models]` table of role = name (now `[[models]]` entries with a
//! `role`), `[models] embedder` (now `[pipeline] embedder`), and top-level `corpora` and
//! `prefix_dir` (now in `[pipeline]`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use triage_engine::{EngineConfig, KvBudget, PrefixRemote};
use triage_fetch::{
    DEFAULT_BASE_MODEL, DEFAULT_EMBEDDER, DEFAULT_LONG_CONTEXT_MODEL, DEFAULT_ROUTER_MODEL,
};
use triage_models::{parse_kv_dtype, DeviceSpec};
use triage_router::ClassifierSetting;
use triage_router::{ModelRole, RoutingConfig};

use crate::error::{HostError, Result};
use crate::object_prefixes::ObjectPrefixStore;

/// The spelling of a role in the config file (`long-context`; `long_context` is read too).
pub fn role_name(role: ModelRole) -> &'static str {
    match role {
        ModelRole::Router => "router",
        ModelRole::Base => "base",
        ModelRole::LongContext => "long-context",
    }
}

/// One model to load.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The id clients put in `"model"`; also a default model's name when `path` is absent.
    pub name: String,
    /// A GGUF file, a safetensors folder, or a hub id (see `triage models`); default: `name`.
    #[serde(default)]
    pub path: Option<String>,
    /// What the routing pipeline uses it for: `base`, `long-context` or `router`. The first
    /// entry of each role plays it; without a `long-context` or `router` entry the base model
    /// plays that role too. A router loads only when a zero-shot classifier needs it.
    #[serde(default = "default_role")]
    pub role: ModelRole,
    /// KV-cache budget: `"512MiB"`, `"2GiB"`, `"0.3"` (fraction of free memory), `"4096blocks"`.
    #[serde(default = "default_kv_budget")]
    pub kv_budget: String,
    #[serde(default = "default_block_size")]
    pub block_size: usize,
    #[serde(default = "default_max_num_seqs")]
    pub max_num_seqs: usize,
    #[serde(default = "default_max_num_batched_tokens")]
    pub max_num_batched_tokens: usize,
    /// Where the model runs: `"cpu"` (default), `"cuda"` or `"cuda:N"`.
    #[serde(default)]
    pub device: DeviceSpec,
    /// KV-cache dtype: `"bf16"`, `"f16"` or `"f32"`; default bf16 on a GPU, f16 on the CPU.
    #[serde(default)]
    pub kv_dtype: Option<String>,
    /// Replay decode steps from CUDA graphs (a GPU `device` only; ignored on the CPU). Off by
    /// default until a GPU run has shown that graphed decoding gives the eager tokens
    /// (`benches/RESULTS.md`); `triage serve --no-cuda-graphs` turns it off for every model.
    #[serde(default)]
    pub cuda_graphs: bool,
}

fn default_role() -> ModelRole {
    ModelRole::Base
}
fn default_kv_budget() -> String {
    "1GiB".into()
}
fn default_block_size() -> usize {
    16
}
fn default_max_num_seqs() -> usize {
    64
}
fn default_max_num_batched_tokens() -> usize {
    2048
}

impl ModelEntry {
    /// A model with every setting at its default.
    pub fn named(name: &str, role: ModelRole, kv_budget: &str) -> Self {
        Self {
            name: name.into(),
            path: None,
            role,
            kv_budget: kv_budget.into(),
            block_size: default_block_size(),
            max_num_seqs: default_max_num_seqs(),
            max_num_batched_tokens: default_max_num_batched_tokens(),
            device: DeviceSpec::Cpu,
            kv_dtype: None,
            cuda_graphs: false,
        }
    }

    /// What to resolve to a file: the path, else the name.
    pub fn spec(&self) -> &str {
        self.path.as_deref().unwrap_or(&self.name)
    }

    /// The engine settings this entry asks for.
    pub fn engine_config(&self) -> Result<EngineConfig> {
        let invalid = |e: String| HostError::Config(format!("model {:?}: {e}", self.name));
        let kv_budget: KvBudget = self
            .kv_budget
            .parse()
            .map_err(|e: triage_engine::EngineError| invalid(e.to_string()))?;
        if self.block_size == 0 || self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 {
            return Err(invalid(
                "block_size, max_num_seqs and max_num_batched_tokens must be positive".into(),
            ));
        }
        let kv_dtype = match &self.kv_dtype {
            Some(name) => Some(parse_kv_dtype(name).map_err(|e| invalid(e.to_string()))?),
            None => None,
        };
        Ok(EngineConfig {
            kv_budget,
            block_size: self.block_size,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            prefix_caching: true,
            kv_dtype,
            cuda_graphs: self.cuda_graphs && matches!(self.device, DeviceSpec::Cuda(_)),
        })
    }
}

/// How the routing pipeline is offered, and what it answers from.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineSettings {
    /// Offer it on the server (it also needs a model with role `base`).
    pub enabled: bool,
    /// The `model` name that selects it in chat completions.
    pub alias: String,
    /// The sentence embedder of its corpora (a default model's name or a folder).
    pub embedder: String,
    /// Corpora loaded (and their long-context prefixes pinned) at start; others load on first
    /// use.
    pub corpora: Vec<String>,
    /// Where pinned corpus prefixes are persisted; default `$TRIAGE_HOME/prefixes`.
    pub prefix_dir: Option<PathBuf>,
    /// An S3-compatible bucket shared by replicas on other machines (`s3://bucket/path`), of
    /// which `prefix_dir` is then the local cache: a prefix missing there is fetched from it,
    /// and every prefix computed is published to it. See `object_prefixes`.
    pub prefix_store: Option<String>,
    /// Where corpora are stored (`<data_dir>/corpora/NAME`); default `$TRIAGE_HOME`. Replicas
    /// whose `data_dir` is one shared folder share their corpora: one writer at a time, readers
    /// follow its generations.
    pub data_dir: Option<PathBuf>,
    /// How many corpora, and how large, clients may make (`[pipeline.limits]`).
    pub limits: CorpusLimits,
    /// How long a routed question that may take long context waits, in milliseconds, while
    /// its corpus's prefix is being pinned (after a change, or released); past it, it answers
    /// by RAG and its decision record says why. A question forced to long context waits for
    /// the pin to end.
    pub pin_wait_ms: u64,
}

/// Bounds on what clients may store, so that no caller can fill the disk or the memory of a
/// shared server.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct CorpusLimits {
    /// Corpora in the store; creating one more is refused (400).
    pub max_corpora: usize,
    /// Documents (added or deleted) in one request (400 beyond).
    pub max_documents_per_request: usize,
    /// Bytes of document text in one corpus after a change (413 beyond).
    pub max_corpus_bytes: usize,
    /// Bytes of a document id (400 beyond): ids go into the long-context prefix.
    pub max_document_id_bytes: usize,
    /// Bytes of a document title (400 beyond): titles go into the long-context prefix.
    pub max_document_title_bytes: usize,
}

impl CorpusLimits {
    /// The bounds on one document's id and title.
    pub fn documents(&self) -> triage_retrieval::DocumentLimits {
        triage_retrieval::DocumentLimits {
            max_id_bytes: self.max_document_id_bytes,
            max_title_bytes: self.max_document_title_bytes,
        }
    }
}

impl Default for CorpusLimits {
    fn default() -> Self {
        Self {
            max_corpora: 256,
            max_documents_per_request: 10_000,
            max_corpus_bytes: 256 << 20,
            max_document_id_bytes: triage_retrieval::DocumentLimits::default().max_id_bytes,
            max_document_title_bytes: triage_retrieval::DocumentLimits::default().max_title_bytes,
        }
    }
}

impl Default for PipelineSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            alias: "triage".into(),
            embedder: DEFAULT_EMBEDDER.into(),
            corpora: Vec::new(),
            prefix_dir: None,
            prefix_store: None,
            data_dir: None,
            limits: CorpusLimits::default(),
            pin_wait_ms: crate::host::DEFAULT_PIN_WAIT.as_millis() as u64,
        }
    }
}

impl PipelineSettings {
    /// Where pinned prefixes go: the configured folder, else `$TRIAGE_HOME/prefixes`.
    pub fn prefix_dir(&self) -> PathBuf {
        self.prefix_dir
            .clone()
            .unwrap_or_else(|| triage_models::paths::triage_home().join("prefixes"))
    }

    /// The shared prefix store the engines publish to and fetch from, if one is configured.
    pub fn prefix_remote(&self) -> Result<Option<Arc<dyn PrefixRemote>>> {
        let Some(url) = &self.prefix_store else {
            return Ok(None);
        };
        Ok(Some(Arc::new(ObjectPrefixStore::open(url)?)))
    }

    /// How long a routed question waits for a pin under way.
    pub fn pin_wait(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.pin_wait_ms)
    }

    /// Where corpora are stored: the configured folder, else `$TRIAGE_HOME`.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(triage_models::paths::triage_home)
    }
}

/// What `triage serve` listens on and how much it accepts (read by the server only).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub host: String,
    pub port: u16,
    /// When set, every `/v1/*` request needs `Authorization: Bearer <api_key>`.
    pub api_key: Option<String>,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// Requests a model may hold, queued or running, before new ones get 429.
    pub max_pending_requests: usize,
    /// After SIGTERM/Ctrl-C, how long in-flight requests may take before the server exits.
    pub shutdown_timeout_s: u64,
    /// How long a client may take to send a request's headers, and how long a kept-alive
    /// connection may sit idle between requests, before it is closed.
    pub header_timeout_s: u64,
    /// How long a client may take to send a request's body (408 beyond).
    pub body_timeout_s: u64,
    /// Open connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Host names `/v1` requests may carry besides the loopback names, for a server bound to
    /// loopback (a DNS-rebinding page names its own domain); a server bound elsewhere accepts
    /// any name unless this is set.
    pub allowed_hosts: Vec<String>,
}

impl ServerSettings {
    /// Whether the server listens on a loopback address only.
    pub fn is_loopback(&self) -> bool {
        is_loopback_name(&self.host)
    }

    /// The warning to print before binding, when the API is open to the network without a key.
    pub fn exposure_warning(&self) -> Option<String> {
        (!self.is_loopback() && self.api_key.is_none()).then(|| {
            format!(
                "listening on {} without an API key: anyone who can reach it can use the models \
                 (set api_key, api_key_file or TRIAGE_API_KEY)",
                self.host
            )
        })
    }

    /// Whether a request's `Host` header (`name` or `name:port`) names this server.
    pub fn allows_host(&self, host: &str) -> bool {
        let name = host_name(host);
        if self
            .allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
        {
            return true;
        }
        if self.is_loopback() {
            is_loopback_name(name)
        } else {
            self.allowed_hosts.is_empty()
        }
    }
}

/// `name` of `name:port`, `[v6]:port` or a bare name.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether `name` (a bare name or address, `[v6]` allowed) is loopback.
fn is_loopback_name(name: &str) -> bool {
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            max_body_bytes: 16 * 1024 * 1024,
            max_pending_requests: 256,
            shutdown_timeout_s: 30,
            header_timeout_s: 30,
            body_timeout_s: 60,
            max_connections: 1024,
            allowed_hosts: Vec::new(),
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct TriageConfig {
    pub server: ServerSettings,
    pub models: Vec<ModelEntry>,
    pub pipeline: PipelineSettings,
    pub routing: RoutingConfig,
    /// Old spellings this file used, each with what to write instead (logged when read).
    pub deprecated: Vec<String>,
}

/// The fetched default models: the 0.5B answers, the 1.5B takes long contexts, the 135M
/// classifies queries zero-shot (loaded only for a zero-shot classifier).
fn default_models() -> Vec<ModelEntry> {
    vec![
        ModelEntry::named(DEFAULT_BASE_MODEL, ModelRole::Base, "1GiB"),
        ModelEntry::named(DEFAULT_LONG_CONTEXT_MODEL, ModelRole::LongContext, "2GiB"),
        ModelEntry::named(DEFAULT_ROUTER_MODEL, ModelRole::Router, "1GiB"),
    ]
}

impl Default for TriageConfig {
    fn default() -> Self {
        Self {
            server: ServerSettings::default(),
            models: default_models(),
            pipeline: PipelineSettings::default(),
            routing: RoutingConfig::default(),
            deprecated: Vec::new(),
        }
    }
}

/// The file as written, old spellings included.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawConfig {
    host: Option<String>,
    port: Option<u16>,
    api_key: Option<String>,
    /// A file holding the API key (not visible in `ps` or the config).
    api_key_file: Option<PathBuf>,
    allowed_hosts: Vec<String>,
    max_body_bytes: Option<usize>,
    max_pending_requests: Option<usize>,
    shutdown_timeout_s: Option<u64>,
    header_timeout_s: Option<u64>,
    body_timeout_s: Option<u64>,
    max_connections: Option<usize>,
    models: Option<toml::Value>,
    pipeline: Option<PipelineSettings>,
    routing: RoutingConfig,
    /// Deprecated: `[pipeline] corpora`.
    corpora: Option<Vec<String>>,
    /// Deprecated: `[pipeline] prefix_dir`.
    prefix_dir: Option<PathBuf>,
}

/// The library's earlier `[models]` table: a model name per role, one budget and device for all.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RoleTable {
    router: Option<String>,
    base: Option<String>,
    long_context: Option<String>,
    embedder: Option<String>,
    kv_budget: Option<String>,
    device: DeviceSpec,
    kv_dtype: Option<String>,
}

impl RoleTable {
    /// The entries it means: roles naming the base model share its entry.
    fn entries(&self) -> Vec<ModelEntry> {
        let kv_budget = self.kv_budget.as_deref().unwrap_or("1GiB");
        let base = self.base.as_deref().unwrap_or(DEFAULT_BASE_MODEL);
        let roles = [
            (ModelRole::Base, base),
            (
                ModelRole::LongContext,
                self.long_context
                    .as_deref()
                    .unwrap_or(DEFAULT_LONG_CONTEXT_MODEL),
            ),
            (
                ModelRole::Router,
                self.router.as_deref().unwrap_or(DEFAULT_ROUTER_MODEL),
            ),
        ];
        let mut entries: Vec<ModelEntry> = Vec::new();
        for (role, name) in roles {
            if entries.iter().any(|e| e.name == name) {
                continue;
            }
            entries.push(ModelEntry {
                device: self.device,
                kv_dtype: self.kv_dtype.clone(),
                ..ModelEntry::named(name, role, kv_budget)
            });
        }
        entries
    }
}

/// The API key in `path`: its first line, trimmed (an empty one is an error).
pub fn read_api_key(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| config_error(format!("reading the API key file {}: {e}", path.display())))?;
    let key = text.lines().next().unwrap_or("").trim();
    if key.is_empty() {
        return Err(config_error(format!(
            "the API key file {} is empty",
            path.display()
        )));
    }
    Ok(key.to_string())
}

fn config_error(e: impl std::fmt::Display) -> HostError {
    HostError::Config(e.to_string())
}

/// The `models` value: `[[models]]` entries, or the old `[models]` table (its embedder goes to
/// `pipeline`; each old spelling is noted in `deprecated`).
fn models_from(
    value: toml::Value,
    pipeline: &mut PipelineSettings,
    deprecated: &mut Vec<String>,
) -> Result<Vec<ModelEntry>> {
    match value {
        value @ toml::Value::Array(_) => value
            .try_into::<Vec<ModelEntry>>()
            .map_err(|e| config_error(format!("[[models]]: {e}"))),
        value @ toml::Value::Table(_) => {
            let table: RoleTable = value
                .try_into()
                .map_err(|e| config_error(format!("[models]: {e}")))?;
            deprecated.push(
                "a [models] table of role = name: write one [[models]] entry per model, \
                 with name and role (\"base\", \"long-context\", \"router\")"
                    .to_string(),
            );
            if let Some(embedder) = &table.embedder {
                deprecated.push("[models] embedder: write [pipeline] embedder".to_string());
                pipeline.embedder = embedder.clone();
            }
            Ok(table.entries())
        }
        other => Err(config_error(format!(
            "models must be [[models]] entries, not {}",
            other.type_str()
        ))),
    }
}

impl RawConfig {
    fn into_config(self) -> Result<TriageConfig> {
        let defaults = ServerSettings::default();
        let mut deprecated = Vec::new();
        let mut pipeline = self.pipeline.unwrap_or_default();
        let models = match self.models {
            None => default_models(),
            Some(value) => models_from(value, &mut pipeline, &mut deprecated)?,
        };
        if let Some(corpora) = self.corpora {
            deprecated.push("top-level corpora: write [pipeline] corpora".to_string());
            pipeline.corpora.extend(corpora);
        }
        if let Some(dir) = self.prefix_dir {
            deprecated.push("top-level prefix_dir: write [pipeline] prefix_dir".to_string());
            pipeline.prefix_dir = Some(dir);
        }
        let api_key = match (self.api_key, &self.api_key_file) {
            (Some(_), Some(_)) => {
                return Err(config_error("give api_key or api_key_file, not both"))
            }
            (key, None) => key,
            (None, Some(path)) => Some(read_api_key(path)?),
        };
        Ok(TriageConfig {
            server: ServerSettings {
                host: self.host.unwrap_or(defaults.host),
                port: self.port.unwrap_or(defaults.port),
                api_key,
                allowed_hosts: self.allowed_hosts,
                max_body_bytes: self.max_body_bytes.unwrap_or(defaults.max_body_bytes),
                max_pending_requests: self
                    .max_pending_requests
                    .unwrap_or(defaults.max_pending_requests),
                shutdown_timeout_s: self
                    .shutdown_timeout_s
                    .unwrap_or(defaults.shutdown_timeout_s),
                header_timeout_s: self.header_timeout_s.unwrap_or(defaults.header_timeout_s),
                body_timeout_s: self.body_timeout_s.unwrap_or(defaults.body_timeout_s),
                max_connections: self.max_connections.unwrap_or(defaults.max_connections),
            },
            models,
            pipeline,
            routing: self.routing,
            deprecated,
        })
    }
}

impl TriageConfig {
    /// Parse a TOML config; unknown keys are errors (a typo should not be silently ignored).
    /// Old spellings are accepted, listed in `deprecated` and logged as warnings.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let raw: RawConfig = toml::from_str(text).map_err(config_error)?;
        let config = raw.into_config()?;
        for old in &config.deprecated {
            tracing::warn!("deprecated config spelling, {old}");
        }
        config.check()?;
        Ok(config)
    }

    /// Read and parse a TOML config file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| HostError::Config(format!("reading {}: {e}", path.display())))?;
        Self::from_toml_str(&text).map_err(|e| match e {
            HostError::Config(m) => HostError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// The file at `path` (or the defaults) with the command line's model overrides.
    pub fn load_with(
        path: Option<&Path>,
        base: Option<&str>,
        long_context: Option<&str>,
        device: Option<DeviceSpec>,
    ) -> Result<Self> {
        let mut config = match path {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        if let Some(base) = base {
            config.set_model(ModelRole::Base, base)?;
        }
        if let Some(lc) = long_context {
            config.set_model(ModelRole::LongContext, lc)?;
        }
        if let Some(device) = device {
            config.set_device(device);
        }
        config.check()?;
        Ok(config)
    }

    /// The entry that plays `role`: the first with that role, else (for the long-context and
    /// router roles) the base model's.
    pub fn model(&self, role: ModelRole) -> Option<&ModelEntry> {
        let first = |r: ModelRole| self.models.iter().find(|m| m.role == r);
        first(role).or_else(|| first(ModelRole::Base))
    }

    /// Let `name_or_path` play `role`, replacing the entry that played it. A model that already
    /// has an entry keeps it (one engine): as the base model it plays every role no other entry
    /// plays. An entry plays one role, so a model that already plays another role than the base
    /// cannot take this one too: an error, where falling back to the base model would run
    /// another model than the one named.
    pub fn set_model(&mut self, role: ModelRole, name_or_path: &str) -> Result<()> {
        if let Some(existing) = self.models.iter().find(|m| m.spec() == name_or_path) {
            let other = existing.role;
            if role != ModelRole::Base && other != ModelRole::Base && other != role {
                return Err(config_error(format!(
                    "{name_or_path:?} already plays the {} role and an entry plays one role: \
                     name another model for the {} role",
                    other.as_str(),
                    role.as_str()
                )));
            }
        }
        let template = self.model(role).cloned();
        let first = self.models.iter().position(|m| m.role == role);
        if let Some(i) = first {
            self.models.remove(i);
        }
        if let Some(existing) = self.models.iter_mut().find(|m| m.spec() == name_or_path) {
            if role == ModelRole::Base {
                existing.role = ModelRole::Base;
            }
            return Ok(());
        }
        let mut entry = template.unwrap_or_else(|| ModelEntry::named("", role, "1GiB"));
        entry.name = name_or_path.to_string();
        entry.path = None;
        entry.role = role;
        let at = first.unwrap_or(self.models.len()).min(self.models.len());
        self.models.insert(at, entry);
        Ok(())
    }

    /// Give every model the KV-cache budget `budget`.
    pub fn set_kv_budget(&mut self, budget: &str) {
        self.models
            .iter_mut()
            .for_each(|m| m.kv_budget = budget.to_string());
    }

    /// Run every model on `device`.
    pub fn set_device(&mut self, device: DeviceSpec) {
        self.models.iter_mut().for_each(|m| m.device = device);
    }

    /// Run every model's decode eagerly (`--no-cuda-graphs`), whatever its entry says.
    pub fn disable_cuda_graphs(&mut self) {
        self.models.iter_mut().for_each(|m| m.cuda_graphs = false);
    }

    /// Whether the routing settings classify with the router model.
    pub fn needs_router(&self) -> bool {
        needs_router(&self.routing)
    }

    /// The entries to load: all but a router that no zero-shot classifier needs.
    pub fn models_to_load(&self) -> impl Iterator<Item = &ModelEntry> {
        let router = self.needs_router();
        self.models
            .iter()
            .filter(move |m| router || m.role != ModelRole::Router)
    }

    /// Check everything: [`TriageConfig::check`] and the routing settings (which building a
    /// pipeline also checks).
    pub fn validate(&self) -> Result<()> {
        self.check()?;
        self.routing
            .validate()
            .map_err(|e| config_error(format!("[routing]: {e}")))
    }

    /// Check what serde cannot, short of the routing settings: at least one model, unique
    /// names, sane limits.
    pub fn check(&self) -> Result<()> {
        if self.models.is_empty() {
            return Err(config_error("no models configured"));
        }
        for (i, m) in self.models.iter().enumerate() {
            if self.models[..i].iter().any(|o| o.name == m.name) {
                return Err(config_error(format!("model {:?} listed twice", m.name)));
            }
            m.engine_config()?;
        }
        let s = &self.server;
        if s.max_body_bytes == 0
            || s.max_pending_requests == 0
            || s.max_connections == 0
            || s.header_timeout_s == 0
            || s.body_timeout_s == 0
        {
            return Err(config_error(
                "max_body_bytes, max_pending_requests, max_connections, header_timeout_s and \
                 body_timeout_s must be positive",
            ));
        }
        if let Some(url) = &self.pipeline.prefix_store {
            ObjectPrefixStore::open(url)?;
        }
        if matches!(&s.api_key, Some(k) if k.is_empty()) {
            return Err(config_error("api_key must not be empty"));
        }
        if self.pipeline.enabled && self.models.iter().any(|m| m.name == self.pipeline.alias) {
            return Err(config_error(format!(
                "the pipeline alias {:?} is also a model name",
                self.pipeline.alias
            )));
        }
        Ok(())
    }
}

/// Whether `routing` classifies with the router model.
pub fn needs_router(routing: &RoutingConfig) -> bool {
    matches!(
        routing.classifier,
        ClassifierSetting::ZeroShot | ClassifierSetting::ZeroShotThreshold(_)
    )
}

#[cfg(test)]
mod tests;
