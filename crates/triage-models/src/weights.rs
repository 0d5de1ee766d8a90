//! Where a model's tensors come from: a GGUF file (quantized) or a HF safetensors folder (dense,
//! `safetensors_dir`).
//! Tensors are asked for by their GGUF names; safetensors names are mapped from those.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{ggml_file, gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use triage_ops::{GgmlBlockType, KQuantMatrix, KQuantType, Q8Matrix};

use crate::{ModelError, Result};

/// One weight as stored: quantized blocks, a dense tensor, or a matrix already packed for
/// triage's CPU kernels.
#[derive(Debug, Clone)]
pub enum Weight {
    Quantized(Arc<QTensor>),
    Dense(Tensor),
    Packed(PackedMatrix),
}

/// A matrix in the layout of triage's batch-invariant CPU kernels (`q8_matmul`,
/// `kquant_matmul`), built from a GGUF tensor's blocks.
#[derive(Debug, Clone)]
pub enum PackedMatrix {
    Q8(Arc<Q8Matrix>),
    KQuant(Arc<KQuantMatrix>),
}

impl PackedMatrix {
    /// Packs GGML blocks of a `[rows, cols]` matrix, or `None` for a type without a triage
    /// kernel (those run through candle).
    pub fn from_ggml(
        dtype: GgmlDType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Option<Self>> {
        let kquant = |ty| -> Result<PackedMatrix> {
            let m = KQuantMatrix::from_ggml_bytes(ty, rows, cols, bytes)?;
            Ok(PackedMatrix::KQuant(Arc::new(m)))
        };
        let q8 = |ty| -> Result<PackedMatrix> {
            let m = Q8Matrix::from_ggml_blocks(ty, rows, cols, bytes)?;
            Ok(PackedMatrix::Q8(Arc::new(m)))
        };
        Ok(Some(match dtype {
            GgmlDType::Q8_0 => q8(GgmlBlockType::Q8_0)?,
            // Held as int8 values of the same blocks, without loss (`GgmlBlockType`).
            GgmlDType::Q4_0 => q8(GgmlBlockType::Q4_0)?,
            GgmlDType::Q4_1 => q8(GgmlBlockType::Q4_1)?,
            GgmlDType::Q5_0 => q8(GgmlBlockType::Q5_0)?,
            GgmlDType::Q5_1 => q8(GgmlBlockType::Q5_1)?,
            GgmlDType::Q4K => kquant(KQuantType::Q4K)?,
            GgmlDType::Q6K => kquant(KQuantType::Q6K)?,
            _ => return Ok(None),
        }))
    }

    pub fn dims(&self) -> [usize; 2] {
        match self {
            PackedMatrix::Q8(m) => [m.rows(), m.cols()],
            PackedMatrix::KQuant(m) => [m.rows(), m.cols()],
        }
    }

    /// Rows `ids` (an embedding lookup) as `[ids.len(), cols]` f32 on the host, as GGML
    /// dequantizes their blocks.
    pub fn rows(&self, ids: &[u32]) -> Result<Tensor> {
        let [rows, cols] = self.dims();
        let mut values = vec![0f32; ids.len() * cols];
        for (&id, out) in ids.iter().zip(values.chunks_exact_mut(cols)) {
            let row = id as usize;
            if row >= rows {
                return Err(ModelError::Invalid(format!(
                    "token id {id} is past the {rows} rows of the embedding table"
                )));
            }
            match self {
                PackedMatrix::Q8(m) => m.dequantize_row(row, out),
                PackedMatrix::KQuant(m) => m.dequantize_row(row, out),
            }
        }
        Ok(Tensor::from_vec(values, (ids.len(), cols), &Device::Cpu)?)
    }

    /// The matrix as f32, as GGML dequantizes its blocks.
    pub fn dequantize(&self, device: &Device) -> Result<Tensor> {
        let values = match self {
            PackedMatrix::Q8(m) => m.dequantize(),
            PackedMatrix::KQuant(m) => m.dequantize(),
        };
        Ok(Tensor::from_vec(values, self.dims().to_vec(), device)?)
    }
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
            Weight::Packed(p) => p.dequantize(device)?.to_dtype(dtype)?,
        })
    }

    /// The weight's shape.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Weight::Quantized(q) => q.shape().dims().to_vec(),
            Weight::Dense(t) => t.dims().to_vec(),
            Weight::Packed(p) => p.dims().to_vec(),
        }
    }
}

