//! Compiles the CUDA kernels of `kernels/` as C++ against the simulator header, with the
//! `extern "C"` launchers of `cpp/launchers.cpp`. `TRIAGE_KERNEL_DIR` points at another copy of
//! the kernels (the mutation check builds mutated copies); `TRIAGE_SIM_SANITIZE=1` builds them
//! with AddressSanitizer and UndefinedBehaviorSanitizer and links the test binaries with them.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let kernel_dir = std::env::var_os("TRIAGE_KERNEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest_dir.join("../../kernels"));
    let sanitize = std::env::var("TRIAGE_SIM_SANITIZE").is_ok_and(|v| v == "1");
    println!("cargo:rerun-if-env-changed=TRIAGE_KERNEL_DIR");
    println!("cargo:rerun-if-env-changed=TRIAGE_SIM_SANITIZE");
    println!("cargo:rerun-if-changed={}", kernel_dir.display());
    println!("cargo:rerun-if-changed=cpp");
    println!("cargo:rustc-check-cfg=cfg(sim_sanitize)");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .file("cpp/launchers.cpp")
        .include(&kernel_dir)
        .define("TRIAGE_CUDA_SIM", None)
        .opt_level(2)
        .debug(true)
        .flag("-Wall")
        .flag("-Wextra")
        // `#pragma unroll` is nvcc's; g++ would warn that it ignores it.
        .flag("-Wno-unknown-pragmas")
        .warnings_into_errors(true);
    if sanitize {
        for flag in [
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
            // With both sanitizers at -O2, g++ 12.2 built prefill_attention so that some of its
            // rows were never written, with no sanitizer report; the plain build, either
            // sanitizer alone, -O1, and this build without value-range propagation all give the
            // right values (and nvcc builds the GPU code). Unexplained, so the pass is off here
            // rather than a check.
            "-fno-tree-vrp",
        ] {
            build.flag(flag);
        }
        // The runtimes as shared libraries, named before libc so the loader maps ASan first
        // (as it requires). `-fsanitize` as a link argument does not survive rustc's rust-lld.
        println!("cargo:rustc-link-lib=dylib=asan");
        println!("cargo:rustc-link-lib=dylib=ubsan");
        // ASan aborts the process at a guard-zone write, where the plain build returns an error.
        println!("cargo:rustc-cfg=sim_sanitize");
    }
    build.compile("triage_kernel_sim");
}
