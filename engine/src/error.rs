//! The engine's one error type. The FUSE adapter maps every variant to an errno in one
//! exhaustive match, so adding a variant forces a decision there.

use std::fmt;
use std::io;

#[derive(Debug)]
pub enum Error {
    /// An I/O error from the backing storage.
    Io(io::Error),
    /// The reserved data file has no room for the data being stored.
    NoSpace,
    /// Stored bytes do not match their content hash, or a record failed validation.
    Corrupt(String),
    /// The backing directory is not a ckptfs space, or of an unknown version.
    NotASpace(String),
    /// Another process holds the space (it is mounted or being formatted).
    Locked(String),
    /// A request the caller got wrong (bad option, bad size).
    Invalid(String),
    /// The metadata table reported an error.
    Meta(String),
    /// An earlier write or sync failed; the space refuses further writes (sticky failure).
    Failed,
    /// The space is open read-only (`ckptfs mount --read-only`): nothing may change it.
    ReadOnly,
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error on the backing space: {e}"),
            Error::NoSpace => write!(f, "the reserved space is full"),
            Error::Corrupt(m) => write!(f, "corruption detected: {m}"),
            Error::NotASpace(m) => write!(f, "{m}"),
            Error::Locked(m) => write!(f, "{m}"),
            Error::Invalid(m) => write!(f, "{m}"),
            Error::Meta(m) => write!(f, "metadata table error: {m}"),
            Error::Failed => write!(
                f,
                "an earlier write or sync to the backing space failed; refusing writes until remount"
            ),
            Error::ReadOnly => write!(
                f,
                "the space is mounted read-only; unmount it and mount it without --read-only to change it"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            Error::NoSpace
        } else {
            Error::Io(e)
        }
    }
}

macro_rules! meta_err {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                match e.into() {
                    redb::Error::Io(io) => Error::from(io),
                    other => Error::Meta(other.to_string()),
                }
            }
        }
    )*};
}
meta_err!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);
