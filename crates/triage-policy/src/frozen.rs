//! Freezing a fitted model to JSON with a content hash, so a hand-edited or truncated policy
//! file is refused on load.

use crate::error::{PolicyError, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A fitted model frozen to a file: the model, what it was fitted on, and the SHA-256 of the
/// model's JSON, checked on load so a hand-edited or truncated file is refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Frozen<T> {
    pub model: T,
    pub sha256: String,
}

fn content_hash<T: Serialize>(model: &T) -> Result<String> {
    let json = serde_json::to_vec(model).map_err(|e| PolicyError::Invalid(e.to_string()))?;
    Ok(format!("{:x}", Sha256::digest(&json)))
}

impl<T: Serialize + for<'de> Deserialize<'de>> Frozen<T> {
    pub fn new(model: T) -> Result<Self> {
        let sha256 = content_hash(&model)?;
        Ok(Self { model, sha256 })
    }

    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        let json =
            serde_json::to_string_pretty(self).map_err(|e| PolicyError::Invalid(e.to_string()))?;
        std::fs::write(path, json + "\n")
            .map_err(|e| PolicyError::Invalid(format!("writing {}: {e}", path.display())))
    }

    pub fn load(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::Invalid(format!("reading {}: {e}", path.display())))?;
        let frozen: Self = serde_json::from_str(&text)
            .map_err(|e| PolicyError::Invalid(format!("{}: {e}", path.display())))?;
        if content_hash(&frozen.model)? != frozen.sha256 {
            return Err(PolicyError::Invalid(format!(
                "{}: the model does not match its sha256 (edited or damaged)",
                path.display()
            )));
        }
        Ok(frozen)
    }
}

/// Freeze `model` to `path`; returns its SHA-256.
pub fn freeze<T: Serialize + Clone + for<'de> Deserialize<'de>>(
    model: &T,
    path: &std::path::Path,
) -> Result<String> {
    let frozen = Frozen::new(model.clone())?;
    frozen.save(path)?;
    Ok(frozen.sha256)
}

/// Read a model frozen with [`freeze`], refusing it if its hash does not match.
pub fn thaw<T: Serialize + for<'de> Deserialize<'de>>(path: &std::path::Path) -> Result<T> {
    Ok(Frozen::<T>::load(path)?.model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::RidgeModel;

    #[test]
    fn frozen_models_refuse_edits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        let rows = vec![vec![1.0], vec![2.0], vec![3.0]];
        let m = RidgeModel::fit(&rows, &[1.0, 2.0, 3.5], 20.0).unwrap();
        Frozen::new(m.clone()).unwrap().save(&path).unwrap();
        assert_eq!(Frozen::<RidgeModel>::load(&path).unwrap().model, m);
        let edited =
            std::fs::read_to_string(&path)
                .unwrap()
                .replacen("\"bias\": ", "\"bias\": 1", 1);
        std::fs::write(&path, edited).unwrap();
        let err = Frozen::<RidgeModel>::load(&path).unwrap_err().to_string();
        assert!(err.contains("sha256"), "{err}");
    }
}
