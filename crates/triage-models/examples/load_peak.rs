//! Loads a model (a safetensors folder or a GGUF file) on the CPU and prints the resident memory
//! the loaded model takes against the peak while it loaded: the loader's transient cost, which
//! `benches/RESULTS.md` records (issue 51). Linux only (reads `/proc/self/status`).
//!
//!   load_peak PATH [--bf16]
//!
//! `--bf16` loads in the GPU's layout (dense matrices kept bf16) on the CPU: the loaded model is
//! then what a GPU would hold, and the peak above it is what loading onto a GPU keeps on the host.

use triage_models::model::load_weights;
use triage_models::transformer::LoadOptions;

/// A `/proc/self/status` field in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .ok_or(format!("no {field} in /proc/self/status"))?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .ok_or(format!("malformed {line:?}"))?
        .parse()?;
    Ok(kib * 1024)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: load_peak PATH [--bf16]")?;
    let opts = match args.next().as_deref() {
        None => LoadOptions::default(),
        Some("--bf16") => LoadOptions {
            dense_dtype: candle_core::DType::BF16,
            ..LoadOptions::default()
        },
        Some(other) => return Err(format!("unknown argument {other}").into()),
    };
    let mb = |b: u64| b as f64 / 1e6;
    let before = status_bytes("VmRSS:")?;
    let start = std::time::Instant::now();
    let loaded = load_weights(std::path::Path::new(&path), &opts)?;
    let secs = start.elapsed().as_secs_f64();
    let (after, peak) = (status_bytes("VmRSS:")?, status_bytes("VmHWM:")?);
    println!(
        "{path}: {} layers in {secs:.1} s; loaded model {:.0} MB resident, peak while loading \
         {:.0} MB, {:.0} MB above the loaded model",
        loaded.transformer.config().num_layers,
        mb(after - before),
        mb(peak - before),
        mb(peak - after)
    );
    Ok(())
}
