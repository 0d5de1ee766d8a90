//! Rewrites a GGUF file so that every matrix has a fast CPU path in candle: Q4_1/Q5_0/Q5_1 become Q8_0.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use crate::gguf_info::{
    count_types, format_type_counts, read_content, tensor_num_bytes, validate_tensors,
};
use crate::{ModelError, Result};

/// Metadata key added to a rewritten file; its value says what the file was made from.
pub const REQUANTIZED_FROM_KEY: &str = "triage.requantized_from";

/// The type slow tensors are rewritten to: candle has AVX2/NEON/simd128 `vec_dot` for it, and at
/// 8.5 bits per weight it adds less error than the 4/5-bit source already has.
pub const TARGET_DTYPE: GgmlDType = GgmlDType::Q8_0;

/// Whether candle 0.11.1 multiplies this type on the CPU with the scalar fallback only.
///
/// In `candle-core/src/quantized/k_quants.rs`, `vec_dot` dispatches to `avx::`/`neon::` for
/// Q4_0, Q8_0, Q2_K..Q6_K and Q8_K, but Q4_1, Q5_0, Q5_1 and Q8_1 always call `vec_dot_unopt`.
/// (Q4_0 has a fast path, so it is kept.) F32/F16/BF16 go through the dense matmul.
pub fn is_slow_on_cpu(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_1
    )
}

/// What [`requantize_gguf`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequantReport {
    /// Tensor count per type in the source, most common first.
    pub types_before: Vec<(GgmlDType, usize)>,
    /// Tensor count per type in the output, most common first.
    pub types_after: Vec<(GgmlDType, usize)>,
    /// Tensors rewritten to [`TARGET_DTYPE`].
    pub num_requantized: usize,
    /// Slow tensors kept as they were because their row length is not a multiple of Q8_0's block
    /// of 32. (Q4_1/Q5_0/Q5_1 rows are themselves made of 32-element blocks, so in a valid file
    /// this stays 0; it exists for files that break that rule.)
    pub num_kept_slow: usize,
    pub src_bytes: u64,
    pub dst_bytes: u64,
}

impl std::fmt::Display for RequantReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {}; {} tensors re-quantized to {}, {} bytes -> {} bytes",
            format_type_counts(&self.types_before),
            format_type_counts(&self.types_after),
            self.num_requantized,
            crate::gguf_info::dtype_name(TARGET_DTYPE),
            self.src_bytes,
            self.dst_bytes
        )?;
        if self.num_kept_slow > 0 {
            write!(
                f,
                " ({} slow tensors kept: row length not a multiple of 32)",
                self.num_kept_slow
            )?;
        }
        Ok(())
    }
}

/// [`requantize_gguf_noted`] with a note naming the source file and its size.
pub fn requantize_gguf(
    src: &Path,
    dst: &Path,
    progress: impl FnMut(u64, u64),
) -> Result<RequantReport> {
    let len = std::fs::metadata(src)
        .map_err(|source| ModelError::Io {
            path: src.to_path_buf(),
            source,
        })?
        .len();
    let file_name = src
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let note = format!("{file_name} ({len} bytes)");
    requantize_gguf_noted(src, dst, &note, progress)
}