/// A reader of named tensors.
pub enum WeightSource {
    Gguf {
        path: PathBuf,
        /// The header's tensor table (its metadata moved to `metadata`).
        content: gguf_file::Content,
        /// The header's metadata, shared so that the tokenizer can be built from it on another
        /// thread while the weights load.
        metadata: Arc<HashMap<String, gguf_file::Value>>,
        file: File,
        /// The part of the file the last read covered, mapped read-only: a tensor's bytes are
        /// read where the page cache holds them, with no copy into a buffer that would have to
        /// be faulted in first (on a VM, faulting in that buffer and copying into it were a fifth
        /// of a cold start). The next read unmaps it, so mapped pages never add more than one
        /// read to resident memory (a map of the whole file for the whole load raised the 1.5B's
        /// peak RSS to 2.32 GB; per read, 1.39–1.41 GB).
        window: Option<memmap2::Mmap>,
        /// Tensors asked for together whose bytes are not adjacent in the file, concatenated.
        buffer: Vec<u8>,
    },
    /// A HF folder, its shards mapped tensor by tensor.
    Safetensors(crate::safetensors_dir::SafetensorsDir),
}

impl std::fmt::Debug for WeightSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightSource::Gguf { path, .. } => write!(f, "WeightSource::Gguf({})", path.display()),
            WeightSource::Safetensors(st) => {
                write!(f, "WeightSource::Safetensors({})", st.dir().display())
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
        let (mut content, file_size) = crate::gguf_info::read_content(path)?;
        crate::gguf_info::validate_tensors(&content, file_size, path)?;
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let metadata = Arc::new(std::mem::take(&mut content.metadata));
        Ok(WeightSource::Gguf {
            path: path.to_path_buf(),
            content,
            metadata,
            file,
            window: None,
            buffer: Vec::new(),
        })
    }

    /// Open a HF model folder: its index and shard headers, no tensor data
    /// (`SafetensorsDir::open`).
    pub fn open_safetensors_dir(dir: &Path) -> Result<Self> {
        Ok(WeightSource::Safetensors(
            crate::safetensors_dir::SafetensorsDir::open(dir)?,
        ))
    }

    /// GGUF metadata (empty for safetensors).
    pub fn gguf_metadata(&self) -> Option<&HashMap<String, gguf_file::Value>> {
        match self {
            WeightSource::Gguf { metadata, .. } => Some(metadata),
            WeightSource::Safetensors(_) => None,
        }
    }

    /// GGUF metadata to hand to another thread (`None` for safetensors).
    pub fn shared_gguf_metadata(&self) -> Option<Arc<HashMap<String, gguf_file::Value>>> {
        match self {
            WeightSource::Gguf { metadata, .. } => Some(Arc::clone(metadata)),
            WeightSource::Safetensors(_) => None,
        }
    }

    /// Whether a tensor with this GGUF name exists.
    pub fn contains(&self, gguf_name: &str) -> bool {
        match self {
            WeightSource::Gguf { content, .. } => content.tensor_infos.contains_key(gguf_name),
            WeightSource::Safetensors(st) => hf_name(gguf_name).is_some_and(|n| st.contains(&n)),
        }
    }

    /// Shape of a tensor, without reading its data.
    pub fn dims(&self, gguf_name: &str) -> Option<Vec<usize>> {
        match self {
            WeightSource::Gguf { content, .. } => content
                .tensor_infos
                .get(gguf_name)
                .map(|i| i.shape.dims().to_vec()),
            WeightSource::Safetensors(st) => st.dims(&hf_name(gguf_name)?),
        }
    }

    fn read(&mut self, gguf_name: &str, device: &Device) -> Result<Weight> {
        match self {
            WeightSource::Gguf { .. } => {
                let path = self.path().to_path_buf();
                let (dtype, dims, bytes) = self.gguf_bytes(gguf_name)?;
                let q = ggml_file::qtensor_from_ggml(dtype, bytes, dims, device)
                    .map_err(|e| invalid(&path, format!("tensor {gguf_name}: {e}")))?;
                Ok(Weight::Quantized(Arc::new(q)))
            }
            WeightSource::Safetensors(st) => {
                let name = hf_name(gguf_name).ok_or_else(|| {
                    invalid(st.dir(), format!("no HF name for tensor {gguf_name}"))
                })?;
                // On the host in its stored dtype: the layer converts it to its own dtype first
                // and then uploads it (`Weight::to_dense`), so a bf16 weight reaches a GPU with
                // no f32 pass, and the host holds one tensor at a time.
                Ok(Weight::Dense(st.read(&name)?))
            }
        }
    }

    fn read_matrix(&mut self, gguf_name: &str, device: &Device) -> Result<Weight> {
        if !device.is_cpu() || !matches!(self, WeightSource::Gguf { .. }) {
            return self.get(gguf_name, device);
        }
        let path = self.path().to_path_buf();
        let (dtype, dims, bytes) = self.gguf_bytes(gguf_name)?;
        let &[rows, cols] = dims.as_slice() else {
            return self.get(gguf_name, device);
        };
        match PackedMatrix::from_ggml(dtype, rows, cols, bytes) {
            Ok(Some(packed)) => Ok(Weight::Packed(packed)),
            Ok(None) => self.get(gguf_name, device),
            Err(e) => Err(invalid(&path, format!("tensor {gguf_name}: {e}"))),
        }
    }

    fn read_stacked(
        &mut self,
        gguf_names: &[String],
        device: &Device,
    ) -> Result<Option<(PackedMatrix, Vec<usize>)>> {
        let (WeightSource::Gguf { content, .. }, true) = (&*self, device.is_cpu()) else {
            return Ok(None);
        };
        let shapes: Option<Vec<(GgmlDType, &[usize])>> = gguf_names
            .iter()
            .map(|n| content.tensor_infos.get(n))
            .map(|i| i.map(|i| (i.ggml_dtype, i.shape.dims())))
            .collect();
        // A missing part is `read_back_to_back`'s error below.
        let (dtype, cols) = match shapes.as_deref() {
            Some([(dtype, &[_, cols]), rest @ ..])
                if rest
                    .iter()
                    .all(|&(t, d)| t == *dtype && matches!(d, &[_, c] if c == cols)) =>
            {
                (*dtype, cols)
            }
            Some(_) => return Ok(None),
            None => (GgmlDType::F32, 0),
        };
        let path = self.path().to_path_buf();
        let (shapes, bytes) = self.read_back_to_back(gguf_names)?;
        let widths: Vec<usize> = shapes.iter().map(|(_, dims)| dims[0]).collect();
        let rows = widths.iter().sum();
        match PackedMatrix::from_ggml(dtype, rows, cols, bytes) {
            Ok(packed) => Ok(packed.map(|p| (p, widths))),
            Err(e) => Err(invalid(&path, format!("tensors {gguf_names:?}: {e}"))),
        }
    }

    /// Read one tensor by its GGUF name: GGUF blocks straight onto `device`, safetensors
    /// tensors as stored, on the host.
    pub fn get(&mut self, gguf_name: &str, device: &Device) -> Result<Weight> {
        let weight = self.read(gguf_name, device);
        self.release_large_buffer();
        weight
    }

    /// Read a weight matrix by its GGUF name, for a linear layer: on CPU, GGUF blocks that one
    /// of triage's kernels multiplies are packed for it straight from the file's bytes (no
    /// intermediate `QTensor`); anything else as `get` reads it.
    pub fn get_matrix(&mut self, gguf_name: &str, device: &Device) -> Result<Weight> {
        let weight = self.read_matrix(gguf_name, device);
        self.release_large_buffer();
        weight
    }

    /// Read several weight matrices that multiply one input (Q, K and V; gate and up) as one
    /// matrix, their rows one after the other, packed for triage's CPU kernel: GGML stores a
    /// matrix row by row, so the parts' bytes read back to back are the stacked matrix's, and it
    /// is packed once (no per-part copy to stack afterwards). Returns the matrix and each part's
    /// rows, or `None` where the parts cannot stack (not GGUF on CPU, mixed types or widths, a
    /// type without a triage kernel): then read them one by one.
    pub fn get_stacked(
        &mut self,
        gguf_names: &[String],
        device: &Device,
    ) -> Result<Option<(PackedMatrix, Vec<usize>)>> {
        let stacked = self.read_stacked(gguf_names, device);
        self.release_large_buffer();
        stacked
    }

    /// Frees the read buffer once it has held an embedding-sized tensor: kept, it would sit on
    /// top of the loaded model's peak resident memory (145 MB for the 0.5B's table). A layer's
    /// matrices (a few to 20 MB) keep reusing it.
    fn release_large_buffer(&mut self) {
        const LARGE: usize = 64 << 20;
        if let WeightSource::Gguf { buffer, .. } = self {
            if buffer.capacity() > LARGE {
                *buffer = Vec::new();
            }
        }
    }

    /// A GGUF tensor's type, shape (GGUF's order reversed, as candle reads it) and bytes.
    fn gguf_bytes(&mut self, gguf_name: &str) -> Result<(GgmlDType, Vec<usize>, &[u8])> {
        let (mut shapes, bytes) = self.read_back_to_back(std::slice::from_ref(&gguf_name))?;
        let (dtype, dims) = shapes
            .pop()
            .ok_or_else(|| ModelError::Invalid("no tensor".into()))?;
        Ok((dtype, dims, bytes))
    }

    /// GGUF tensors' types and shapes, and their bytes one after the other: the map's own where
    /// they are adjacent in the file (a single tensor always is), else copied into the buffer.
    #[allow(clippy::type_complexity)]
    fn read_back_to_back(
        &mut self,
        gguf_names: &[impl AsRef<str>],
    ) -> Result<(Vec<(GgmlDType, Vec<usize>)>, &[u8])> {
        let WeightSource::Gguf {
            path,
            content,
            file,
            window,
            buffer,
            ..
        } = self
        else {
            return Err(ModelError::Invalid("not a GGUF source".into()));
        };
        let mut parts = Vec::with_capacity(gguf_names.len());
        for name in gguf_names.iter().map(AsRef::as_ref) {
            let info = content
                .tensor_infos
                .get(name)
                .ok_or_else(|| invalid(path, format!("no tensor {name}")))?;
            // `open_gguf` checked that every tensor's size is representable and inside the file.
            let num_bytes = crate::gguf_info::tensor_num_bytes(info)
                .ok_or_else(|| invalid(path, format!("tensor {name}: impossible shape")))?;
            parts.push((info, num_bytes as usize));
        }
        let shapes = parts
            .iter()
            .map(|(i, _)| (i.ggml_dtype, i.shape.dims().to_vec()))
            .collect();
        // `open_gguf` checked that every tensor's bytes lie inside the file.
        let range = |(info, num_bytes): &(&gguf_file::TensorInfo, usize)| {
            let start = (content.tensor_data_offset + info.offset) as usize;
            start..start + num_bytes
        };
        let ranges: Vec<_> = parts.iter().map(range).collect();
        let start = ranges.iter().map(|r| r.start).min().unwrap_or(0);
        let end = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        // mmap offsets are whole pages: 64 KiB is a multiple of Linux's (4, 16 or 64 KiB).
        let map_start = start - start % (64 << 10);
        // Unmap the last read's pages before mapping the next.
        *window = None;
        // SAFETY: the window is unmapped at the next read or when this source is dropped, once
        // the model has loaded, and model files are not rewritten in place meanwhile: `triage
        // models fetch` writes under a temporary name and renames. A user's own file rewritten
        // during that second would read torn (or raise SIGBUS if truncated): the assumption
        // llama.cpp and candle make when they map weights.
        #[allow(unsafe_code)]
        let map = unsafe { map_read_only(file, map_start, end - map_start) }.map_err(|source| {
            ModelError::Io {
                path: path.clone(),
                source,
            }
        })?;
        let map = window.insert(map);
        let local = |r: &std::ops::Range<usize>| r.start - map_start..r.end - map_start;
        if ranges.windows(2).all(|w| w[0].end == w[1].start) {
            return Ok((shapes, &map[local(&(start..end))]));
        }
        buffer.clear();
        for r in &ranges {
            buffer.extend_from_slice(&map[local(r)]);
        }
        Ok((shapes, buffer.as_slice()))
    }

    fn path(&self) -> &Path {
        match self {
            WeightSource::Gguf { path, .. } => path,
            WeightSource::Safetensors(st) => st.dir(),
        }
    }

    /// A tensor named for an error: its file name and, for a sharded folder, its shard.
    pub fn describe(&self, gguf_name: &str) -> String {
        match self {
            WeightSource::Gguf { path, .. } => format!("{gguf_name} (in {})", path.display()),
            WeightSource::Safetensors(st) => match hf_name(gguf_name) {
                Some(name) => st.describe(&name),
                None => gguf_name.to_string(),
            },
        }
    }
}

