//! Which bucket a space's tier is, how to reach it, and when a close counts as done: the
//! backing directory's `remote` file (JSON, written durably by `ckptfs format --remote` or
//! `ckptfs remote set`), and the credentials, found where AWS tools look for them.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The name of the tier's settings in a backing directory.
pub const REMOTE_FILE: &str = ckptfs_engine::format::REMOTE_FILE;

/// When `close()` and `fsync()` return on a space with a tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// At local durability; the upload follows in the background (the default: a close
    /// costs what it costs without a tier, and `ckptfs remote` says how far behind the
    /// bucket is).
    Async,
    /// Only once the bucket holds the revision (its chunks, a manifest naming it and the
    /// head naming that manifest).
    Close,
}

impl std::str::FromStr for Durability {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "async" => Ok(Durability::Async),
            "close" => Ok(Durability::Close),
            _ => Err(Error::Config(format!(
                "--remote-durability is `async` or `close`, not `{s}`"
            ))),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Async => "async",
            Durability::Close => "close",
        })
    }
}

/// The tier's settings (the `remote` file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteConfig {
    /// `s3://BUCKET/PREFIX`.
    pub url: String,
    /// An S3-compatible server's URL (on-prem: SeaweedFS, Ceph RGW, MinIO, Garage);
    /// default: `AWS_ENDPOINT_URL`, else AWS itself.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Default: `AWS_REGION` / `AWS_DEFAULT_REGION`, the profile's region, else us-east-1.
    #[serde(default)]
    pub region: Option<String>,
    pub durability: Durability,
    /// The newest head this space wrote (saved before the head is written) or was
    /// recovered from: a bucket whose head is newer was written by another node since, and
    /// a mount of this space as its owner would roll it back (refused).
    #[serde(default)]
    pub head_seq: u64,
    /// Bytes of chunks fetched on demand kept in `remote-cache` (`mount --cache-size`;
    /// default `fetch::DEFAULT_CACHE_BYTES`, 0: none kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_bytes: Option<u64>,
}

impl RemoteConfig {
    /// `url` checked: `s3://BUCKET[/PREFIX]`.
    pub fn new(url: &str, endpoint: Option<String>, durability: Durability) -> Result<Self> {
        split_url(url)?;
        Ok(RemoteConfig {
            url: url.trim_end_matches('/').to_string(),
            endpoint,
            region: None,
            durability,
            head_seq: 0,
            cache_bytes: None,
        })
    }

    /// The bucket and the key prefix (no leading or trailing slash; may be empty).
    pub fn bucket_and_prefix(&self) -> Result<(String, String)> {
        split_url(&self.url)
    }

    /// The settings of the space in `dir`, if it has a tier.
    pub fn load(dir: &Path) -> Result<Option<RemoteConfig>> {
        let p = dir.join(REMOTE_FILE);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::Config(format!("{} is damaged: {e}", p.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Config(format!("cannot read {}: {e}", p.display()))),
        }
    }

    /// Writes the settings into `dir` durably (a temporary file, fsync, rename, fsync of
    /// the directory), so a crash leaves the old settings or the new ones.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let mut b = serde_json::to_vec_pretty(self).expect("serializable");
        b.push(b'\n');
        ckptfs_engine::space::write_file_durably(dir, REMOTE_FILE, &b)
            .map_err(|e| Error::Config(format!("cannot write {}: {e}", dir.display())))
    }
}

fn split_url(url: &str) -> Result<(String, String)> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| {
        Error::Config(format!(
            "`{url}` is not an object-store URL: give s3://BUCKET/PREFIX"
        ))
    })?;
    let rest = rest.trim_end_matches('/');
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty()
        || !bucket
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
    {
        return Err(Error::Config(format!(
            "`{url}`: `{bucket}` is not a bucket name (lower-case letters, digits, `-`, `.`)"
        )));
    }
    if prefix
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..")
        && !prefix.is_empty()
    {
        return Err(Error::Config(format!(
            "`{url}`: the prefix has an empty, `.` or `..` part"
        )));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// Credentials and region from `~/.aws/credentials` and `~/.aws/config` (profile
/// `AWS_PROFILE`, else `default`), for what the environment does not set: the files the
/// AWS CLI and SDKs read. `(key, value)` pairs as `AmazonS3Builder` names them.
pub(crate) fn profile_settings() -> Vec<(String, String)> {
    let Some(home) = std::env::var_os("HOME") else {
        return Vec::new();
    };
    let home = Path::new(&home);
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let creds_path = std::env::var_os("AWS_SHARED_CREDENTIALS_FILE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| home.join(".aws/credentials"));
    let config_path = std::env::var_os("AWS_CONFIG_FILE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| home.join(".aws/config"));
    let mut out = Vec::new();
    let section = |text: &str, name: &str| -> Vec<(String, String)> {
        let mut inside = false;
        let mut kv = Vec::new();
        for line in text.lines() {
            let l = line.trim();
            if l.starts_with('[') && l.ends_with(']') {
                let n = l[1..l.len() - 1].trim();
                inside = n == name || n.strip_prefix("profile ").map(str::trim) == Some(name);
            } else if inside {
                if let Some((k, v)) = l.split_once('=') {
                    kv.push((k.trim().to_string(), v.trim().to_string()));
                }
            }
        }
        kv
    };
    if let Ok(t) = std::fs::read_to_string(&creds_path) {
        for (k, v) in section(&t, &profile) {
            match k.as_str() {
                "aws_access_key_id" => out.push(("aws_access_key_id".into(), v)),
                "aws_secret_access_key" => out.push(("aws_secret_access_key".into(), v)),
                "aws_session_token" => out.push(("aws_session_token".into(), v)),
                _ => {}
            }
        }
    }
    if let Ok(t) = std::fs::read_to_string(&config_path) {
        for (k, v) in section(&t, &profile) {
            match k.as_str() {
                "region" => out.push(("aws_region".into(), v)),
                "endpoint_url" => out.push(("aws_endpoint".into(), v)),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_a_prefix() {
        assert_eq!(
            split_url("s3://b/p/q/").unwrap(),
            ("b".into(), "p/q".into())
        );
        assert_eq!(split_url("s3://b").unwrap(), ("b".into(), "".into()));
        for bad in ["b/p", "s3://", "s3://B/p", "s3://b/p//q", "s3://b/../q"] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }
}
