//! `ServerConfig`: what `triage serve` listens on and which models it loads, from a TOML file
//! with command-line overrides. Models are named here; the binary resolves names to files.

use std::path::Path;

use serde::Deserialize;
use triage_engine::llm_engine::{EngineConfig, KvBudget};
use triage_models::device::{parse_kv_dtype, DeviceSpec};

use crate::{Result, ServerError};

/// One model to serve.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The id clients put in `"model"`; also a default model's name when `path` is absent.
    pub name: String,
    /// A GGUF file, a safetensors folder, or a hub id (see `triage models`); default: `name`.
    #[serde(default)]
    pub path: Option<String>,
    /// What the routing pipeline uses it for: `base`, `long-context`, `router`, ...
    #[serde(default = "default_role")]
    pub role: String,
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
    /// KV-cache dtype: `"bf16"`, `"f16"` or `"f32"`; default bf16 on a GPU, f32 on the CPU.
    #[serde(default)]
    pub kv_dtype: Option<String>,
}

fn default_role() -> String {
    "base".into()
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
    pub fn named(name: &str, role: &str, kv_budget: &str) -> Self {
        Self {
            name: name.into(),
            path: None,
            role: role.into(),
            kv_budget: kv_budget.into(),
            block_size: default_block_size(),
            max_num_seqs: default_max_num_seqs(),
            max_num_batched_tokens: default_max_num_batched_tokens(),
            device: DeviceSpec::Cpu,
            kv_dtype: None,
        }
    }

    /// The engine settings this entry asks for.
    pub fn engine_config(&self) -> Result<EngineConfig> {
        let kv_budget: KvBudget = self
            .kv_budget
            .parse()
            .map_err(|e| ServerError::Config(format!("model {:?}: {e}", self.name)))?;
        if self.block_size == 0 || self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 {
            return Err(ServerError::Config(format!(
                "model {:?}: block_size, max_num_seqs and max_num_batched_tokens must be positive",
                self.name
            )));
        }
        let kv_dtype = match &self.kv_dtype {
            Some(name) => Some(
                parse_kv_dtype(name)
                    .map_err(|e| ServerError::Config(format!("model {:?}: {e}", self.name)))?,
            ),
            None => None,
        };
        Ok(EngineConfig {
            kv_budget,
            block_size: self.block_size,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            prefix_caching: true,
            kv_dtype,
        })
    }
}

/// Everything `triage serve` needs before it binds.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_host")]
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// When set, every `/v1/*` request needs `Authorization: Bearer <api_key>`.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Largest request body accepted (413 above).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Requests a model may hold, queued or running, before new ones get 429.
    #[serde(default = "default_max_pending_requests")]
    pub max_pending_requests: usize,
    /// After SIGTERM/Ctrl-C, how long in-flight requests may take before the server exits.
    #[serde(default = "default_shutdown_timeout_s")]
    pub shutdown_timeout_s: u64,
    #[serde(default = "default_models")]
    pub models: Vec<ModelEntry>,
    /// The routing pipeline as a model (`[pipeline]`).
    #[serde(default)]
    pub pipeline: PipelineSection,
    /// Its stages' settings (`[routing]`, the same table as `triage::Engine`'s config).
    #[serde(default)]
    pub routing: triage_router::RoutingConfig,
}

/// How the server offers the routing pipeline.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineSection {
    /// Offer it (it also needs a model with role `base`).
    pub enabled: bool,
    /// The `model` name that selects it in chat completions.
    pub alias: String,
    /// The sentence embedder of its corpora (a default model's name or a folder).
    pub embedder: String,
    /// Corpora loaded (and their long-context prefixes pinned) at start; others load on first
    /// use.
    pub corpora: Vec<String>,
    /// Where pinned corpus prefixes are persisted; default `$TRIAGE_HOME/prefixes`.
    pub prefix_dir: Option<std::path::PathBuf>,
}

impl Default for PipelineSection {
    fn default() -> Self {
        Self {
            enabled: true,
            alias: "triage".into(),
            embedder: "minilm-l6".into(),
            corpora: Vec::new(),
            prefix_dir: None,
        }
    }
}

fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    8080
}
fn default_max_body_bytes() -> usize {
    16 * 1024 * 1024
}
fn default_max_pending_requests() -> usize {
    256
}
fn default_shutdown_timeout_s() -> u64 {
    30
}

