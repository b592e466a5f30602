//! A bucket prefix as blocking calls: the object store client (`object_store`'s S3) on a
//! runtime of its own, so the daemon's threads and the CLI call it like a disk.

use crate::config::{profile_settings, RemoteConfig};
use crate::{Error, Result};
use bytes::Bytes;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::path::Path as Key;
use object_store::{
    ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
    UpdateVersion,
};
use std::sync::Arc;
use std::time::Duration;

/// Threads of the runtime the client runs on: requests are I/O; two keep several uploads
/// in flight while one signs or checksums.
const RUNTIME_THREADS: usize = 2;

/// How a put may replace what is there.
#[derive(Clone, Debug)]
pub enum Put {
    /// Whatever is there (immutable, content-named objects: a second put writes the same).
    Overwrite,
    /// Only if nothing is there (`If-None-Match: *`).
    Create,
    /// Only if what is there has this ETag (`If-Match`).
    IfMatch(String),
}

/// One object as listed.
#[derive(Clone, Debug)]
pub struct Listed {
    /// The key relative to the prefix.
    pub rel: String,
    pub size: u64,
    pub modified_unix: i64,
}

/// A bucket and key prefix (see the module doc).
pub struct Bucket {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    url: String,
}

impl Bucket {
    /// Connects nothing yet: the first request does (so a store that is down is an error of
    /// that request, retried by the caller).
    pub fn open(cfg: &RemoteConfig) -> Result<Bucket> {
        Self::open_with(cfg, &[])
    }

