//! The object-store tier of a ckptfs space (README "Object-store tier", FORMAT.md
//! "Object-store tier"): the committed state of a local space copied to an S3-compatible
//! bucket as immutable objects (packs of chunks, manifests, a head), a lease so that one
//! node owns a prefix at a time, and the rebuild of a space on any node from the bucket
//! alone.
//!
//! The local backing space stays the write path (local speed, local durability at close);
//! this crate sits above the filesystem crate and reads the space only through its public
//! API (`Space::export_tree`, `Data::read_checked`), so nothing below it waits on a
//! network.

pub mod bucket;
pub mod config;
pub mod fetch;
pub mod gc;
pub mod manifest;
pub mod restore;
pub mod upload;

pub use bucket::Bucket;
pub use config::{Durability, RemoteConfig};
pub use upload::{RemoteStatus, Uploader};

/// What can go wrong between a space and its bucket.
#[derive(Debug)]
pub enum Error {
    /// Bad settings or a bucket that cannot be used as asked (the message says what to do).
    Config(String),
    /// The object store refused or failed a request (after the client's retries).
    Store(String),
    /// A conditional put found the object changed (`If-Match`) or present (`If-None-Match`).
    Precondition(String),
    /// Another node owns the prefix (its lease runs).
    Owned(String),
    /// This mount lost the prefix to another node: it uploads nothing more.
    Fenced(String),
    /// An object in the bucket does not match what names it (blake3), or does not parse.
    Damaged(String),
    Engine(ckptfs_engine::Error),
    Fs(ckptfs_fs::Error),
    Other(String),
}

impl Error {
    pub(crate) fn store(key: &object_store::path::Path, e: object_store::Error) -> Error {
        Error::Store(format!("{key}: {e}"))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(s) | Error::Other(s) => f.write_str(s),
            Error::Store(s) => write!(f, "the object store failed: {s}"),
            Error::Precondition(s) => write!(f, "{s} changed in the bucket meanwhile"),
            Error::Owned(s) => f.write_str(s),
            Error::Fenced(s) => write!(f, "fenced: {s}"),
            Error::Damaged(s) => write!(f, "damaged in the bucket: {s}"),
            Error::Engine(e) => write!(f, "{e}"),
            Error::Fs(e) => write!(f, "{e:?}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ckptfs_engine::Error> for Error {
    fn from(e: ckptfs_engine::Error) -> Self {
        Error::Engine(e)
    }
}

impl From<ckptfs_fs::Error> for Error {
    fn from(e: ckptfs_fs::Error) -> Self {
        Error::Fs(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;
