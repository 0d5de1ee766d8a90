//! With the `cuda` feature, compiles every `kernels/*.cu` of the workspace to PTX for one compute
//! capability (`CUDA_COMPUTE_CAP`, default 90) into `OUT_DIR`, where `src/cuda.rs` embeds it.
//! Without the feature it does nothing, so CPU builds and CI need no nvcc. The flags are those of
//! `scripts/kernels-ptx`: warnings are errors, and IEEE math (no `--use_fast_math`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_CUDA");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let kernels = manifest_dir.join("../../kernels");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    for var in [
        "CUDA_COMPUTE_CAP",
        "CUDA_ROOT",
        "CUDA_PATH",
        "CUDA_HOME",
        "NVCC",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // Cargo scans a watched directory recursively: an edited, added or removed file reruns this.
    println!("cargo:rerun-if-changed={}", kernels.display());

    let cap = compute_cap();
    let nvcc = nvcc();
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .unwrap_or_else(|e| panic!("reading {}: {e}", kernels.display()))
        .map(|entry| entry.expect("kernels/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    for src in &sources {
        compile(&nvcc, cap, &kernels, src, &out_dir);
    }
}

/// `CUDA_COMPUTE_CAP` as nvcc's architecture number (`90`, also accepted as `9.0` or `sm_90`).
fn compute_cap() -> u32 {
    let Ok(raw) = std::env::var("CUDA_COMPUTE_CAP") else {
        return 90;
    };
    let digits: String = raw.chars().filter(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("CUDA_COMPUTE_CAP={raw:?} is not a compute capability like 90"))
}

/// `$NVCC`, else `nvcc` on `PATH`, else `bin/nvcc` under `CUDA_ROOT`, `CUDA_PATH` or `CUDA_HOME`.
fn nvcc() -> PathBuf {
    if let Some(path) = std::env::var_os("NVCC") {
        return path.into();
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("nvcc"));
    let in_roots = ["CUDA_ROOT", "CUDA_PATH", "CUDA_HOME"]
        .into_iter()
        .filter_map(std::env::var_os)
        .map(|root| Path::new(&root).join("bin/nvcc"));
    on_path
        .chain(in_roots)
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the cuda feature needs nvcc: put it on PATH or set CUDA_ROOT \
             (scripts/cuda-env installs one and writes target/cuda-env.sh)"
            )
        })
}

fn compile(nvcc: &Path, cap: u32, kernels: &Path, src: &Path, out_dir: &Path) {
    let stem = src.file_stem().expect("a .cu file name").to_string_lossy();
    let ptx = out_dir.join(format!("{stem}.ptx"));
    let output = Command::new(nvcc)
        .args(["--ptx", &format!("-arch=sm_{cap}"), "-std=c++17", "-O3"])
        .args(["-Werror", "all-warnings", "-I"])
        .arg(kernels)
        .arg("-o")
        .arg(&ptx)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
    if !output.status.success() {
        panic!(
            "nvcc failed on {}:\n{}{}",
            src.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
