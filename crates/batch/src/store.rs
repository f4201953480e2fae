//! Where file bytes live: a local folder (`--files-dir`) or S3-compatible object storage
//! (`--files-url s3://bucket/prefix`, credentials and endpoint from the usual `AWS_*`
//! variables), both through the `object_store` crate. Every replica must see the same store.
//! Objects are named `files/<file id>`; writes stream through a multipart upload, so no file
//! is held whole in memory, and an object appears only once it is complete.

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::io::AsyncWriteExt;

use crate::error::BatchError;

/// The file store.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    /// Where it is, for logs (no credentials).
    pub describe: String,
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("--files-dir {dir}: {reason}")]
    Dir { dir: String, reason: String },
    #[error("--files-url {url}: {reason}")]
    Url { url: String, reason: String },
}

impl Store {
    /// A local folder, made when missing.
    pub fn local(dir: &std::path::Path) -> Result<Store, StoreError> {
        let bad = |reason: String| StoreError::Dir {
            dir: dir.display().to_string(),
            reason,
        };
        std::fs::create_dir_all(dir).map_err(|e| bad(e.to_string()))?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Store {
            inner: Arc::new(fs),
            describe: dir.display().to_string(),
        })
    }

    /// S3-compatible storage at `s3://bucket[/prefix]`.
    pub fn s3(url: &str) -> Result<Store, StoreError> {
        let bad = |reason: String| StoreError::Url {
            url: url.to_owned(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        if parsed.scheme() != "s3" {
            return Err(bad(
                "only s3:// URLs are served (S3-compatible storage)".into()
            ));
        }
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_url(url)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let prefix = parsed.path().trim_matches('/').to_owned();
        let inner: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
        };
        Ok(Store {
            inner,
            describe: url.to_owned(),
        })
    }

    fn path(file_id: &str) -> Path {
        Path::from(format!("files/{file_id}"))
    }

    /// A streaming writer of a file's bytes: [`Writer::finish`] makes the object appear.
    pub fn writer(&self, file_id: &str) -> Writer {
        Writer {
            inner: BufWriter::new(self.inner.clone(), Self::path(file_id)),
            id: file_id.to_owned(),
            bytes: 0,
        }
    }

    /// A file's bytes as a stream.
    pub async fn read(
        &self,
        file_id: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, object_store::Error>>, BatchError> {
        match self.inner.get(&Self::path(file_id)).await {
            Ok(got) => Ok(got.into_stream().boxed()),
            Err(object_store::Error::NotFound { .. }) => Err(BatchError::InputGone(file_id.into())),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes a file's bytes (gone already is fine).
    pub async fn delete(&self, file_id: &str) -> Result<(), BatchError> {
        match self.inner.delete(&Self::path(file_id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The files whose objects were last written before `before` (Unix seconds): the
    /// candidates of the orphan sweep. Objects not named like a file are left out.
    pub async fn written_before(&self, before: i64) -> Result<Vec<String>, BatchError> {
        let mut listing = self.inner.list(Some(&Path::from("files")));
        let mut old = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            if meta.last_modified.timestamp() >= before {
                continue;
            }
            if let Some(id) = meta.location.filename() {
                if crate::ids::is_file_id(id) {
                    old.push(id.to_owned());
                }
            }
        }
        Ok(old)
    }

    /// Whether the store answers (for `/readyz`).
    pub async fn check(&self) -> Result<(), BatchError> {
        let mut listing = self.inner.list(Some(&Path::from("files")));
        match listing.next().await {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(e.into()),
        }
    }
}

/// A file being written.
#[derive(Debug)]
pub struct Writer {
    inner: BufWriter,
    /// The file it writes.
    pub id: String,
    /// Bytes written so far.
    pub bytes: u64,
}

impl Writer {
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), BatchError> {
        self.inner.write_all(chunk).await?;
        self.bytes += chunk.len() as u64;
        Ok(())
    }

    /// Completes the object.
    pub async fn finish(mut self) -> Result<u64, BatchError> {
        self.inner.shutdown().await?;
        Ok(self.bytes)
    }

    /// Gives the object up: nothing of it stays.
    pub async fn abort(mut self) {
        if let Err(e) = self.inner.abort().await {
            tracing::warn!(error = %e, "could not abort a partial upload");
        }
    }
}
