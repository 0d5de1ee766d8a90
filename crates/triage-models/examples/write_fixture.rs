//! Writes a random-weight model folder (config.json, model.safetensors, tokenizer.json) with the
//! project's fixture writer, for the device check: triage and Hugging Face `transformers` then
//! load the same weights, of a real model's shape, without any real weights travelling.
//!
//!   write_fixture --shape tiny|qwen2.5-0.5b|qwen2.5-1.5b --dtype bf16|f32 --out DIR
//!                 [--arch qwen2|qwen3|llama]  (the tiny shape's architecture; default qwen2)
//!                 [--context-length N]   (the tiny shape's 512 holds no long-context corpus)
//!                 [--shards N]           (N files and an index, as transformers shards)

use candle_core::DType;
use triage_models::config::Architecture;
use triage_models::fixtures::{write_sharded_safetensors, TinySpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut shape, mut dtype, mut out) = ("tiny".to_string(), DType::BF16, None);
    let (mut context_length, mut shards, mut arch) = (None, 1, Architecture::Qwen2);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--shape" => shape = value()?,
            "--dtype" => {
                dtype = match value()?.as_str() {
                    "bf16" => DType::BF16,
                    "f32" => DType::F32,
                    other => return Err(format!("--dtype bf16|f32, got {other}").into()),
                }
            }
            "--out" => out = Some(std::path::PathBuf::from(value()?)),
            "--context-length" => context_length = Some(value()?.parse::<usize>()?),
            "--shards" => shards = value()?.parse::<usize>()?,
            "--arch" => arch = Architecture::parse(&value()?)?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let out = out.ok_or("--out DIR is required")?;
    let mut spec = match shape.as_str() {
        "tiny" => TinySpec::new(arch),
        name => TinySpec::real_shape(name).ok_or(format!("unknown shape {name}"))?,
    };
    if let Some(n) = context_length {
        spec.context_length = n;
    }
    let start = std::time::Instant::now();
    write_sharded_safetensors(&out, &spec, dtype, shards)?;
    eprintln!(
        "write_fixture: {shape} ({dtype:?}) in {} ({:.1} s)",
        out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
