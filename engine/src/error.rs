//! The engine's one error type. The FUSE adapter maps every variant to an errno in one
//! exhaustive match, so adding a variant forces a decision there.

use crate::ids::{ChunkHash, DataOffset, HistoryId, InodeId, RevisionId};
use std::fmt;
use std::io;

#[derive(Debug)]
pub enum Error {
    /// An I/O error from the backing storage.
    Io(io::Error),
    /// The reserved data file has no room for the data being stored.
    NoSpace,
    /// Stored bytes do not match their content hash, or the metadata contradicts itself.
    Corrupt(Corruption),
    /// The backing directory is not a ckptfs space, or of an unknown version.
    NotASpace(String),
    /// Another process holds the space (it is mounted or being formatted).
    Locked(String),
    /// A request the caller got wrong (bad option, bad size).
    Invalid(String),
    /// The metadata table's library (redb) refused or failed, where that is neither damage
    /// (`Corrupt`) nor the device's error (`Io`); see `MetaFault`.
    Meta(MetaFault),
    /// An earlier write or sync failed, or a backing file was lost while mounted; the space
    /// refuses further writes (sticky failure).
    Failed,
    /// The space is open read-only (`ckptfs mount --read-only`): nothing may change it.
    ReadOnly,
    /// The backing filesystem is full: the metadata table cannot keep room for its growth
    /// there (`device::TableRoom`), so new data is refused though the space has room.
    BackingFull,
    /// A multi-slot space formatted by a build with the path-merged namespace (before the
    /// shared namespace, `Features::INCOMPAT_SHARED_NAMESPACE`): this build does not mount
    /// it (it would misread its entries); the message says what to do.
    OldSlotNamespace,
    /// This mount lost its slot (its lease lapsed, or another mount took the slot over):
    /// every later write fails; the reason is the message.
    Fenced(String),
    /// A namespace change waited longer than its bound for another node's change of the
    /// same names to finish (that node holds its intent without finishing: see FORMAT.md
    /// "Intents").
    NamespaceBusy(String),
    /// The other live nodes of a multi-slot space did not see this node's coherence probe
    /// (a mount refused: the shared filesystem may not show clients each other's writes).
    Incoherent(String),
    /// A space over several storage targets was needed (`rebuild`, `scrub`), and this one
    /// keeps its data in one file.
    OneTarget,
    /// Too few of a space's storage targets could serve a request (see `TargetFault`).
    Targets(TargetFault),
    /// A namespace operation the namespace as it is refuses (`catalog::ns`): the filesystem
    /// answers each with its errno.
    Namespace(NsFault),
}

/// What the metadata table's library reported, typed where a caller decides.
#[derive(Debug)]
pub enum MetaFault {
    /// A record larger than the table takes (redb's limit, 3 GiB): the change is refused
    /// and nothing else is wrong (the filesystem answers EFBIG, not EIO).
    TooLarge(usize),
    /// Anything else the library reports, in its words (a bug or a misuse here: EIO).
    Other(String),
}

/// Why a typed namespace operation was refused (`catalog::ns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NsFault {
    /// No entry of that name (ENOENT).
    NotFound,
    /// The name is taken (EEXIST).
    Exists,
    /// A directory was needed (ENOTDIR).
    NotDir,
    /// Not a directory was needed (EISDIR).
    IsDir,
    /// The directory has entries (ENOTEMPTY).
    NotEmpty,
    /// No such extended attribute (ENODATA).
    NoAttr,
}