/// Reads the GGUF `src` and writes `dst` with the same metadata and tensors in the same order
/// (by data offset), except that tensors with [`is_slow_on_cpu`] types are dequantized and
/// quantized again as Q8_0. Other tensors are copied bit for bit.
///
/// The output also gets `triage.requantized_from = note` (e.g. `"sha256:<hex>"`). Metadata keys
/// are written sorted (candle's reader keeps them in a `HashMap`, so the original order is
/// unknown; sorting makes the output reproducible). The output is GGUF v2 aligned to 32 bytes, as
/// candle's writer makes it; a `general.alignment` key is rewritten to 32 to match.
///
/// `progress(done, total)` is called in bytes of source tensor data. Memory: the whole output is
/// held in memory until written (candle's `gguf_file::write` takes every tensor at once), plus one
/// tensor as f32 while it is converted. `dst` is created or truncated; write to a temporary name
/// and rename if readers may be watching.
pub fn requantize_gguf_noted(
    src: &Path,
    dst: &Path,
    note: &str,
    mut progress: impl FnMut(u64, u64),
) -> Result<RequantReport> {
    let (content, file_size) = read_content(src)?;
    validate_tensors(&content, file_size, src)?;
    let mut infos: Vec<_> = content.tensor_infos.iter().collect();
    infos.sort_by(|a, b| a.1.offset.cmp(&b.1.offset).then_with(|| a.0.cmp(b.0)));
    // validate_tensors has checked every tensor's size.
    let src_bytes: u64 = infos
        .iter()
        .map(|(_, i)| tensor_num_bytes(i).unwrap_or(0))
        .sum();

    let mut reader = BufReader::new(File::open(src).map_err(io_err(src))?);
    let mut tensors: Vec<(&str, QTensor)> = Vec::with_capacity(infos.len());
    let (mut done, mut num_requantized, mut num_kept_slow) = (0u64, 0usize, 0usize);
    progress(0, src_bytes);
    for (name, info) in &infos {
        let qt = info.read(&mut reader, content.tensor_data_offset, &Device::Cpu)?;
        let qt = if !is_slow_on_cpu(qt.dtype()) {
            qt
        } else if !row_len(&qt).is_multiple_of(TARGET_DTYPE.block_size()) {
            num_kept_slow += 1;
            qt
        } else {
            num_requantized += 1;
            QTensor::quantize(&qt.dequantize(&Device::Cpu)?, TARGET_DTYPE)?
        };
        tensors.push((name.as_str(), qt));
        done += tensor_num_bytes(info).unwrap_or(0);
        progress(done, src_bytes);
    }

    let metadata = output_metadata(&content.metadata, note);
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let file = File::create(dst).map_err(io_err(dst))?;
    let mut w = BufWriter::new(file);
    gguf_file::write(&mut w, &meta_refs, &tensor_refs)?;
    let file = w.into_inner().map_err(|e| ModelError::Io {
        path: dst.to_path_buf(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_err(dst))?;
    let dst_bytes = file.metadata().map_err(io_err(dst))?.len();

    Ok(RequantReport {
        types_before: count_types(infos.iter().map(|(_, i)| i.ggml_dtype)),
        types_after: count_types(tensors.iter().map(|(_, t)| t.dtype())),
        num_requantized,
        num_kept_slow,
        src_bytes,
        dst_bytes,
    })
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Length of a tensor's rows: GGUF blocks run along the last candle dimension.
fn row_len(t: &QTensor) -> usize {
    t.shape().dims().last().copied().unwrap_or(1)
}

/// Source metadata sorted by key, alignment pinned to what candle's writer produces, plus the note.
fn output_metadata(
    src: &std::collections::HashMap<String, Value>,
    note: &str,
) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = src
        .iter()
        .filter(|(k, _)| k.as_str() != REQUANTIZED_FROM_KEY)
        .map(|(k, v)| {
            let v = if k == "general.alignment" {
                Value::U32(gguf_file::DEFAULT_ALIGNMENT as u32)
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect();
    out.push((
        REQUANTIZED_FROM_KEY.to_string(),
        Value::String(note.to_string()),
    ));
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::Content;
    use candle_core::Tensor;

    struct Fixture {
        _dir: tempfile::TempDir,
        src: std::path::PathBuf,
        dst: std::path::PathBuf,
        /// (name, f32 values the source tensor dequantizes to)
        originals: Vec<(&'static str, Tensor)>,
    }

    /// Source tensors: Q4_1, Q5_0, Q5_1 matrices (slow), a Q4_K matrix and an F32 vector (kept).
    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("src.gguf");
        let dst = dir.path().join("dst.gguf");
        let dev = Device::Cpu;
        let specs: [(&str, GgmlDType, &[usize]); 5] = [
            ("blk.0.attn_q.weight", GgmlDType::Q4_1, &[8, 64]),
            ("blk.0.ffn_up.weight", GgmlDType::Q5_0, &[16, 96]),
            ("blk.0.ffn_down.weight", GgmlDType::Q5_1, &[4, 32]),
            ("token_embd.weight", GgmlDType::Q4K, &[2, 256]),
            ("output_norm.weight", GgmlDType::F32, &[5]),
        ];
        let mut qts = Vec::new();
        for (name, dtype, shape) in specs {
            let t = Tensor::randn(0f32, 1.0, shape, &dev).expect("randn");
            qts.push((name, QTensor::quantize(&t, dtype).expect("quantize")));
        }
        let arch = Value::String("qwen2".into());
        let ctx = Value::U32(4096);
        let tokens = Value::Array(vec![Value::String("a".into()), Value::String("b".into())]);
        let meta = [
            ("general.architecture", &arch),
            ("qwen2.context_length", &ctx),
            ("tokenizer.ggml.tokens", &tokens),
        ];
        let refs: Vec<(&str, &QTensor)> = qts.iter().map(|(n, t)| (*n, t)).collect();
        let mut f = File::create(&src).expect("create");
        gguf_file::write(&mut f, &meta, &refs).expect("write");
        let originals = qts
            .iter()
            .map(|(n, t)| (*n, t.dequantize(&dev).expect("dequantize")))
            .collect();
        Fixture {
            _dir: dir,
            src,
            dst,
            originals,
        }
    }

    fn open(path: &Path) -> (Content, BufReader<File>) {
        let mut r = BufReader::new(File::open(path).expect("open"));
        (Content::read(&mut r).expect("parse"), r)
    }

    #[test]
    fn slow_types_become_q8_0_and_values_agree() {
        let fx = fixture();
        let mut calls = Vec::new();
        let report =
            requantize_gguf_noted(&fx.src, &fx.dst, "sha256:abc", |d, t| calls.push((d, t)))
                .expect("requantize");
        assert_eq!(report.num_requantized, 3);
        assert_eq!(report.num_kept_slow, 0);
        assert_eq!(
            format_type_counts(&report.types_after),
            "Q8_0 (3), F32 (1), Q4_K (1)"
        );
        let total = report.src_bytes;
        assert_eq!(calls.first(), Some(&(0, total)));
        assert_eq!(calls.last(), Some(&(total, total)));

        let (content, mut r) = open(&fx.dst);
        for (name, original) in &fx.originals {
            let qt = content.tensor(&mut r, name, &Device::Cpu).expect("tensor");
            let expected_dtype = match *name {
                "token_embd.weight" => GgmlDType::Q4K,
                "output_norm.weight" => GgmlDType::F32,
                _ => GgmlDType::Q8_0,
            };
            assert_eq!(qt.dtype(), expected_dtype, "{name}");
            assert_eq!(qt.shape(), original.shape(), "{name}");
            let got = qt.dequantize(&Device::Cpu).expect("dequantize");
            // Q8_0 stores q = round(x / d) with d = amax / 127 of the 32-block, and d itself as
            // f16 (relative error <= 2^-11): |q * f16(d) - x| <= d / 2 + 127 * d * 2^-11
            // < 0.56 * amax / 127. The tensor's amax bounds every block's. Copied tensors must
            // match exactly.
            let amax: f32 = original
                .abs()
                .expect("abs")
                .max_all()
                .expect("max")
                .to_scalar()
                .expect("scalar");
            let max_err: f32 = (got - original)
                .expect("sub")
                .abs()
                .expect("abs")
                .max_all()
                .expect("max")
                .to_scalar()
                .expect("scalar");
            let tol = if expected_dtype == GgmlDType::Q8_0 {
                0.56 * amax / 127.0
            } else {
                0.0
            };
            assert!(max_err <= tol, "{name}: max error {max_err} > {tol}");
        }
    }

    #[test]
    fn metadata_is_preserved_and_noted() {
        let fx = fixture();
        requantize_gguf_noted(&fx.src, &fx.dst, "sha256:abc", |_, _| {}).expect("requantize");
        let (src, _) = open(&fx.src);
        let (dst, _) = open(&fx.dst);
        assert_eq!(dst.metadata.len(), src.metadata.len() + 1);
        for (k, v) in &src.metadata {
            assert_eq!(
                format!("{:?}", dst.metadata.get(k)),
                format!("{:?}", Some(v)),
                "{k}"
            );
        }
        assert_eq!(
            dst.metadata
                .get(REQUANTIZED_FROM_KEY)
                .and_then(|v| v.to_string().ok())
                .map(String::as_str),
            Some("sha256:abc")
        );
        // Tensor order follows the source's data offsets.
        let order = |c: &Content| {
            let mut v: Vec<_> = c
                .tensor_infos
                .iter()
                .map(|(n, i)| (i.offset, n.clone()))
                .collect();
            v.sort();
            v.into_iter().map(|(_, n)| n).collect::<Vec<_>>()
        };
        assert_eq!(order(&src), order(&dst));
    }

    #[test]
    fn output_is_reproducible_and_rerun_is_a_copy() {
        let fx = fixture();
        requantize_gguf_noted(&fx.src, &fx.dst, "n", |_, _| {}).expect("requantize");
        let first = std::fs::read(&fx.dst).expect("read");
        let again = fx.dst.with_extension("again.gguf");
        requantize_gguf_noted(&fx.src, &again, "n", |_, _| {}).expect("requantize");
        assert_eq!(
            first,
            std::fs::read(&again).expect("read"),
            "HashMap order must not leak into the file"
        );
        // Requantizing the output again changes nothing but is still a valid copy.
        let third = fx.dst.with_extension("third.gguf");
        let report = requantize_gguf_noted(&fx.dst, &third, "n", |_, _| {}).expect("requantize");
        assert_eq!(report.num_requantized, 0);
        assert_eq!(first, std::fs::read(&third).expect("read"));
    }

    #[test]
    fn truncated_source_is_an_error() {
        let fx = fixture();
        let bytes = std::fs::read(&fx.src).expect("read");
        std::fs::write(&fx.src, &bytes[..bytes.len() - 100]).expect("write");
        let err = requantize_gguf(&fx.src, &fx.dst, |_, _| {}).expect_err("truncated");
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn slow_type_table_matches_candle() {
        for t in [GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1] {
            assert!(is_slow_on_cpu(t));
        }
        for t in [
            GgmlDType::Q4_0,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
            GgmlDType::F16,
            GgmlDType::F32,
        ] {
            assert!(!is_slow_on_cpu(t));
        }
    }
}
