//! Summary of a GGUF file (architecture, parameter count, context length, tensor types) read from its header only.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::GgmlDType;

use crate::{ModelError, Result};

/// What `triage models info` shows about a GGUF file. Reading it touches only the header, not the
/// tensor data, so it takes milliseconds even for gigabyte files.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufInfo {
    pub path: PathBuf,
    /// `general.architecture`, if the file has it.
    pub architecture: Option<String>,
    /// `general.name`, if the file has it.
    pub model_name: Option<String>,
    /// Sum of the element counts of all tensors.
    pub num_params: u64,
    /// `<architecture>.context_length`, if present.
    pub context_length: Option<u64>,
    pub num_tensors: usize,
    /// Tensor count per type, most common first (ties by type name).
    pub tensor_types: Vec<(GgmlDType, usize)>,
    pub file_size: u64,
}

impl GgufInfo {
    /// Reads the header of `path`. A truncated or corrupt file is an [`ModelError::InvalidModel`],
    /// never a panic: the length fields candle reads are bounded by the file size, and every
    /// tensor's data must lie inside the file.
    pub fn read(path: &Path) -> Result<Self> {
        let (content, file_size) = read_content(path)?;
        validate_tensors(&content, file_size, path)?;
        let architecture = metadata_string(&content, "general.architecture");
        let context_length = architecture
            .as_ref()
            .and_then(|arch| content.metadata.get(&format!("{arch}.context_length")))
            .and_then(|v| v.to_u64().ok());
        let mut num_params = 0u64;
        for info in content.tensor_infos.values() {
            // validate_tensors has checked that the products fit; the sum of tensors that fit in
            // the file fits in a u64 too.
            num_params = num_params.saturating_add(elem_count_checked(info).unwrap_or(0));
        }
        Ok(Self {
            path: path.to_path_buf(),
            model_name: metadata_string(&content, "general.name"),
            architecture,
            num_params,
            context_length,
            num_tensors: content.tensor_infos.len(),
            tensor_types: count_types(content.tensor_infos.values().map(|i| i.ggml_dtype)),
            file_size,
        })
    }

    /// The most common tensor type, e.g. `Q8_0`.
    pub fn main_type(&self) -> Option<GgmlDType> {
        self.tensor_types.first().map(|(t, _)| *t)
    }

    /// Per-type tensor counts, most common first: `"Q8_0 (169), Q6_K (13), F32 (121)"`.
    pub fn quantization_summary(&self) -> String {
        format_type_counts(&self.tensor_types)
    }
}

impl std::fmt::Display for GgufInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "file:           {}", self.path.display())?;
        writeln!(
            f,
            "architecture:   {}",
            self.architecture.as_deref().unwrap_or("?")
        )?;
        if let Some(name) = &self.model_name {
            writeln!(f, "name:           {name}")?;
        }
        writeln!(
            f,
            "parameters:     {} ({:.2} B)",
            self.num_params,
            self.num_params as f64 / 1e9
        )?;
        match self.context_length {
            Some(n) => writeln!(f, "context length: {n}")?,
            None => writeln!(f, "context length: ?")?,
        }
        writeln!(f, "tensors:        {}", self.num_tensors)?;
        writeln!(f, "quantization:   {}", self.quantization_summary())?;
        write!(
            f,
            "file size:      {} bytes ({:.1} MiB)",
            self.file_size,
            self.file_size as f64 / 1048576.0
        )
    }
}

/// The llama.cpp spelling of a tensor type (`Q4_K`, not candle's `Q4K`).
pub fn dtype_name(dtype: GgmlDType) -> &'static str {
    match dtype {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

/// Counts per type, most common first, ties by name (deterministic output).
pub(crate) fn count_types(types: impl Iterator<Item = GgmlDType>) -> Vec<(GgmlDType, usize)> {
    let mut counts: HashMap<GgmlDType, usize> = HashMap::new();
    for t in types {
        *counts.entry(t).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| dtype_name(a.0).cmp(dtype_name(b.0)))
    });
    counts
}

/// `"Q8_0 (169), F32 (121)"`.
pub fn format_type_counts(counts: &[(GgmlDType, usize)]) -> String {
    let parts: Vec<String> = counts
        .iter()
        .map(|(t, n)| format!("{} ({n})", dtype_name(*t)))
        .collect();
    parts.join(", ")
}

