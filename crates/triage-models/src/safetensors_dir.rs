//! A HF safetensors folder: its index (`model.safetensors.index.json`), the shards it names and
//! each tensor's place in them, read tensor by tensor through a map of just that tensor's bytes.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::{ModelError, Result};

/// The index file HF writes beside a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The single file of an unsharded checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The safetensors format's own bound on a header (its `MAX_HEADER_SIZE`).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One shard: its name in the folder and an open handle.
#[derive(Debug)]
struct Shard {
    name: String,
    path: PathBuf,
    file: File,
}

/// Where one tensor lies: its shard, its stored dtype and shape, its bytes in the shard file.
#[derive(Debug, Clone)]
struct TensorEntry {
    shard: usize,
    dtype: String,
    shape: Vec<usize>,
    bytes: Range<u64>,
}

/// An opened safetensors folder: every shard's header read and checked, no tensor data read.
#[derive(Debug)]
pub struct SafetensorsDir {
    dir: PathBuf,
    shards: Vec<Shard>,
    tensors: HashMap<String, TensorEntry>,
    /// Whether the shards came from the index (errors then say so).
    indexed: bool,
}

fn invalid(path: &Path, message: impl std::fmt::Display) -> ModelError {
    ModelError::InvalidModel {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl SafetensorsDir {
    /// Open the checkpoint in `dir`: the shards `model.safetensors.index.json` names when there is
    /// one (only those: a stray `consolidated.safetensors` beside them is not read), else
    /// `model.safetensors`, else the folder's only `*.safetensors` file. A shard the index names
    /// that is missing, a tensor the index places in a shard that does not hold it, and a tensor
    /// two shards both hold are errors that name them.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let (names, weight_map) = if index_path.exists() {
            let map = read_index(&index_path)?;
            let names: BTreeSet<String> = map.values().cloned().collect();
            (names.into_iter().collect(), Some(map))
        } else {
            (vec![single_file(dir)?], None)
        };
        let mut source = SafetensorsDir {
            dir: dir.to_path_buf(),
            shards: Vec::with_capacity(names.len()),
            tensors: HashMap::new(),
            indexed: weight_map.is_some(),
        };
        for name in names {
            source.add_shard(name)?;
        }
        if let Some(map) = weight_map {
            source.check_index(&map, &index_path)?;
        }
        Ok(source)
    }

    fn add_shard(&mut self, name: String) -> Result<()> {
        let path = self.dir.join(&name);
        let mut file = File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound if self.indexed => invalid(
                &self.dir,
                format!("{INDEX_FILE} names shard {name}, which is missing"),
            ),
            _ => io(&path)(e),
        })?;
        let idx = self.shards.len();
        for (tensor, (dtype, shape, bytes)) in read_header(&mut file, &path)? {
            let entry = TensorEntry {
                shard: idx,
                dtype,
                shape,
                bytes,
            };
            if let Some(earlier) = self.tensors.insert(tensor.clone(), entry) {
                let first = &self.shards[earlier.shard].name;
                return Err(invalid(
                    &self.dir,
                    format!("tensor {tensor} is in two shards, {first} and {name}"),
                ));
            }
        }
        self.shards.push(Shard { name, path, file });
        Ok(())
    }

    /// Every tensor the index lists is in the shard it names.
    fn check_index(&self, map: &HashMap<String, String>, index_path: &Path) -> Result<()> {
        let mut listed: Vec<(&String, &String)> = map.iter().collect();
        listed.sort();
        for (tensor, shard) in listed {
            let held_by = self.tensors.get(tensor).map(|e| &self.shards[e.shard].name);
            if held_by != Some(shard) {
                let found = match held_by {
                    Some(other) => format!("it is in {other}"),
                    None => "no shard holds it".to_string(),
                };
                return Err(invalid(
                    index_path,
                    format!("the index places tensor {tensor} in {shard}, but {found}"),
                ));
            }
        }
        Ok(())
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A tensor's stored shape, without reading it.
    pub fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|e| e.shape.clone())
    }

    /// `name (in <shard>)`, for errors about a tensor.
    pub fn describe(&self, name: &str) -> String {
        match self.tensors.get(name) {
            Some(e) => format!("{name} (in {})", self.shards[e.shard].name),
            None => name.to_string(),
        }
    }

    /// The tensor `name` on the host in its stored dtype. Only its own bytes are mapped, and the
    /// map is gone when this returns: loading never holds a shard's pages beyond one tensor.
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let entry = self.tensors.get(name).ok_or_else(|| {
            let place = match self.indexed {
                true => format!("listed in no shard of {INDEX_FILE}"),
                false => format!("not in {}", self.shards[0].name),
            };
            invalid(&self.dir, format!("missing tensor {name}: {place}"))
        })?;
        let shard = &self.shards[entry.shard];
        let in_shard = |m: String| invalid(&shard.path, format!("tensor {name}: {m}"));
        let dtype = parse_dtype(&entry.dtype).map_err(in_shard)?;
        let len = (entry.bytes.end - entry.bytes.start) as usize;
        if len == 0 {
            return Ok(Tensor::zeros(entry.shape.as_slice(), dtype, &Device::Cpu)?);
        }
        let start = entry.bytes.start as usize;
        // mmap offsets are whole pages: 64 KiB is a multiple of Linux's (4, 16 or 64 KiB).
        let map_start = start - start % (64 << 10);
        // SAFETY: the map lives until the end of this function, while `from_raw_buffer` copies
        // the bytes out; model files are not rewritten in place meanwhile (`triage models fetch`
        // and the hub cache write under a temporary name and rename). A user's file rewritten
        // during that copy would read torn (or raise SIGBUS if truncated): the assumption
        // llama.cpp and candle make when they map weights.
        #[allow(unsafe_code)]
        let map = unsafe {
            crate::weights::map_read_only(&shard.file, map_start, start + len - map_start)
        }
        .map_err(io(&shard.path))?;
        let bytes = &map[start - map_start..];
        Ok(Tensor::from_raw_buffer(
            bytes,
            dtype,
            &entry.shape,
            &Device::Cpu,
        )?)
    }
}