/// `len` bytes of `file` from `offset` (a multiple of the page size), mapped read-only.
///
/// # Safety
/// Reading the map is undefined behaviour if the file is truncated or modified while it is
/// mapped; the caller must know that it will not be.
#[allow(unsafe_code)]
pub(crate) unsafe fn map_read_only(
    file: &File,
    offset: usize,
    len: usize,
) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: passed on to the caller (above).
    unsafe {
        memmap2::MmapOptions::new()
            .offset(offset as u64)
            .len(len)
            .map(file)
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
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
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

    /// A tiny Qwen2 GGUF whose matrices are `dtype`, opened as a weight source.
    /// Every GGUF matrix type triage's CPU kernels hold.
    const PACKED_TYPES: [GgmlDType; 7] = [
        GgmlDType::Q8_0,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ];

    fn tiny_source(dir: &Path, dtype: GgmlDType) -> WeightSource {
        use crate::config::Architecture;
        use crate::fixtures::{write_tiny_gguf, TinySpec};
        // K-quants need rows of 256 values.
        let spec = TinySpec {
            hidden_size: 256,
            intermediate_size: 512,
            ..TinySpec::new(Architecture::Qwen2)
        };
        let path = dir.join("m.gguf");
        write_tiny_gguf(&path, &spec, dtype).expect("write tiny gguf");
        WeightSource::open_gguf(&path).expect("open tiny gguf")
    }

    /// Tensors read together give each one's bytes in the order asked, whether they lie
    /// adjacent in the file (a slice of the map) or not (copied into the buffer).
    #[test]
    fn tensors_read_together_are_their_bytes_in_the_order_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut source = tiny_source(dir.path(), GgmlDType::Q8_0);
        let WeightSource::Gguf { content, .. } = &source else {
            panic!("not a GGUF source")
        };
        let mut by_offset: Vec<(u64, String)> = content
            .tensor_infos
            .iter()
            .map(|(name, info)| (info.offset, name.clone()))
            .collect();
        by_offset.sort();
        let alone = |source: &mut WeightSource, name: &str| -> Vec<u8> {
            source.gguf_bytes(name).expect("read").2.to_vec()
        };
        // Two neighbours in the file, in file order, then the other way round.
        let (a, b) = by_offset
            .windows(2)
            .find_map(|w| {
                let info = &content.tensor_infos[&w[0].1];
                let len = crate::gguf_info::tensor_num_bytes(info)?;
                (w[0].0 + len == w[1].0).then(|| (w[0].1.clone(), w[1].1.clone()))
            })
            .expect("the tiny model has two adjacent tensors");
        for names in [[&a, &b], [&b, &a]] {
            let want: Vec<u8> =
                [alone(&mut source, names[0]), alone(&mut source, names[1])].concat();
            let (_, got) = source.read_back_to_back(&names).expect("read");
            assert_eq!(got, want.as_slice(), "{names:?}");
        }
    }

    /// Reading Q, K and V back to back and packing once is stacking the packed parts: the
    /// fused product then gives each part's bits, as `FusedLinear::new` promises.
    #[test]
    fn parts_read_stacked_pack_to_the_parts_stacked() {
        for dtype in PACKED_TYPES {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut source = tiny_source(dir.path(), dtype);
            let names: Vec<String> = ["attn_q", "attn_k", "attn_v"]
                .iter()
                .map(|p| format!("blk.0.{p}.weight"))
                .collect();
            let (stacked, widths) = source
                .get_stacked(&names, &Device::Cpu)
                .expect("read")
                .expect("Q, K and V of one type stack");
            let parts: Vec<PackedMatrix> = names
                .iter()
                .map(
                    |n| match source.get_matrix(n, &Device::Cpu).expect("read") {
                        Weight::Packed(p) => p,
                        other => panic!("{dtype:?} not packed: {other:?}"),
                    },
                )
                .collect();
            assert_eq!(
                widths,
                parts.iter().map(|p| p.dims()[0]).collect::<Vec<_>>()
            );
            match (&stacked, &parts[..]) {
                (
                    PackedMatrix::Q8(s),
                    [PackedMatrix::Q8(q), PackedMatrix::Q8(k), PackedMatrix::Q8(v)],
                ) => {
                    assert_eq!(**s, Q8Matrix::stack_rows(&[q, k, v]).expect("stack"))
                }
                (
                    PackedMatrix::KQuant(s),
                    [PackedMatrix::KQuant(q), PackedMatrix::KQuant(k), PackedMatrix::KQuant(v)],
                ) => {
                    assert_eq!(**s, KQuantMatrix::stack_rows(&[q, k, v]).expect("stack"))
                }
                _ => panic!("{dtype:?}: mixed kinds"),
            }
        }
    }

    /// Parts of different types (a Q6_K `attn_v` beside Q4_K `attn_q`, as in the 1.5B's files)
    /// are not read stacked.
    #[test]
    fn parts_of_different_types_do_not_stack() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut source = tiny_source(dir.path(), GgmlDType::Q8_0);
        let names = [
            "blk.0.attn_q.weight".to_string(),
            "blk.0.attn_norm.weight".to_string(),
        ];
        assert!(source
            .get_stacked(&names, &Device::Cpu)
            .expect("read")
            .is_none());
        let missing = [
            "blk.0.attn_q.weight".to_string(),
            "blk.9.attn_q.weight".to_string(),
        ];
        assert!(source.get_stacked(&missing, &Device::Cpu).is_err());
    }

    /// An embedding table kept packed looks rows up as candle's dequantized table has them;
    /// an id past the table is an error.
    #[test]
    fn packed_embedding_rows_are_the_dequantized_table_rows() {
        for dtype in PACKED_TYPES {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut source = tiny_source(dir.path(), dtype);
            let Weight::Packed(packed) = source
                .get_matrix("token_embd.weight", &Device::Cpu)
                .expect("read")
            else {
                panic!("{dtype:?}: embedding not packed");
            };
            let Weight::Quantized(q) = source.get("token_embd.weight", &Device::Cpu).expect("read")
            else {
                panic!("{dtype:?}: not quantized");
            };
            let ids = [3u32, 0, 3, 17];
            let ours = packed
                .rows(&ids)
                .expect("rows")
                .to_vec2::<f32>()
                .expect("vec");
            let table = q.dequantize(&Device::Cpu).expect("dequantize");
            for (&id, row) in ids.iter().zip(&ours) {
                let theirs = table
                    .get(id as usize)
                    .expect("row")
                    .to_vec1::<f32>()
                    .expect("vec");
                assert_eq!(row, &theirs, "{dtype:?} row {id}");
            }
            let vocab = packed.dims()[0] as u32;
            assert!(packed.rows(&[vocab]).is_err());
        }
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