impl From<NsFault> for Error {
    fn from(f: NsFault) -> Self {
        Error::Namespace(f)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error on the backing space: {e}"),
            Error::NoSpace => write!(f, "the reserved space is full"),
            Error::Corrupt(c) => write!(f, "corruption detected: {c}"),
            Error::NotASpace(m) => write!(f, "{m}"),
            Error::Locked(m) => write!(f, "{m}"),
            Error::Invalid(m) => write!(f, "{m}"),
            Error::Meta(MetaFault::TooLarge(n)) => write!(
                f,
                "metadata table error: a record of {n} bytes is larger than the table takes"
            ),
            Error::Meta(MetaFault::Other(m)) => write!(f, "metadata table error: {m}"),
            Error::Failed => write!(
                f,
                "the space failed earlier (a backing write or sync failed, or a backing file \
                 was removed or replaced while mounted: `ckptfs stats` says which); refusing \
                 writes until remount"
            ),
            Error::BackingFull => write!(
                f,
                "the backing filesystem is full: the metadata table has no room left to grow \
                 there; free space on it (the ckptfs space itself is not full)"
            ),
            Error::OneTarget => write!(
                f,
                "this space keeps its data in one file (formatted without --target): it has no \
                 shards to rebuild or scrub; `ckptfs check` verifies it"
            ),
            Error::ReadOnly => write!(
                f,
                "the space is mounted read-only; unmount it and mount it without --read-only to change it"
            ),
            Error::OldSlotNamespace => write!(
                f,
                "this multi-slot space was formatted by an earlier ckptfs whose nodes merged \
                 their namespaces by path; this build mounts only spaces with the shared \
                 namespace (FORMAT.md, version log). Nothing was changed: mount it with the \
                 build that formatted it, copy its files out, and format a new space"
            ),
            Error::Fenced(m) => write!(f, "{m}"),
            Error::NamespaceBusy(m) => write!(f, "{m}"),
            Error::Incoherent(m) => write!(f, "{m}"),
            Error::Targets(t) => write!(f, "{t}"),
            Error::Namespace(n) => write!(
                f,
                "{}",
                match n {
                    NsFault::NotFound => "no such entry",
                    NsFault::Exists => "the name exists",
                    NsFault::NotDir => "not a directory",
                    NsFault::IsDir => "is a directory",
                    NsFault::NotEmpty => "the directory is not empty",
                    NsFault::NoAttr => "no such attribute",
                }
            ),
        }
    }
}

impl std::error::Error for Error {}

/// What is damaged, and where: callers act on the kind (`ckptfs check` groups chunk damage
/// by file; gc refuses to copy a damaged chunk forward) and print the sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// A stored chunk fails its blake3 check or does not decode.
    Chunk {
        hash: ChunkHash,
        offset: DataOffset,
        damage: ChunkDamage,
    },
    /// An extent (or a copy of one) names a chunk the chunk table does not have.
    UnknownChunk(ChunkHash),
    /// A chunk's reference count is lower than the extents naming it: dropping a
    /// reference would take it below zero.
    RefUnderflow(ChunkHash),
    /// A row another row names is missing.
    Missing(Missing),
    /// A catalog record does not decode or contradicts its neighbours (`record` names which
    /// kind, `why` says what is wrong with it).
    Record { record: &'static str, why: String },
    /// The superblock fails its checksum or holds values out of range.
    Superblock(String),
    /// The metadata table's file (meta.redb) is damaged.
    Catalog(String),
    /// The data file disagrees with the superblock or the catalog about its size.
    Layout(String),
}

/// What is wrong with a stored chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkDamage {
    /// The decoded bytes do not hash to the chunk's name.
    HashMismatch,
    /// The stored bytes do not decode (with the codec's complaint).
    Decode(String),
}

/// A missing row, by what names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    Inode(InodeId),
    Revision(RevisionId),
    History(HistoryId),
    /// A directory entry that the directory's listing (or a rename) names.
    Entry {
        dir: InodeId,
    },
    /// A counter or configuration key every space has.
    Key(String),
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::Chunk {
                hash,
                offset,
                damage: ChunkDamage::HashMismatch,
            } => write!(
                f,
                "chunk {hash} at data offset {} fails its blake3 check",
                offset.0
            ),
            Corruption::Chunk {
                hash,
                offset,
                damage: ChunkDamage::Decode(why),
            } => write!(
                f,
                "chunk {hash} at data offset {} does not decode ({why})",
                offset.0
            ),
            Corruption::UnknownChunk(h) => {
                write!(f, "an extent names chunk {h}, which the chunk table lacks")
            }
            Corruption::RefUnderflow(h) => write!(
                f,
                "chunk {h} has fewer references than extents name it (reference count underflow)"
            ),
            Corruption::Missing(m) => match m {
                Missing::Inode(i) => write!(f, "inode {} is missing from the inode table", i.0),
                Missing::Revision(r) => {
                    write!(f, "revision {} is missing from the revision table", r.0)
                }
                Missing::History(h) => write!(f, "history {h} is missing from the history table"),
                Missing::Entry { dir } => write!(
                    f,
                    "an entry the listing of directory inode {} names is missing",
                    dir.0
                ),
                Missing::Key(k) => write!(f, "the metadata table lacks its {k} entry"),
            },
            Corruption::Record { record, why } => write!(f, "a {record} is malformed: {why}"),
            Corruption::Superblock(why) => write!(f, "the superblock is damaged: {why}"),
            Corruption::Catalog(why) => write!(f, "the metadata table (meta.redb) {why}"),
            Corruption::Layout(why) => write!(f, "{why}"),
        }
    }
}