/// The index's `weight_map`: tensor name → shard file name (a plain name in the folder).
fn read_index(path: &Path) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| invalid(path, e))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| invalid(path, "no \"weight_map\" object"))?;
    let mut out = HashMap::with_capacity(map.len());
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .filter(|s| is_plain_file_name(s))
            .ok_or_else(|| {
                invalid(
                    path,
                    format!("tensor {tensor}: shard {shard} is not a file name in the folder"),
                )
            })?;
        out.insert(tensor.clone(), shard.to_string());
    }
    if out.is_empty() {
        return Err(invalid(path, "the weight_map lists no tensor"));
    }
    Ok(out)
}

/// A name that stays inside the folder: no separator, not `.` or `..`.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\'])
}

/// Without an index: `model.safetensors`, else the only `*.safetensors` file that is not
/// Mistral's `consolidated` copy.
fn single_file(dir: &Path) -> Result<String> {
    if dir.join(SINGLE_FILE).exists() {
        return Ok(SINGLE_FILE.to_string());
    }
    let entries = std::fs::read_dir(dir).map_err(io(dir))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors") && !n.starts_with("consolidated"))
        .collect();
    names.sort();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(invalid(
            dir,
            format!("no {SINGLE_FILE} and no {INDEX_FILE} in the folder"),
        )),
        several => Err(invalid(
            dir,
            format!(
                "{} safetensors files ({}) and no {INDEX_FILE} to say which hold the model",
                several.len(),
                several.join(", ")
            ),
        )),
    }
}

type HeaderEntry = (String, (String, Vec<usize>, Range<u64>));

/// A shard's header: each tensor's dtype, shape and byte range in the file, checked to lie
/// inside the file and to hold exactly its shape's elements.
fn read_header(file: &mut File, path: &Path) -> Result<Vec<HeaderEntry>> {
    let file_len = file.metadata().map_err(io(path))?.len();
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(|_| invalid(path, "shorter than a safetensors header"))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
        return Err(invalid(
            path,
            format!("header of {header_len} bytes in a file of {file_len}"),
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io(path))?;
    let json: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| invalid(path, format!("header is not JSON: {e}")))?;
    let table = json
        .as_object()
        .ok_or_else(|| invalid(path, "header is not a JSON object"))?;
    let data_start = 8 + header_len;
    let mut out = Vec::with_capacity(table.len());
    for (name, info) in table.iter().filter(|(n, _)| *n != "__metadata__") {
        let entry = header_entry(info, data_start, file_len)
            .map_err(|m| invalid(path, format!("tensor {name}: {m}")))?;
        out.push((name.clone(), entry));
    }
    Ok(out)
}

fn header_entry(
    info: &serde_json::Value,
    data_start: u64,
    file_len: u64,
) -> std::result::Result<(String, Vec<usize>, Range<u64>), String> {
    let dtype = info
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or("no dtype")?
        .to_string();
    let shape: Vec<usize> = info
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or("no shape")?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<_>>()
        .ok_or("a dimension is not a non-negative integer")?;
    let offsets: Vec<u64> = info
        .get("data_offsets")
        .and_then(|o| o.as_array())
        .map(|o| o.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default();
    let &[begin, end] = offsets.as_slice() else {
        return Err("data_offsets is not two integers".into());
    };
    let (start, stop) = (data_start.checked_add(begin), data_start.checked_add(end));
    let (Some(start), Some(stop)) = (start, stop) else {
        return Err("data_offsets overflow".into());
    };
    if begin > end || stop > file_len {
        return Err(format!(
            "bytes {begin}..{end} of the data lie outside the file ({file_len} bytes)"
        ));
    }
    let element_bytes = dtype_bytes(&dtype).ok_or_else(|| format!("unknown dtype {dtype}"))?;
    let want = shape
        .iter()
        .try_fold(element_bytes, |acc, &d| acc.checked_mul(d as u64))
        .ok_or("shape overflows")?;
    if want != end - begin {
        return Err(format!(
            "shape {shape:?} of {dtype} is {want} bytes, the offsets span {}",
            end - begin
        ));
    }
    Ok((dtype, shape, start..stop))
}

/// Bytes per element of a safetensors dtype.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// The candle dtype of a safetensors dtype triage reads.
fn parse_dtype(dtype: &str) -> std::result::Result<DType, String> {
    Ok(match dtype {
        "BF16" => DType::BF16,
        "F16" => DType::F16,
        "F32" => DType::F32,
        "F64" => DType::F64,
        "U8" => DType::U8,
        "U32" => DType::U32,
        "I64" => DType::I64,
        other => {
            return Err(format!(
                "dtype {other} is not supported (bf16, f16, f32, f64)"
            ))
        }
    })
}
