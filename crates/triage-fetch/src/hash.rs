//! A file's sha256 (and, where asked, its git blob id) in 1 MiB reads under a progress bar: what
//! the PyPI import and the Hub's checks both hash with.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha1::Sha1;
use sha2::{Digest as _, Sha256};

use crate::error::{IoContext, Result};

/// The sha256 of the file at `path` and, with `git`, its git blob id, both in hex; `label` names
/// the bar, which shows only when `progress` and stderr is a terminal.
pub fn hash_file(
    path: &Path,
    git: bool,
    progress: bool,
    label: String,
) -> Result<(String, Option<String>)> {
    let mut file = File::open(path).at(|| format!("opening {}", path.display()))?;
    let len = file
        .metadata()
        .at(|| format!("reading {}", path.display()))?
        .len();
    let bar = crate::fetch::bytes_bar(progress, len, label);
    let mut sha256 = Sha256::new();
    let mut sha1 = git.then(|| {
        let mut h = Sha1::new();
        h.update(format!("blob {len}\0"));
        h
    });
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .at(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        sha256.update(&buf[..n]);
        if let Some(h) = sha1.as_mut() {
            h.update(&buf[..n]);
        }
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    Ok((hex(&sha256.finalize()), sha1.map(|h| hex(&h.finalize()))))
}