impl From<Corruption> for Error {
    fn from(c: Corruption) -> Self {
        Error::Corrupt(c)
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        // A device's fault that crossed redb's storage trait (`catalog::MetaBackend`, which
        // must speak `io::Error`) comes back typed: that trait is the one place a `Fault`
        // rides as an `io::Error`'s payload.
        if e.get_ref().is_some_and(|x| x.is::<Fault>()) {
            let inner = e.into_inner().expect("checked above");
            let fault = *inner.downcast::<Fault>().expect("checked above");
            return fault.into();
        }
        if e.raw_os_error() == Some(libc::ENOSPC) {
            Error::NoSpace
        } else {
            Error::Io(e)
        }
    }
}

/// Why a device (`device::Device`) or a placement (`placement::Placement`) could not do
/// what it was asked: the error type of both traits. Typed, so the callers that decide on
/// it read a kind, not a sentence: a fenced write was refused by this node, not failed by
/// the storage (an erasure-coded placement must not count it against a target, and the
/// engine reports it as `Error::Fenced`); the targets' faults map to errnos by kind.
#[derive(Debug)]
pub enum Fault {
    /// The operating system's error (ENOSPC, EIO, ...).
    Os(io::Error),
    /// This node may no longer write the space (`slots::Lease::permit`); the reason.
    Fenced(String),
    /// An erasure-coded placement could not serve the request.
    Targets(TargetFault),
}

/// The result of a device or placement operation.
pub type DevResult<T> = std::result::Result<T, Fault>;

impl Fault {
    /// The errno of an operating system's error.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Fault::Os(e) => e.raw_os_error(),
            _ => None,
        }
    }

    /// The kind of an operating system's error; `Other` for the typed faults.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            Fault::Os(e) => e.kind(),
            _ => io::ErrorKind::Other,
        }
    }

    /// A write this node's fencing refused: not the storage's failure, never counted
    /// against a target.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Fault::Fenced(_))
    }

    /// The fault as an `io::Error`, for redb's storage trait only (`catalog::MetaBackend`):
    /// an OS error as itself, a typed fault as the payload `Error::from` takes back out.
    pub(crate) fn into_io(self) -> io::Error {
        match self {
            Fault::Os(e) => e,
            other => io::Error::other(other),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Os(e) => write!(f, "{e}"),
            Fault::Fenced(why) => f.write_str(why),
            Fault::Targets(t) => write!(f, "{t}"),
        }
    }
}

impl std::error::Error for Fault {}

impl From<io::Error> for Fault {
    fn from(e: io::Error) -> Fault {
        Fault::Os(e)
    }
}

impl From<TargetFault> for Fault {
    fn from(t: TargetFault) -> Fault {
        Fault::Targets(t)
    }
}

impl From<Fault> for Error {
    fn from(f: Fault) -> Error {
        match f {
            Fault::Os(e) => e.into(),
            Fault::Fenced(why) => Error::Fenced(why),
            Fault::Targets(t) => Error::Targets(t),
        }
    }
}

/// Why an erasure-coded placement could not serve a read, a write or a placement
/// (`Fault::Targets`, then `Error::Targets`), so the errno map decides on each kind
/// instead of on a sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetFault {
    /// Fewer than `needed` shards of a segment's rows could be read and verified: its data
    /// there is unreadable until enough targets come back.
    Unreadable {
        segment: u64,
        readable: usize,
        needed: usize,
    },
    /// Fewer than `needed` shards of a write reached their targets (or, at a sync, are
    /// still on healthy targets): the write did not happen durably.
    Unwritable {
        segment: u64,
        written: usize,
        needed: usize,
    },
    /// Fewer healthy targets in distinct failure domains have a free shard slot than a
    /// segment's data shards: no new segment can be placed until targets are replaced (or
    /// gc frees placed segments).
    TooFewTargets { usable: usize, needed: usize },
    /// Fewer targets than a segment's data shards could be opened: the space cannot be read.
    TooFewOpen {
        usable: usize,
        total: usize,
        needed: usize,
    },
    /// A repair's write went to a target that failed (before or during it).
    TargetFailed { target: u16, why: String },
    /// The segment was never placed (a read of data never written, or a lost record).
    Unplaced { segment: u64 },
    /// The placement records contradict the space (a damaged placement file or targets
    /// table); `why` says how.
    BadPlacement { segment: Option<u64>, why: String },
    /// A write or placement of another slot's segment: a node writes only its own (a bug
    /// in the caller if it is ever seen).
    Foreign { segment: u64 },
    /// A write that is not whole rows (a bug in the caller if it is ever seen).
    Misaligned {
        segment: u64,
        offset: u64,
        len: usize,
    },
    /// The Reed-Solomon codec refused shards it was given (its complaint).
    Codec(String),
}

