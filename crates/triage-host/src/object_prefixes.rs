//! Persisted prefixes shared through an S3-compatible object store (`[pipeline] prefix_store =
//! "s3://bucket/path"`), with the local prefix directory as its cache, through the
//! `object_store` crate. Credentials, region and endpoint come from the usual `AWS_*` variables.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use triage_engine::{EngineError, PrefixRemote};

use crate::{HostError, Result};

/// A bucket (and a path in it) holding prefix files under their file names.
pub struct ObjectPrefixStore {
    url: String,
    store: Arc<dyn ObjectStore>,
    root: ObjectPath,
    /// Always `Some` until drop, which shuts it down without blocking (see `Drop`).
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for ObjectPrefixStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectPrefixStore")
            .field("url", &self.url)
            .finish()
    }
}

impl ObjectPrefixStore {
    /// Open `s3://bucket[/path]`. The client reads `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL` (another S3-compatible service) and `AWS_ALLOW_HTTP`
    /// (a plain-HTTP endpoint), as `object_store`'s `AmazonS3Builder::from_env` documents.
    pub fn open(url: &str) -> Result<Self> {
        let bad = |why: &str| HostError::Config(format!("prefix_store {url:?}: {why}"));
        let rest = url.strip_prefix("s3://").ok_or_else(|| {
            bad("only s3:// stores are supported (a shared folder is prefix_dir)")
        })?;
        let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| bad(&format!("starting its I/O runtime: {e}")))?;
        Ok(Self {
            url: url.to_string(),
            store: Arc::new(store),
            root: ObjectPath::from(path),
            runtime: Some(runtime),
        })
    }

    fn location(&self, name: &str) -> ObjectPath {
        self.root.child(name)
    }

    /// Run `future` to completion on this store's runtime, from a thread of its own: the caller
    /// may itself be inside another runtime, where blocking on this one would panic.
    fn block_on<T: Send>(
        &self,
        future: impl Future<Output = T> + Send,
    ) -> triage_engine::Result<T> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| self.error("its I/O runtime has shut down"))?;
        std::thread::scope(|s| {
            s.spawn(|| runtime.block_on(future))
                .join()
                .map_err(|_| self.error("its I/O thread panicked"))
        })
    }

    fn error(&self, message: impl std::fmt::Display) -> EngineError {
        EngineError::Invalid(format!("prefix store {}: {message}", self.url))
    }
}

impl Drop for ObjectPrefixStore {
    /// A runtime dropped the usual way blocks on its tasks, which panics when the last owner of
    /// the store goes away inside the server's async runtime; this one has nothing left to wait for.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl PrefixRemote for ObjectPrefixStore {
    fn fetch(&self, name: &str, local: &Path) -> triage_engine::Result<bool> {
        let location = self.location(name);
        let bytes = self.block_on(async {
            match self.store.get(&location).await {
                Ok(got) => got.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        let Some(bytes) = bytes.map_err(|e| self.error(e))? else {
            return Ok(false);
        };
        // Whole or not at all: a reader of the directory never sees half a file.
        let tmp = local.with_extension(format!("part{}", std::process::id()));
        let io = |e: std::io::Error| self.error(format!("writing {}: {e}", local.display()));
        if let Some(dir) = local.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(&tmp, &bytes).map_err(io)?;
        std::fs::rename(&tmp, local).map_err(io)?;
        tracing::info!(object = %location, bytes = bytes.len(), "prefix fetched from the shared store");
        Ok(true)
    }

    fn publish(&self, name: &str, local: &Path) -> triage_engine::Result<bool> {
        let location = self.location(name);
        let payload = std::fs::read(local)
            .map(PutPayload::from)
            .map_err(|e| self.error(format!("reading {}: {e}", local.display())))?;
        // A payload is shared buffers: cloning it for a second attempt copies no prefix bytes.
        let put = |mode: PutMode| {
            let options = PutOptions {
                mode,
                ..PutOptions::default()
            };
            self.store.put_opts(&location, payload.clone(), options)
        };
        let uploaded = self.block_on(async {
            if self.store.head(&location).await.is_ok() {
                return Ok(false);
            }
            match put(PutMode::Create).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                // A store configured without conditional writes: a same-named object holds an
                // equally valid prefix, so overwriting it is harmless.
                Err(object_store::Error::NotImplemented) => {
                    put(PutMode::Overwrite).await.map(|_| true)
                }
                Err(e) => Err(e),
            }
        })?;
        let uploaded = uploaded.map_err(|e| self.error(e))?;
        if uploaded {
            tracing::info!(object = %location, "prefix published to the shared store");
        }
        Ok(uploaded)
    }
}
