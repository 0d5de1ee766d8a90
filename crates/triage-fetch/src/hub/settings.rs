//! Where the Hub is, where its cache is, and the token: from the same environment variables
//! Python's `huggingface_hub` reads, so both share one cache.

use std::fmt;
use std::path::PathBuf;

/// The Hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Retries of a broken transfer within one fetch, each resuming where the last stopped.
pub const DEFAULT_MAX_RETRIES: usize = 3;

/// How to reach the Hub and where its files go. The token never shows in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct HubSettings {
    /// The Hub's URL, without a trailing `/` (`HF_ENDPOINT`).
    pub endpoint: String,
    /// The hub cache folder that holds `models--org--repo/` (`HF_HUB_CACHE`, `HF_HOME`).
    pub cache_dir: PathBuf,
    /// Sent as `Authorization: Bearer …` (`HF_TOKEN`, else the token file).
    pub token: Option<String>,
    /// Never make a request: only what the cache holds resolves (`HF_HUB_OFFLINE`).
    pub offline: bool,
    /// See [`DEFAULT_MAX_RETRIES`].
    pub max_retries: usize,
}

impl HubSettings {
    /// Online, no token, against `endpoint`, with the cache in `cache_dir`.
    pub fn new(endpoint: impl Into<String>, cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            endpoint: endpoint.into().trim_end_matches('/').to_string(),
            cache_dir: cache_dir.into(),
            token: None,
            offline: false,
            max_retries: DEFAULT_MAX_RETRIES,
        }
    }

    /// From this process's environment.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From the variables `var` gives, as `huggingface_hub` reads them: `HF_ENDPOINT`;
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub` (`HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`,
    /// else `~/.cache/huggingface`); `HF_TOKEN`, else the file `HF_TOKEN_PATH` (default
    /// `$HF_HOME/token`); `HF_HUB_OFFLINE` set to `1`, `true`, `yes` or `on`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let home = || set("HOME").map(PathBuf::from).unwrap_or_default();
        let expand = |value: String| match value.strip_prefix("~/") {
            Some(rest) => home().join(rest),
            None => PathBuf::from(value),
        };
        let hf_home = set("HF_HOME").map(expand).unwrap_or_else(|| {
            set("XDG_CACHE_HOME")
                .map(expand)
                .unwrap_or_else(|| home().join(".cache"))
                .join("huggingface")
        });
        let cache_dir = set("HF_HUB_CACHE")
            .map(expand)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_path = set("HF_TOKEN_PATH")
            .map(expand)
            .unwrap_or_else(|| hf_home.join("token"));
        let token = set("HF_TOKEN")
            .or_else(|| std::fs::read_to_string(token_path).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let endpoint = set("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        Self {
            token,
            offline: set("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v)),
            ..Self::new(endpoint, cache_dir)
        }
    }
}

/// `huggingface_hub`'s truth values for flags.
fn is_true(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

impl fmt::Debug for HubSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubSettings")
            .field("endpoint", &self.endpoint)
            .field("cache_dir", &self.cache_dir)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("offline", &self.offline)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> HubSettings {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubSettings::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_follow_home() {
        let s = from(&[("HOME", "/home/u")]);
        assert_eq!(s.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(s.cache_dir, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert_eq!(s.token, None);
        assert!(!s.offline);
    }

    #[test]
    fn hub_cache_beats_hf_home_which_beats_xdg() {
        let base = [("HOME", "/h"), ("XDG_CACHE_HOME", "/xdg")];
        assert_eq!(from(&base).cache_dir, PathBuf::from("/xdg/huggingface/hub"));
        let with_home = [base[0], base[1], ("HF_HOME", "~/hf")];
        assert_eq!(from(&with_home).cache_dir, PathBuf::from("/h/hf/hub"));
        let with_cache = [base[0], base[1], ("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/c")];
        assert_eq!(from(&with_cache).cache_dir, PathBuf::from("/c"));
    }

    #[test]
    fn endpoint_offline_and_token_from_vars() {
        let s = from(&[
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_HUB_OFFLINE", "ON"),
            ("HF_TOKEN", " hf_secret \n"),
        ]);
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert!(s.offline);
        assert_eq!(s.token.as_deref(), Some("hf_secret"));
        assert!(!format!("{s:?}").contains("hf_secret"), "{s:?}");
        for off in ["0", "false", "no", ""] {
            assert!(!from(&[("HF_HUB_OFFLINE", off)]).offline, "{off:?}");
        }
    }

    #[test]
    fn the_token_file_is_read_when_hf_token_is_unset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "hf_from_file\n").unwrap();
        let home = dir.path().to_str().unwrap();
        assert_eq!(
            from(&[("HF_HOME", home)]).token.as_deref(),
            Some("hf_from_file")
        );
        let both = from(&[("HF_HOME", home), ("HF_TOKEN", "hf_env")]);
        assert_eq!(both.token.as_deref(), Some("hf_env"));
    }
}
