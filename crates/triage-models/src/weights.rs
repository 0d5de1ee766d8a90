//! Where a model's tensors come from: a GGUF file (quantized) or a HF safetensors folder (dense).
//! Tensors are asked for by their GGUF names; safetensors names are mapped from those.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::{ModelError, Result};

/// One weight as stored: quantized blocks or a dense tensor.
#[derive(Debug, Clone)]
pub enum Weight {
    Quantized(Arc<QTensor>),
    Dense(Tensor),
}

impl Weight {
    /// The weight as a dense f32 tensor on `device`.
    pub fn to_dense_f32(&self, device: &Device) -> Result<Tensor> {
        self.to_dense(device, DType::F32)
    }

    /// The weight as a dense `dtype` tensor on `device`. A dense weight (held on the host) is
    /// converted before it is uploaded, so a GPU never holds an f32 copy of a bf16 matrix; GGUF
    /// tensors are already on `device` and are dequantized there.
    pub fn to_dense(&self, device: &Device, dtype: DType) -> Result<Tensor> {
        Ok(match self {
            Weight::Quantized(q) => q.dequantize(device)?.to_dtype(dtype)?,
            Weight::Dense(t) => t.to_dtype(dtype)?.to_device(device)?,
        })
    }

    /// The weight's shape.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Weight::Quantized(q) => q.shape().dims().to_vec(),
            Weight::Dense(t) => t.dims().to_vec(),
        }
    }
}

/// A reader of named tensors.
pub enum WeightSource {
    Gguf {
        path: PathBuf,
        content: gguf_file::Content,
        reader: BufReader<File>,
    },
    Safetensors {
        dir: PathBuf,
        tensors: HashMap<String, Tensor>,
    },
}

impl std::fmt::Debug for WeightSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightSource::Gguf { path, .. } => write!(f, "WeightSource::Gguf({})", path.display()),
            WeightSource::Safetensors { dir, .. } => {
                write!(f, "WeightSource::Safetensors({})", dir.display())
            }
        }
    }
}

fn invalid(path: &Path, message: impl std::fmt::Display) -> ModelError {
    ModelError::InvalidModel {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

impl WeightSource {
    /// Open a GGUF file and read its header through the hardened parser (`gguf_info`): a
    /// malformed header (an alignment of 0, lengths past the end) or a tensor whose shape
    /// overflows or whose data runs past the end of the file is an error, never a panic.
    pub fn open_gguf(path: &Path) -> Result<Self> {
        let (content, file_size) = crate::gguf_info::read_content(path)?;
        crate::gguf_info::validate_tensors(&content, file_size, path)?;
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(WeightSource::Gguf {
            path: path.to_path_buf(),
            content,
            reader: BufReader::new(file),
        })
    }

    /// Load every `*.safetensors` file of a HF model folder (read into memory, no mmap).
    pub fn open_safetensors_dir(dir: &Path) -> Result<Self> {
        let entries = std::fs::read_dir(dir).map_err(|source| ModelError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(invalid(dir, "no *.safetensors file in the folder"));
        }
        let mut tensors = HashMap::new();
        for file in files {
            let bytes = std::fs::read(&file).map_err(|source| ModelError::Io {
                path: file.clone(),
                source,
            })?;
            let loaded = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
                .map_err(|e| invalid(&file, e))?;
            tensors.extend(loaded);
        }
        Ok(WeightSource::Safetensors {
            dir: dir.to_path_buf(),
            tensors,
        })
    }

    /// GGUF metadata (empty for safetensors).
    pub fn gguf_metadata(&self) -> Option<&HashMap<String, gguf_file::Value>> {
        match self {
            WeightSource::Gguf { content, .. } => Some(&content.metadata),
            WeightSource::Safetensors { .. } => None,
        }
    }

    /// Whether a tensor with this GGUF name exists.
    pub fn contains(&self, gguf_name: &str) -> bool {
        match self {
            WeightSource::Gguf { content, .. } => content.tensor_infos.contains_key(gguf_name),
            WeightSource::Safetensors { tensors, .. } => {
                hf_name(gguf_name).is_some_and(|n| tensors.contains_key(&n))
            }
        }
    }

    /// Shape of a tensor, without reading its data.
    pub fn dims(&self, gguf_name: &str) -> Option<Vec<usize>> {
        match self {
            WeightSource::Gguf { content, .. } => content
                .tensor_infos
                .get(gguf_name)
                .map(|i| i.shape.dims().to_vec()),
            WeightSource::Safetensors { tensors, .. } => {
                tensors.get(&hf_name(gguf_name)?).map(|t| t.dims().to_vec())
            }
        }
    }

    /// Read one tensor by its GGUF name: GGUF blocks straight onto `device`, safetensors
    /// tensors as stored, on the host.
    pub fn get(&mut self, gguf_name: &str, device: &Device) -> Result<Weight> {
        match self {
            WeightSource::Gguf {
                path,
                content,
                reader,
            } => {
                let q = content
                    .tensor(reader, gguf_name, device)
                    .map_err(|e| invalid(path, format!("tensor {gguf_name}: {e}")))?;
                Ok(Weight::Quantized(Arc::new(q)))
            }
            WeightSource::Safetensors { dir, tensors } => {
                let name = hf_name(gguf_name)
                    .ok_or_else(|| invalid(dir, format!("no HF name for tensor {gguf_name}")))?;
                let t = tensors
                    .get(&name)
                    .ok_or_else(|| invalid(dir, format!("missing tensor {name}")))?;
                // Stays on the host in its stored dtype: the layer converts it to its own dtype
                // first and then uploads it (`Weight::to_dense`).
                Ok(Weight::Dense(t.clone()))
            }
        }
    }
}

/// Map a GGUF tensor name to the HF transformers name (Llama-family decoders, Qwen2 included).
pub fn hf_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (idx, tail) = rest.split_once('.')?;
    let (part, kind) = tail.split_once('.')?;
    let hf_part = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{idx}.{hf_part}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_gguf_names_to_hf_names() {
        assert_eq!(
            hf_name("blk.3.attn_q.bias").as_deref(),
            Some("model.layers.3.self_attn.q_proj.bias")
        );
        assert_eq!(
            hf_name("blk.11.ffn_down.weight").as_deref(),
            Some("model.layers.11.mlp.down_proj.weight")
        );
        assert_eq!(
            hf_name("token_embd.weight").as_deref(),
            Some("model.embed_tokens.weight")
        );
        assert_eq!(hf_name("blk.1.unknown.weight"), None);
    }

    /// Loading goes through the hardened header parser: candle's own reader divides by
    /// `general.alignment` unchecked and panics on 0.
    #[test]
    fn a_zero_alignment_is_an_error_not_a_panic() {
        use candle_core::quantized::{GgmlDType, QTensor};
        use candle_core::Tensor;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        let t = QTensor::quantize(
            &Tensor::ones(32, candle_core::DType::F32, &Device::Cpu).expect("ones"),
            GgmlDType::Q8_0,
        )
        .expect("quantize");
        let zero = gguf_file::Value::U32(0);
        let mut f = File::create(&path).expect("create");
        gguf_file::write(&mut f, &[("general.alignment", &zero)], &[("t", &t)]).expect("write");
        let err = WeightSource::open_gguf(&path).expect_err("alignment 0 must be refused");
        assert!(err.to_string().contains("parser panicked"), "{err}");
    }
}
