//! Stamps the version, git revision and enabled features into the binary (`triage --version`).
//! It compiles no CUDA: kernels are built by the ops crate behind the `cuda` feature.

use std::process::Command;

fn main() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    let mut features = Vec::new();
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        features.push("cuda");
    }
    let features = if features.is_empty() {
        "cpu".to_string()
    } else {
        features.join(",")
    };
    println!("cargo:rustc-env=TRIAGE_GIT_REV={rev}");
    println!("cargo:rustc-env=TRIAGE_FEATURES={features}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_CUDA");
}