    /// `open` with settings given here over the environment's (`aws_access_key_id`, ...; as
    /// `AmazonS3ConfigKey` names them): for tools and tests that hold their own credentials.
    pub fn open_with(cfg: &RemoteConfig, given: &[(&str, &str)]) -> Result<Bucket> {
        let (bucket, prefix) = cfg.bucket_and_prefix()?;
        let mut b = AmazonS3Builder::new();
        for (k, v) in profile_settings() {
            if let Ok(key) = k.parse::<AmazonS3ConfigKey>() {
                b = b.with_config(key, v);
            }
        }
        // The environment after the profile files: it wins, as with the AWS tools.
        for (k, v) in std::env::vars() {
            if k.starts_with("AWS_") {
                if let Ok(key) = k.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                    b = b.with_config(key, v);
                }
            }
        }
        for (k, v) in given {
            let key = k
                .parse::<AmazonS3ConfigKey>()
                .map_err(|e| Error::Config(format!("{k}: {e}")))?;
            b = b.with_config(key, *v);
        }
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            if let Some(r) = &cfg.region {
                b = b.with_region(r);
            }
        }
        let endpoint = cfg
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
        // The client options replace the builder's, so plain HTTP (a loopback or on-prem
        // server) is allowed here, not with the builder's `with_allow_http`.
        let http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        if let Some(e) = &endpoint {
            b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
        }
        // Over TLS (AWS itself, or an https endpoint) the payload goes unsigned: TLS guards it
        // on the wire and every object is named or checked by blake3, so SigV4's SHA-256
        // of each 32 MiB pack would only cost CPU. Over plain HTTP (loopback, on-prem) it is
        // signed, so a body changed on the way is refused at upload, not found at restore.
        let tls = !endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        let store = b
            .with_unsigned_payload(tls)
            .with_bucket_name(&bucket)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(http)
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(60)),
            )
            // Retries inside one request for up to 30 s (backoff); past that the uploader's
            // own backoff takes over and the status says `retrying`, with the error.
            .with_retry(RetryConfig {
                max_retries: 6,
                retry_timeout: Duration::from_secs(30),
                ..Default::default()
            })
            .build()
            .map_err(|e| Error::Config(format!("{}: {e}", cfg.url)))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("ckptfs-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("cannot start the S3 client's runtime: {e}")))?;
        Ok(Bucket {
            rt,
            store: Arc::new(store),
            prefix,
            url: cfg.url.clone(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn key(&self, rel: &str) -> Key {
        if self.prefix.is_empty() {
            Key::from(rel)
        } else {
            Key::from(format!("{}/{rel}", self.prefix))
        }
    }

    fn rel_of(&self, k: &Key) -> String {
        let s = k.as_ref();
        match self.prefix.is_empty() {
            true => s.to_string(),
            false => s
                .strip_prefix(&self.prefix)
                .map(|r| r.trim_start_matches('/').to_string())
                .unwrap_or_else(|| s.to_string()),
        }
    }

    /// The object and its ETag; `None` if there is none.
    pub fn get(&self, rel: &str) -> Result<Option<(Bytes, Option<String>)>> {
        let key = self.key(rel);
        let store = self.store.clone();
        self.rt.block_on(async move {
            match store.get(&key).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone();
                    let b = r.bytes().await.map_err(|e| Error::store(&key, e))?;
                    Ok(Some((b, etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(Error::store(&key, e)),
            }
        })
    }

    /// Bytes `[start, end)` of an object.
    pub fn get_range(&self, rel: &str, start: u64, end: u64) -> Result<Bytes> {
        self.join_get(self.spawn_get_range(rel, start, end))
    }

    /// `get_range` started on the client's runtime (`join_get` waits for it).
    pub fn spawn_get_range(
        &self,
        rel: &str,
        start: u64,
        end: u64,
    ) -> tokio::task::JoinHandle<Result<Bytes>> {
        let key = self.key(rel);
        let store = self.store.clone();
        self.rt.spawn(async move {
            store
                .get_range(&key, start..end)
                .await
                .map_err(|e| Error::store(&key, e))
        })
    }

    /// Waits for a read `spawn_get_range` started.
    pub fn join_get(&self, h: tokio::task::JoinHandle<Result<Bytes>>) -> Result<Bytes> {
        self.rt
            .block_on(h)
            .map_err(|e| Error::Other(format!("a download task failed: {e}")))?
    }

    /// Puts one object; returns its ETag. A condition that does not hold is
    /// `Error::Precondition`.
    pub fn put(&self, rel: &str, bytes: Bytes, how: Put) -> Result<Option<String>> {
        let fut = self.put_future(rel, bytes, how);
        self.rt.block_on(fut)
    }

    /// `put` started on the client's runtime; the handle's result is the put's.
    pub fn spawn_put(
        &self,
        rel: &str,
        bytes: Bytes,
    ) -> tokio::task::JoinHandle<Result<Option<String>>> {
        self.rt.spawn(self.put_future(rel, bytes, Put::Overwrite))
    }

    /// Waits for a put `spawn_put` started.
    pub fn join(
        &self,
        h: tokio::task::JoinHandle<Result<Option<String>>>,
    ) -> Result<Option<String>> {
        self.rt
            .block_on(h)
            .map_err(|e| Error::Other(format!("an upload task failed: {e}")))?
    }

    fn put_future(
        &self,
        rel: &str,
        bytes: Bytes,
        how: Put,
    ) -> impl std::future::Future<Output = Result<Option<String>>> + Send + 'static {
        let key = self.key(rel);
        let store = self.store.clone();
        async move {
            let mode = match how {
                Put::Overwrite => PutMode::Overwrite,
                Put::Create => PutMode::Create,
                Put::IfMatch(e) => PutMode::Update(UpdateVersion {
                    e_tag: Some(e),
                    version: None,
                }),
            };
            match store
                .put_opts(&key, PutPayload::from_bytes(bytes), PutOptions::from(mode))
                .await
            {
                Ok(r) => Ok(r.e_tag),
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => {
                    Err(Error::Precondition(key.to_string()))
                }
                Err(e) => Err(Error::store(&key, e)),
            }
        }
    }

    /// Every object under `rel_prefix` (relative keys).
    pub fn list(&self, rel_prefix: &str) -> Result<Vec<Listed>> {
        use futures::TryStreamExt;
        let key = self.key(rel_prefix.trim_end_matches('/'));
        let store = self.store.clone();
        let metas: Vec<object_store::ObjectMeta> = self.rt.block_on(async move {
            store
                .list(Some(&key))
                .try_collect()
                .await
                .map_err(|e| Error::store(&key, e))
        })?;
        Ok(metas
            .into_iter()
            .map(|m| Listed {
                rel: self.rel_of(&m.location),
                size: m.size,
                modified_unix: m.last_modified.timestamp(),
            })
            .collect())
    }

    /// Deletes an object (none there is no error).
    pub fn delete(&self, rel: &str) -> Result<()> {
        let key = self.key(rel);
        let store = self.store.clone();
        self.rt.block_on(async move {
            match store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(Error::store(&key, e)),
            }
        })
    }
}