/// The fetched default models: the 0.5B answers, the 1.5B takes long contexts.
fn default_models() -> Vec<ModelEntry> {
    vec![
        ModelEntry::named("qwen2.5-coder-0.5b", "base", "1GiB"),
        ModelEntry::named("qwen2.5-coder-1.5b", "long-context", "2GiB"),
    ]
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: default_host(),
            port: default_port(),
            api_key: None,
            max_body_bytes: default_max_body_bytes(),
            max_pending_requests: default_max_pending_requests(),
            shutdown_timeout_s: default_shutdown_timeout_s(),
            models: default_models(),
            pipeline: PipelineSection::default(),
            routing: triage_router::RoutingConfig::default(),
        }
    }
}

impl ServerConfig {
    /// Parse a TOML config; unknown keys are errors (a typo should not be silently ignored).
    pub fn from_toml(text: &str) -> Result<Self> {
        let config: Self = toml::from_str(text).map_err(|e| ServerError::Config(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Read and parse a TOML config file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServerError::Config(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| ServerError::Config(format!("{}: {e}", path.display())))
    }

    /// Check what serde cannot: at least one model, unique names, sane limits.
    pub fn validate(&self) -> Result<()> {
        if self.models.is_empty() {
            return Err(ServerError::Config("no models configured".into()));
        }
        for (i, m) in self.models.iter().enumerate() {
            if self.models[..i].iter().any(|o| o.name == m.name) {
                return Err(ServerError::Config(format!(
                    "model {:?} listed twice",
                    m.name
                )));
            }
            m.engine_config()?;
        }
        if self.max_body_bytes == 0 || self.max_pending_requests == 0 {
            return Err(ServerError::Config(
                "max_body_bytes and max_pending_requests must be positive".into(),
            ));
        }
        if matches!(&self.api_key, Some(k) if k.is_empty()) {
            return Err(ServerError::Config("api_key must not be empty".into()));
        }
        if self.pipeline.enabled {
            if self.models.iter().any(|m| m.name == self.pipeline.alias) {
                return Err(ServerError::Config(format!(
                    "the pipeline alias {:?} is also a model name",
                    self.pipeline.alias
                )));
            }
            self.routing
                .validate()
                .map_err(|e| ServerError::Config(format!("[routing]: {e}")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_overrides_defaults_per_model() {
        let config = ServerConfig::from_toml(
            r#"
            port = 9000
            api_key = "secret"
            [[models]]
            name = "small"
            path = "/models/small.gguf"
            kv_budget = "256MiB"
            [[models]]
            name = "big"
            role = "long-context"
            kv_budget = "0.25"
            max_num_seqs = 8
            "#,
        )
        .unwrap();
        assert_eq!(config.port, 9000);
        assert_eq!(config.host, "127.0.0.1", "loopback unless told otherwise");
        assert_eq!(config.models.len(), 2);
        assert_eq!(config.models[0].role, "base");
        assert_eq!(
            config.models[1].engine_config().unwrap().kv_budget,
            KvBudget::Fraction(0.25)
        );
        assert_eq!(config.models[1].engine_config().unwrap().max_num_seqs, 8);
    }

    #[test]
    fn mistakes_in_the_file_are_errors() {
        for bad in [
            "prot = 1",
            "[[models]]\nname = \"a\"\nkv_budget = \"lots\"",
            "[[models]]\nname = \"a\"\n[[models]]\nname = \"a\"",
            "models = []",
            "api_key = \"\"",
            "port = -1",
        ] {
            assert!(ServerConfig::from_toml(bad).is_err(), "{bad:?} accepted");
        }
        let defaults = ServerConfig::from_toml("").unwrap();
        assert_eq!(defaults, ServerConfig::default());
    }

    #[test]
    fn the_readme_example_parses() {
        let readme = include_str!("../../../README.md");
        let start = readme
            .find("```toml\n")
            .expect("a toml block in the README")
            + 8;
        let end = start + readme[start..].find("```").expect("closed block");
        let config = ServerConfig::from_toml(&readme[start..end]).unwrap();
        assert_eq!(config.api_key.as_deref(), Some("sk-local"));
        assert_eq!(config.models.len(), 2);
        assert_eq!(config.models[0].device, DeviceSpec::Cpu);
        let engine = config.models[0].engine_config().unwrap();
        assert_eq!(engine.kv_dtype, Some(candle_core::DType::F32));
        // The second entry leaves both to the device's defaults.
        assert_eq!(config.models[1].kv_dtype, None);
        let gpu = ServerConfig::from_toml(
            "[[models]]\nname = \"m\"\ndevice = \"cuda:2\"\nkv_dtype = \"bf16\"\n",
        )
        .unwrap();
        assert_eq!(gpu.models[0].device, DeviceSpec::Cuda(2));
        let bad = ServerConfig::from_toml("[[models]]\nname = \"m\"\nkv_dtype = \"int4\"\n");
        assert!(bad.unwrap_err().to_string().contains("int4"));
    }
}
