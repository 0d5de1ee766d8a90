//! Fetches catalog entries into the triage home until `triage models fetch` exists: `cargo run --release --example fetch_defaults -- [--data] [NAME...]`.

use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = triage::fetch::FetchOptions {
        names: args.iter().filter(|a| *a != "--data").cloned().collect(),
        include_data: args.iter().any(|a| a == "--data"),
        pip: None,
        progress: true,
        home: None,
    };
    let start = Instant::now();
    for outcome in triage::fetch::fetch(&opts)? {
        println!("{} {:?} in {:.1?}", outcome.name, outcome.status, outcome.elapsed);
        if let Some(report) = &outcome.requant {
            println!("  requantized: {report}");
        }
        for file in &outcome.files {
            println!("  {} {} bytes sha256 {}", file.path.display(), file.size, file.sha256);
        }
    }
    println!("total {:.1?}", start.elapsed());
    Ok(())
}