/// Opens `path` and parses its GGUF header. Returns the content and the file size.
///
/// candle 0.11.1 bounds string, array and count fields by the file size, but still divides by
/// `general.alignment` unchecked (an alignment of 0 panics with a division by zero). That panic is
/// caught here and turned into an error; the default panic hook still prints one line to stderr.
pub(crate) fn read_content(path: &Path) -> Result<(Content, u64)> {
    let io_err = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let file_size = file.metadata().map_err(io_err)?.len();
    let mut reader = TrackedReader {
        inner: BufReader::with_capacity(1 << 20, file),
        position: 0,
    };
    let parsed =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Content::read(&mut reader)));
    let content = match parsed {
        Ok(Ok(content)) => content,
        Ok(Err(e)) => {
            return Err(invalid(
                path,
                format!("not a readable GGUF file ({file_size} bytes): {e}"),
            ))
        }
        Err(_) => {
            return Err(invalid(
                path,
                "corrupt GGUF header (the parser panicked)".to_string(),
            ))
        }
    };
    Ok((content, file_size))
}

/// A buffered reader that knows its position: candle's header parser asks for it around every
/// string, and `BufReader` answers with an `lseek` system call each time (a third of the
/// parse for a vocabulary of 150k tokens).
struct TrackedReader {
    inner: BufReader<File>,
    position: u64,
}

impl Read for TrackedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.position += n as u64;
        Ok(n)
    }
}

impl Seek for TrackedReader {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.position = self.inner.seek(pos)?;
        Ok(self.position)
    }

    fn stream_position(&mut self) -> std::io::Result<u64> {
        Ok(self.position)
    }
}

