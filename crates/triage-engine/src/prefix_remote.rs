//! A shared store behind the persisted-prefix directory (an S3-compatible bucket, say), which the
//! directory then caches: the engine asks the store for a file it misses and hands it every file
//! it writes. How the store is reached is the host's business; the engine sees names and files.

use std::path::Path;

use crate::Result;

/// Where persisted prefixes are shared between machines; an object's name is its file's name.
pub trait PrefixRemote: Send + Sync + std::fmt::Debug {
    /// Copy the object `name` to the file `local`, written whole or not at all; `Ok(false)` when
    /// the store has no such object.
    fn fetch(&self, name: &str, local: &Path) -> Result<bool>;

    /// Store the file `local` as `name` unless the store has that name already (a prefix file
    /// is written once: equal names hold equally valid contents). Returns whether it uploaded.
    fn publish(&self, name: &str, local: &Path) -> Result<bool>;
}