impl fmt::Display for TargetFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetFault::Unreadable {
                segment,
                readable,
                needed,
            } => write!(
                f,
                "segment {segment}: only {readable} of its shards are readable, {needed} are needed"
            ),
            TargetFault::Unwritable {
                segment,
                written,
                needed,
            } => write!(
                f,
                "segment {segment}: only {written} of its shards are written on healthy \
                 targets, {needed} are needed"
            ),
            TargetFault::TooFewTargets { usable, needed } => write!(
                f,
                "only {usable} healthy targets in distinct failure domains have room, a segment \
                 needs at least {needed} (its data shards); replace the failed ones with \
                 `ckptfs rebuild --replace OLD=NEW`"
            ),
            TargetFault::TooFewOpen {
                usable,
                total,
                needed,
            } => write!(
                f,
                "only {usable} of the {total} targets can be opened, and reading anything \
                 needs {needed}; see the log for why each failed"
            ),
            TargetFault::TargetFailed { target, why } => write!(f, "target {target}: {why}"),
            TargetFault::Unplaced { segment } => {
                write!(f, "segment {segment} was never placed on the targets")
            }
            TargetFault::BadPlacement {
                segment: Some(s),
                why,
            } => write!(f, "the placement of segment {s} {why}"),
            TargetFault::BadPlacement { segment: None, why } => {
                write!(f, "the placement file {why}")
            }
            TargetFault::Foreign { segment } => write!(
                f,
                "segment {segment} is another slot's; this node writes and places only its own"
            ),
            TargetFault::Misaligned {
                segment,
                offset,
                len,
            } => write!(
                f,
                "a write of {len} bytes at {offset} of segment {segment} is not whole rows"
            ),
            TargetFault::Codec(why) => write!(f, "Reed-Solomon: {why}"),
        }
    }
}

impl std::error::Error for TargetFault {}

macro_rules! meta_err {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                match e.into() {
                    redb::Error::Io(io) => Error::from(io),
                    // A page that fails its checksum or a tree that contradicts itself: the
                    // table is damaged (EIO, `ckptfs check` says so and exits CORRUPT), not a
                    // passing failure of the library.
                    redb::Error::Corrupted(why) => {
                        Corruption::Catalog(format!("is damaged: {why}")).into()
                    }
                    redb::Error::ValueTooLarge(n) => Error::Meta(MetaFault::TooLarge(n)),
                    // Another process has the table open: the space is in use, as its lock
                    // file would have said (exit status IN_USE, EBUSY).
                    redb::Error::DatabaseAlreadyOpen => Error::Locked(
                        "another process has this space's metadata table open".into(),
                    ),
                    other => Error::Meta(MetaFault::Other(other.to_string())),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What redb finds damaged is corruption the callers act on (EIO, `ckptfs check`'s
    /// exit status), not a string; its other failures stay metadata errors.
    #[test]
    fn a_damaged_table_is_corruption_and_other_table_errors_are_not() {
        let e = Error::from(redb::StorageError::Corrupted("bad page".into()));
        assert!(
            matches!(&e, Error::Corrupt(Corruption::Catalog(why)) if why.contains("bad page")),
            "{e:?}"
        );
        let e = Error::from(redb::StorageError::ValueTooLarge(1 << 40));
        assert!(
            matches!(e, Error::Meta(MetaFault::TooLarge(n)) if n == 1 << 40),
            "{e:?}"
        );
        let e = Error::from(redb::DatabaseError::DatabaseAlreadyOpen);
        assert!(matches!(e, Error::Locked(_)), "{e:?}");
        let e = Error::from(redb::TransactionError::WouldBlock);
        assert!(matches!(e, Error::Meta(MetaFault::Other(_))), "{e:?}");
        let e = Error::from(redb::StorageError::Io(io::Error::from_raw_os_error(
            libc::EIO,
        )));
        assert!(matches!(e, Error::Io(_)), "{e:?}");
    }
}