/// Checks that every tensor has a sane shape and that its data lies inside the file, so that
/// reading it later can neither overflow nor run past the end (a truncated download).
pub(crate) fn validate_tensors(content: &Content, file_size: u64, path: &Path) -> Result<()> {
    if content.tensor_data_offset > file_size {
        return Err(invalid(
            path,
            format!(
                "truncated: tensor data starts at byte {} but the file has {file_size} bytes",
                content.tensor_data_offset
            ),
        ));
    }
    for (name, info) in &content.tensor_infos {
        let Some(num_bytes) = tensor_num_bytes(info) else {
            return Err(invalid(
                path,
                format!(
                    "tensor {name:?} has an impossible shape {:?} for type {}",
                    info.shape.dims(),
                    dtype_name(info.ggml_dtype)
                ),
            ));
        };
        let end = content
            .tensor_data_offset
            .checked_add(info.offset)
            .and_then(|s| s.checked_add(num_bytes));
        match end {
            Some(end) if end <= file_size => {}
            _ => {
                return Err(invalid(
                    path,
                    format!(
                        "truncated or corrupt: tensor {name:?} ({num_bytes} bytes at data offset {}) ends past the end of the file ({file_size} bytes)",
                        info.offset
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Element count of a tensor, `None` on overflow.
pub(crate) fn elem_count_checked(info: &TensorInfo) -> Option<u64> {
    info.shape
        .dims()
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
}

/// Bytes of a tensor's data, `None` if the shape overflows or is not a whole number of blocks.
pub(crate) fn tensor_num_bytes(info: &TensorInfo) -> Option<u64> {
    let elems = elem_count_checked(info)?;
    let block = info.ggml_dtype.block_size() as u64;
    if !elems.is_multiple_of(block) {
        return None;
    }
    (elems / block).checked_mul(info.ggml_dtype.type_size() as u64)
}

fn metadata_string(content: &Content, key: &str) -> Option<String> {
    match content.metadata.get(key) {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    }
}

fn invalid(path: &Path, message: String) -> ModelError {
    ModelError::InvalidModel {
        path: path.to_path_buf(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{gguf_file, QTensor};
    use candle_core::{Device, Tensor};

    /// A small GGUF: one Q8_0 matrix, one Q4_0 matrix, one F32 vector, qwen2 metadata.
    fn write_small_gguf(path: &Path) {
        let dev = Device::Cpu;
        let a = Tensor::randn(0f32, 1.0, (4, 64), &dev).expect("randn");
        let b = Tensor::randn(0f32, 1.0, (2, 32), &dev).expect("randn");
        let c = Tensor::randn(0f32, 1.0, 7, &dev).expect("randn");
        let qa = QTensor::quantize(&a, GgmlDType::Q8_0).expect("quantize");
        let qb = QTensor::quantize(&b, GgmlDType::Q4_0).expect("quantize");
        let qc = QTensor::quantize(&c, GgmlDType::F32).expect("quantize");
        let arch = Value::String("qwen2".into());
        let ctx = Value::U32(32768);
        let name = Value::String("tiny".into());
        let mut f = File::create(path).expect("create");
        gguf_file::write(
            &mut f,
            &[
                ("general.architecture", &arch),
                ("general.name", &name),
                ("qwen2.context_length", &ctx),
            ],
            &[("a", &qa), ("b", &qb), ("c", &qc)],
        )
        .expect("write gguf");
    }

    #[test]
    fn reads_summary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        write_small_gguf(&path);
        let info = GgufInfo::read(&path).expect("read");
        assert_eq!(info.architecture.as_deref(), Some("qwen2"));
        assert_eq!(info.model_name.as_deref(), Some("tiny"));
        assert_eq!(info.context_length, Some(32768));
        assert_eq!(info.num_params, 4 * 64 + 2 * 32 + 7);
        assert_eq!(info.num_tensors, 3);
        assert_eq!(info.quantization_summary(), "F32 (1), Q4_0 (1), Q8_0 (1)");
        assert_eq!(
            info.file_size,
            std::fs::metadata(&path).expect("stat").len()
        );
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        write_small_gguf(&path);
        let bytes = std::fs::read(&path).expect("read");
        let (content, _) = read_content(&path).expect("parse");
        let data_end = content
            .tensor_infos
            .values()
            .map(|i| content.tensor_data_offset + i.offset + tensor_num_bytes(i).expect("sane"))
            .max()
            .expect("has tensors");
        // Only the alignment padding after the last tensor may be cut without loss.
        assert!(bytes.len() as u64 - data_end < 32);
        let cut = dir.path().join("cut.gguf");
        for len in 0..data_end as usize {
            std::fs::write(&cut, &bytes[..len]).expect("write");
            let err = GgufInfo::read(&cut).expect_err("a truncated file must not parse");
            assert!(
                matches!(err, ModelError::InvalidModel { .. }),
                "len {len}: {err}"
            );
        }
    }

    #[test]
    fn corrupt_length_fields_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        write_small_gguf(&path);
        let bytes = std::fs::read(&path).expect("read");
        let bad = dir.path().join("bad.gguf");
        // Overwrite each 8-byte window of the header with all-ones: huge counts, string lengths,
        // dimensions and offsets. Some windows (inside string bytes) still parse; none may panic.
        let header_len = 400.min(bytes.len() - 8);
        for pos in 0..header_len {
            let mut b = bytes.clone();
            b[pos..pos + 8].copy_from_slice(&[0xff; 8]);
            std::fs::write(&bad, &b).expect("write");
            let _ = GgufInfo::read(&bad);
        }
    }

    #[test]
    fn zero_alignment_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        let t = QTensor::quantize(
            &Tensor::zeros(32, candle_core::DType::F32, &Device::Cpu).expect("zeros"),
            GgmlDType::Q8_0,
        )
        .expect("quantize");
        let zero = Value::U32(0);
        let mut f = File::create(&path).expect("create");
        gguf_file::write(&mut f, &[("general.alignment", &zero)], &[("t", &t)]).expect("write");
        let err = GgufInfo::read(&path).expect_err("alignment 0 must be rejected");
        assert!(err.to_string().contains("parser panicked"), "{err}");
    }

    #[test]
    fn not_a_gguf_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.gguf");
        std::fs::write(&path, b"hello world, definitely not gguf").expect("write");
        assert!(matches!(
            GgufInfo::read(&path),
            Err(ModelError::InvalidModel { .. })
        ));
        assert!(matches!(
            GgufInfo::read(&dir.path().join("missing")),
            Err(ModelError::Io { .. })
        ));
    }
}
