//! The catalog: the metadata table (redb), typed. The only module that opens a redb table:
//! everything above it reads through a [`Reader`] (one snapshot) and changes through a
//! [`Txn`] (one write transaction), with typed keys and values, and chunk reference counts
//! kept by one helper that reports an underflow as corruption. Values are the byte
//! encodings from `format`; redb provides atomic, crash-safe commits.
//!
//! `ckptfs check` is the one reader that must see rows that do not decode (to report them):
//! it gets the raw tables of a snapshot from [`Reader::raw`].

use crate::advice::AdviceConfig;
use crate::device::Device;
use crate::error::{Corruption, Error, Missing, Result};
use crate::format::{
    decode_xattrs, encode_xattrs, Binding, ChunkHash, ChunkRecord, DataOffset, Extent, HistoryId,
    HistoryRecord, InodeId, InodeRecord, NodeKind, RevisionId, RevisionRecord, SegmentId,
    Timestamp, VersionMeta, Xattrs,
};
use parking_lot::Mutex;
use redb::{
    Database, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, WriteTransaction,
};
use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

/// The table definitions. Public for tests that damage a space on purpose; product code
/// goes through `Reader` and `Txn`.
pub mod audit;
pub mod journal;
pub mod ns;

use journal::{Logged, TxnLog};

pub mod tables {
    use redb::TableDefinition;
    /// inode number -> InodeRecord
    pub(crate) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
    /// (parent inode, name) -> (child inode, readdir cookie)
    pub const DIRENTS: TableDefinition<(u64, &[u8]), (u64, u64)> = TableDefinition::new("dirents");
    /// (parent inode, readdir cookie) -> name; gives readdir a stable order and resume point.
    pub(crate) const DIRLIST: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("dirlist");
    /// revision -> RevisionRecord
    pub const REVISIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("revisions");
    /// (history, revision) -> (): the revisions of each history, oldest first
    pub(crate) const HISTORY_REVS: TableDefinition<(u64, u64), ()> =
        TableDefinition::new("history_revs");
    /// history -> HistoryRecord
    pub(crate) const HISTORIES: TableDefinition<u64, &[u8]> = TableDefinition::new("histories");
    /// segment index -> (): data-file segments holding no committed chunk
    pub const FREE: TableDefinition<u64, ()> = TableDefinition::new("free_segments");
    /// chunk hash -> (): chunks whose reference count reached zero, for gc to delete
    pub(crate) const GC_CANDIDATES: TableDefinition<&[u8], ()> =
        TableDefinition::new("gc_candidates");
    /// retention policy and gc settings (see `Config`)
    pub(crate) const CONFIG: TableDefinition<&str, u64> = TableDefinition::new("config");
    /// (revision, file offset) -> Extent
    pub const EXTENTS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("extents");
    /// chunk hash -> ChunkRecord
    pub const CHUNKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("chunks");
    /// named counters: next_ino, next_rev, next_cookie, next_history
    pub(crate) const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
    /// (inode, name) -> value: the extended attributes of live inodes
    pub const XATTRS: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("xattrs");
    /// revision -> its file's extended attributes when it was committed
    /// (`format::encode_xattrs`); no row when the file had none
    pub const REV_XATTRS: TableDefinition<u64, &[u8]> = TableDefinition::new("revision_xattrs");
    /// path -> time (12 bytes): names this slot removed that other slots publish (a slot
    /// of a multi-slot space; created at the first such removal)
    pub(crate) const WHITEOUTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("whiteouts");
    /// `(parent, name)` -> `Binding` (24 bytes): this slot's records of the shared
    /// namespace's entries (a slot of a shared namespace; made with the slot's table).
    pub(crate) const BINDINGS: TableDefinition<(u64, &[u8]), &[u8]> =
        TableDefinition::new("bindings");
    /// local inode -> `VersionMeta` (48 bytes): which object each local inode is a version
    /// of (a slot of a shared namespace).
    pub(crate) const VERSIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("versions");
    /// The shared namespace's clock: the highest stamp this slot has used.
    pub(crate) const NS_STAMP: &str = "ns_stamp";
}

use tables::*;

pub(crate) const NEXT_INO: &str = "next_ino";
pub(crate) const NEXT_REV: &str = "next_rev";
pub(crate) const NEXT_COOKIE: &str = "next_cookie";
pub(crate) const NEXT_HISTORY: &str = "next_history";
/// readdir cookies 1 and 2 are "." and ".."; entries start after them.
pub(crate) const FIRST_COOKIE: u64 = 3;

/// Retention policy and gc settings, kept in the metadata table (`ckptfs config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Newest complete revisions kept per path (the current one always counts).
    pub keep_revisions: u64,
    /// Revisions younger than this are kept too; 0 = off.
    pub keep_age_secs: u64,
    /// How long the revisions of an unlinked path are kept.
    pub keep_unlinked_secs: u64,
    /// The daemon runs gc when free space falls below this percentage; 0 = off.
    pub auto_gc_free_percent: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            keep_revisions: 2,
            keep_age_secs: 0,
            keep_unlinked_secs: 7 * 24 * 3600,
            auto_gc_free_percent: 20,
        }
    }
}

impl Config {
    const KEYS: [&'static str; 4] = [
        "keep_revisions",
        "keep_age_secs",
        "keep_unlinked_secs",
        "auto_gc_free_percent",
    ];

    fn values(&self) -> [u64; 4] {
        [
            self.keep_revisions,
            self.keep_age_secs,
            self.keep_unlinked_secs,
            self.auto_gc_free_percent,
        ]
    }

    pub fn validate(&self) -> Result<()> {
        if self.keep_revisions == 0 {
            return Err(Error::Invalid(
                "keep-revisions must be at least 1 (the current revision)".into(),
            ));
        }
        if self.auto_gc_free_percent > 90 {
            return Err(Error::Invalid(
                "auto-gc-free-percent must be 0 to 90".into(),
            ));
        }
        Ok(())
    }

    fn write(&self, t: &mut Logged<'_, &'static str, u64>) -> Result<()> {
        self.validate()?;
        for (k, v) in Self::KEYS.iter().zip(self.values()) {
            t.insert(*k, v)?;
        }
        Ok(())
    }

    fn read(t: &impl ReadableTable<&'static str, u64>) -> Result<Self> {
        let get = |k: &str| -> Result<u64> {
            t.get(k)?
                .map(|v| v.value())
                .ok_or_else(|| Corruption::Missing(Missing::Key(format!("config key {k}"))).into())
        };
        Ok(Config {
            keep_revisions: get("keep_revisions")?,
            keep_age_secs: get("keep_age_secs")?,
            keep_unlinked_secs: get("keep_unlinked_secs")?,
            auto_gc_free_percent: get("auto_gc_free_percent")?,
        })
    }
}

/// The failure model of `ckptfs advise`: optional config keys (absent in older spaces,
/// which older builds ignore), 0 when not given.
const ADVICE_KEYS: [&str; 3] = [
    "advice_node_mtbf_secs",
    "advice_nodes",
    "advice_restart_secs",
];

fn read_advice(t: &impl ReadableTable<&'static str, u64>) -> Result<AdviceConfig> {
    let get = |k: &str| -> Result<u64> { Ok(t.get(k)?.map_or(0, |v| v.value())) };
    Ok(AdviceConfig {
        node_mtbf_secs: get(ADVICE_KEYS[0])?,
        nodes: get(ADVICE_KEYS[1])?,
        restart_secs: get(ADVICE_KEYS[2])?,
    })
}

/// Every table, created empty (format), or added where an older build's space lacks it.
pub(crate) fn create_tables(txn: &WriteTransaction) -> Result<()> {
    txn.open_table(INODES)?;
    txn.open_table(DIRENTS)?;
    txn.open_table(DIRLIST)?;
    txn.open_table(REVISIONS)?;
    txn.open_table(HISTORY_REVS)?;
    txn.open_table(HISTORIES)?;
    txn.open_table(FREE)?;
    txn.open_table(GC_CANDIDATES)?;
    txn.open_table(CONFIG)?;
    txn.open_table(EXTENTS)?;
    txn.open_table(CHUNKS)?;
    txn.open_table(COUNTERS)?;
    txn.open_table(XATTRS)?;
    txn.open_table(REV_XATTRS)?;
    Ok(())
}

/// Adds the tables later builds introduced (`xattrs`, `revision_xattrs`: see FORMAT.md's
/// version log) to a space made by an earlier one; returns whether any was missing. Writes
/// the table only then, so opening an up-to-date space changes nothing.
pub(crate) fn add_missing_tables(db: &Database) -> Result<bool> {
    let exists = |r: std::result::Result<_, redb::TableError>| match r {
        Ok(_) => Ok(true),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
        Err(e) => Err(Error::from(e)),
    };
    let complete = {
        let txn = db.begin_read()?;
        exists(txn.open_table(XATTRS).map(drop))? && exists(txn.open_table(REV_XATTRS).map(drop))?
    };
    if !complete {
        let mut txn = db.begin_write()?;
        txn.set_two_phase_commit(true);
        txn.open_table(XATTRS)?;
        txn.open_table(REV_XATTRS)?;
        txn.commit()?;
    }
    Ok(!complete)
}

fn hash_key(key: &[u8], what: &str) -> Result<ChunkHash> {
    Ok(ChunkHash(key.try_into().map_err(|_| {
        Error::from(Corruption::Record {
            record: "chunk table key",
            why: format!("the {what} key is not a chunk hash"),
        })
    })?))
}

fn get_chunk(
    t: &impl ReadableTable<&'static [u8], &'static [u8]>,
    h: &ChunkHash,
) -> Result<Option<ChunkRecord>> {
    t.get(h.0.as_slice())?
        .map(|v| ChunkRecord::decode(v.value()))
        .transpose()
}

fn extents_of(
    t: &impl ReadableTable<(u64, u64), &'static [u8]>,
    rev: RevisionId,
) -> Result<Vec<(u64, Extent)>> {
    let mut out = Vec::new();
    for item in t.range((rev.0, 0)..=(rev.0, u64::MAX))? {
        let (k, v) = item?;
        out.push((k.value().1, Extent::decode(v.value())?));
    }
    Ok(out)
}

fn revisions_of(t: &impl ReadableTable<(u64, u64), ()>, hid: HistoryId) -> Result<Vec<RevisionId>> {
    Ok(t.range((hid.0, 0)..=(hid.0, u64::MAX))?
        .map(|r| r.map(|(k, _)| RevisionId(k.value().1)))
        .collect::<std::result::Result<_, _>>()?)
}

/// Every chunk record of `t`; `remote`: those held only by the object-store tier too.
fn for_each_chunk_in(
    t: &impl ReadableTable<&'static [u8], &'static [u8]>,
    remote: bool,
    mut f: impl FnMut(ChunkHash, ChunkRecord) -> Result<()>,
) -> Result<()> {
    for item in t.iter()? {
        let (k, v) = item?;
        let rec = ChunkRecord::decode(v.value())?;
        if remote || !rec.is_remote() {
            f(hash_key(k.value(), "chunk")?, rec)?;
        }
    }
    Ok(())
}

fn dead_inodes_in(
    t: &impl ReadableTable<u64, &'static [u8]>,
    open: impl Fn(InodeId) -> bool,
) -> Result<Vec<InodeId>> {
    let mut dead = Vec::new();
    for item in t.iter()? {
        let (k, v) = item?;
        let rec = InodeRecord::decode(v.value())?;
        let ino = InodeId(k.value());
        if rec.nlink == 0 && !open(ino) {
            dead.push(ino);
        }
    }
    Ok(dead)
}

fn free_segments_in(t: &impl ReadableTable<u64, ()>) -> Result<BTreeSet<SegmentId>> {
    let mut free = BTreeSet::new();
    for item in t.iter()? {
        free.insert(SegmentId(item?.0.value()));
    }
    Ok(free)
}

fn get_inode(
    t: &impl ReadableTable<u64, &'static [u8]>,
    ino: InodeId,
) -> Result<Option<InodeRecord>> {
    match t.get(ino.0)? {
        Some(v) => Ok(Some(InodeRecord::decode(v.value())?)),
        None => Ok(None),
    }
}

fn lookup(
    t: &impl ReadableTable<(u64, &'static [u8]), (u64, u64)>,
    parent: InodeId,
    name: &[u8],
) -> Result<Option<InodeId>> {
    Ok(t.get((parent.0, name))?.map(|v| InodeId(v.value().0)))
}

fn counter(t: &impl ReadableTable<&'static str, u64>, name: &str) -> Result<u64> {
    t.get(name)?
        .map(|v| v.value())
        .ok_or_else(|| Corruption::Missing(Missing::Key(format!("counter {name}"))).into())
}

/// The extended attributes of `ino`.
fn xattrs_of(
    t: &impl ReadableTable<(u64, &'static [u8]), &'static [u8]>,
    ino: InodeId,
) -> Result<Xattrs> {
    let mut x = Xattrs::new();
    for item in t.range((ino.0, &b""[..])..(ino.0 + 1, &b""[..]))? {
        let (k, v) = item?;
        x.insert(k.value().1.to_vec(), v.value().to_vec());
    }
    Ok(x)
}

/// What revision `rev` recorded of its file's extended attributes.
fn revision_xattrs(t: &impl ReadableTable<u64, &'static [u8]>, rev: RevisionId) -> Result<Xattrs> {
    match t.get(rev.0)? {
        Some(v) => decode_xattrs(v.value()),
        None => Ok(Xattrs::new()),
    }
}

/// Records the extended attributes of `ino` as those of revision `rev` (no row if none).
fn record_revision_xattrs(
    xattrs: &impl ReadableTable<(u64, &'static [u8]), &'static [u8]>,
    rev_xattrs: &mut Logged<'_, u64, &'static [u8]>,
    ino: InodeId,
    rev: RevisionId,
) -> Result<()> {
    let x = xattrs_of(xattrs, ino)?;
    if !x.is_empty() {
        rev_xattrs.insert(rev.0, encode_xattrs(&x).as_slice())?;
    }
    Ok(())
}

/// Removes every extended attribute of `ino` (an inode being deleted).
fn clear_xattrs(
    xattrs: &mut Logged<'_, (u64, &'static [u8]), &'static [u8]>,
    ino: InodeId,
) -> Result<()> {
    let names: Vec<Vec<u8>> = xattrs_of(xattrs.table()?, ino)?.into_keys().collect();
    for n in names {
        xattrs.remove((ino.0, n.as_slice()))?;
    }
    Ok(())
}

/// One directory entry as listed by readdir.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub cookie: u64,
    pub name: Vec<u8>,
    pub ino: InodeId,
}

/// Entries of `dir` with cookies greater than `after`, at most `limit` of them.
fn list_dir(
    dirlist: &impl ReadableTable<(u64, u64), &'static [u8]>,
    dirents: &impl ReadableTable<(u64, &'static [u8]), (u64, u64)>,
    dir: InodeId,
    after: u64,
    limit: usize,
) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    for item in dirlist.range((dir.0, after + 1)..(dir.0, u64::MAX))? {
        let (k, v) = item?;
        let name = v.value().to_vec();
        let ino =
            lookup(dirents, dir, &name)?.ok_or(Corruption::Missing(Missing::Entry { dir }))?;
        out.push(DirEntry {
            cookie: k.value().1,
            name,
            ino,
        });
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// Every table, opened in one write transaction: the one way to change the catalog. The
/// fields stay private; each change is a method, so the rules (reference counts, readdir
/// cookies, history membership) live in one place.
pub struct Txn<'t> {
    wtxn: &'t WriteTransaction,
    /// Where the changes are recorded for the journal (None: the space has none).
    log: Option<&'t Mutex<TxnLog>>,
    inodes: Logged<'t, u64, &'static [u8]>,
    dirents: Logged<'t, (u64, &'static [u8]), (u64, u64)>,
    dirlist: Logged<'t, (u64, u64), &'static [u8]>,
    counters: Logged<'t, &'static str, u64>,
    histories: Logged<'t, u64, &'static [u8]>,
    revisions: Logged<'t, u64, &'static [u8]>,
    history_revs: Logged<'t, (u64, u64), ()>,
    extents: Logged<'t, (u64, u64), &'static [u8]>,
    chunks: Logged<'t, &'static [u8], &'static [u8]>,
    candidates: Logged<'t, &'static [u8], ()>,
    free: Logged<'t, u64, ()>,
    config: Logged<'t, &'static str, u64>,
    xattrs: Logged<'t, (u64, &'static [u8]), &'static [u8]>,
    rev_xattrs: Logged<'t, u64, &'static [u8]>,
}

impl<'t> Txn<'t> {
    pub fn open(txn: &'t WriteTxn) -> Result<Txn<'t>> {
        Self::on(&txn.txn, txn.journaled.then_some(&txn.log))
    }

    /// `open` on a redb transaction, recording its changes in `log` if given (the
    /// catalog's own: `init`, its tests).
    fn on(txn: &'t WriteTransaction, log: Option<&'t Mutex<TxnLog>>) -> Result<Txn<'t>> {
        Ok(Txn {
            wtxn: txn,
            log,
            inodes: Logged::open(txn, log, INODES)?,
            dirents: Logged::open(txn, log, DIRENTS)?,
            dirlist: Logged::open(txn, log, DIRLIST)?,
            counters: Logged::open(txn, log, COUNTERS)?,
            histories: Logged::open(txn, log, HISTORIES)?,
            revisions: Logged::open(txn, log, REVISIONS)?,
            history_revs: Logged::open(txn, log, HISTORY_REVS)?,
            extents: Logged::open(txn, log, EXTENTS)?,
            chunks: Logged::open(txn, log, CHUNKS)?,
            candidates: Logged::open(txn, log, GC_CANDIDATES)?,
            free: Logged::open(txn, log, FREE)?,
            config: Logged::open(txn, log, CONFIG)?,
            xattrs: Logged::open(txn, log, XATTRS)?,
            rev_xattrs: Logged::open(txn, log, REV_XATTRS)?,
        })
    }

    /// A table only some spaces have (a shared namespace's), opened in this transaction
    /// and recorded like the others.
    fn extra<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<'static, K, V>,
    ) -> Result<Logged<'t, K, V>> {
        Logged::open(self.wtxn, self.log, def)
    }

    /// An empty space's (or slot's) first rows: the root directory, the counters, `config`,
    /// and every one of its `segments` free.
    pub fn init(
        &mut self,
        root: &InodeRecord,
        config: &Config,
        segments: std::ops::Range<u64>,
    ) -> Result<()> {
        self.put_inode(InodeId::ROOT, root)?;
        self.counters.insert(NEXT_INO, 2)?;
        self.counters.insert(NEXT_REV, 1)?;
        self.counters.insert(NEXT_COOKIE, FIRST_COOKIE)?;
        self.counters.insert(NEXT_HISTORY, 1)?;
        config.write(&mut self.config)?;
        for seg in segments {
            self.free.insert(seg, ())?;
        }
        Ok(())
    }

    pub fn set_config(&mut self, c: &Config) -> Result<()> {
        c.write(&mut self.config)
    }

    pub fn set_advice_config(&mut self, c: &AdviceConfig) -> Result<()> {
        for (k, v) in ADVICE_KEYS
            .iter()
            .zip([c.node_mtbf_secs, c.nodes, c.restart_secs])
        {
            self.config.insert(*k, v)?;
        }
        Ok(())
    }

    pub fn config(&self) -> Result<Config> {
        Config::read(self.config.table()?)
    }

    /// Segments the data file writer took: no longer free.
    pub(crate) fn mark_taken(&mut self, segs: &[SegmentId]) -> Result<()> {
        for s in segs {
            self.free.remove(s.0)?;
        }
        Ok(())
    }

    /// Segments gc emptied. With a journal the transaction becomes a checkpoint
    /// (`journal::TxnLog::frees`).
    pub(crate) fn mark_free(&mut self, segs: &[SegmentId]) -> Result<()> {
        if let (Some(l), false) = (self.log, segs.is_empty()) {
            l.lock().frees = true;
        }
        for s in segs {
            self.free.insert(s.0, ())?;
        }
        Ok(())
    }

    pub fn chunk(&self, h: &ChunkHash) -> Result<Option<ChunkRecord>> {
        get_chunk(self.chunks.table()?, h)
    }

    /// One more reference to chunk `h`: a committed chunk gains one; a chunk the table does
    /// not have yet is added with `new` (its record as stored, from the store's pending
    /// chunks) and one reference. Returns whether the chunk was new.
    pub(crate) fn add_chunk_ref(
        &mut self,
        h: &ChunkHash,
        new: impl FnOnce() -> Option<ChunkRecord>,
    ) -> Result<bool> {
        self.add_chunk_refs(h, 1, new)
    }

    /// `add_chunk_ref` `n` times, with one read and one write of the chunk's record.
    fn add_chunk_refs(
        &mut self,
        h: &ChunkHash,
        n: u64,
        new: impl FnOnce() -> Option<ChunkRecord>,
    ) -> Result<bool> {
        let (rec, added) = match self.chunk(h)? {
            Some(r) => (
                ChunkRecord {
                    refs: r.refs + n,
                    ..r
                },
                false,
            ),
            None => {
                let r = new().ok_or(Corruption::UnknownChunk(*h))?;
                self.note_new_chunk(&r);
                (ChunkRecord { refs: n, ..r }, true)
            }
        };
        self.chunks
            .insert(h.0.as_slice(), rec.encode().as_slice())?;
        Ok(added)
    }

    /// Records chunks held only by the object-store tier (`DataOffset::REMOTE`), with no
    /// reference yet and queued for gc, so one no extent comes to name is dropped again;
    /// a file state pins them (`pin_stored`) before it names them. A chunk the table has
    /// already is left as it is. Returns how many were added.
    pub fn add_remote_chunks(&mut self, chunks: &[(ChunkHash, ChunkRecord)]) -> Result<u64> {
        let mut added = 0;
        for (h, rec) in chunks {
            if self.chunk(h)?.is_some() {
                continue;
            }
            let rec = ChunkRecord {
                offset: DataOffset::REMOTE,
                refs: 0,
                ..*rec
            };
            self.chunks
                .insert(h.0.as_slice(), rec.encode().as_slice())?;
            self.candidates.insert(h.0.as_slice(), ())?;
            added += 1;
        }
        Ok(added)
    }

    /// One reference fewer to chunk `h`; at zero the chunk becomes a gc candidate. A count
    /// that would go below zero, or a chunk the table does not have, is corruption (an
    /// extent named a chunk more often than counted), reported instead of hidden.
    fn drop_chunk_ref(&mut self, h: &ChunkHash) -> Result<()> {
        self.drop_chunk_refs(h, 1)
    }

    /// `drop_chunk_ref` `n` times, with one read and one write of the chunk's record.
    fn drop_chunk_refs(&mut self, h: &ChunkHash, n: u64) -> Result<()> {
        let c = self.chunk(h)?.ok_or(Corruption::UnknownChunk(*h))?;
        let refs = c.refs.checked_sub(n).ok_or(Corruption::RefUnderflow(*h))?;
        let c = ChunkRecord { refs, ..c };
        self.chunks.insert(h.0.as_slice(), c.encode().as_slice())?;
        if refs == 0 {
            self.candidates.insert(h.0.as_slice(), ())?;
        }
        Ok(())
    }

    /// A chunk whose bytes this transaction's record must carry or wait for (`journal`):
    /// one new to the table, or moved.
    fn note_new_chunk(&self, c: &ChunkRecord) {
        // A chunk held only by the object-store tier has no bytes here to carry.
        if c.is_remote() {
            return;
        }
        if let Some(l) = self.log {
            l.lock().new_chunks.push((c.offset.0, c.stored_len));
        }
    }

    /// Points chunk `h` at `new` if it still lies at `old` (gc moved it; a chunk deleted or
    /// moved meanwhile is left alone). Returns whether it was moved.
    pub(crate) fn move_chunk(
        &mut self,
        h: &ChunkHash,
        old: DataOffset,
        new: DataOffset,
    ) -> Result<bool> {
        match self.chunk(h)? {
            Some(c) if c.offset == old => {
                let c = ChunkRecord { offset: new, ..c };
                self.note_new_chunk(&c);
                self.chunks.insert(h.0.as_slice(), c.encode().as_slice())?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Deletes the chunks whose reference count reached zero, except those `keep` says are
    /// still pinned (a dedup hit of a file not yet committed: if it commits, the chunk gains
    /// a reference; if not, a later gc deletes it), which stay queued. `each` sees every
    /// candidate handled (for progress). Returns (chunks deleted, their stored bytes).
    pub(crate) fn delete_dead_chunks(
        &mut self,
        keep: impl Fn(&ChunkHash) -> bool,
        mut each: impl FnMut(u64, u64),
    ) -> Result<(u64, u64)> {
        let total = self.candidates.table()?.len()?;
        let (mut done, mut freed, mut bytes) = (0u64, 0u64, 0u64);
        let mut still_pinned = Vec::new();
        loop {
            let popped = self.candidates.pop_first_key()?;
            let Some(key) = popped else {
                break;
            };
            let h = hash_key(&key, "gc candidate")?;
            done += 1;
            each(done, total);
            let Some(rec) = self.chunk(&h)? else {
                continue;
            };
            if rec.refs == 0 {
                if keep(&h) {
                    still_pinned.push(h);
                } else {
                    self.chunks.remove(h.0.as_slice())?;
                    freed += 1;
                    // Held only by the object store: no byte of the data file freed.
                    if !rec.is_remote() {
                        bytes += rec.stored_len as u64;
                    }
                }
            }
        }
        for h in still_pinned {
            self.candidates.insert(h.0.as_slice(), ())?;
        }
        Ok((freed, bytes))
    }

    pub(crate) fn next_revision_id(&mut self) -> Result<RevisionId> {
        let rev = counter(self.counters.table()?, NEXT_REV)?;
        self.counters.insert(NEXT_REV, rev + 1)?;
        Ok(RevisionId(rev))
    }

    /// Records revision `rev` of history `rr.history` with extents `map`, taking one chunk
    /// reference per extent (`new` gives the record of a chunk not in the table yet), and
    /// the current extended attributes of `ino`. Returns the stored bytes of the chunks
    /// this revision added to the table.
    pub(crate) fn put_revision<'m>(
        &mut self,
        rev: RevisionId,
        rr: &RevisionRecord,
        map: impl Iterator<Item = (u64, &'m Extent)>,
        ino: InodeId,
        new: impl Fn(&ChunkHash) -> Option<ChunkRecord>,
    ) -> Result<u64> {
        self.write_revision(None, rev, rr, map, ino, new)
    }

    /// `drop_revision(prev)` then `put_revision(rev, ..)`, with each chunk's reference
    /// count changed once, by the difference between the two maps. An unsealed revision (an
    /// fsync point; with N-1, every close while other handles still write the file) is
    /// replaced at each such commit, and dropping then adding a reference per extent of the
    /// whole file made every commit cost two updates of the hash-keyed chunk table per
    /// extent: about 137 ms per close of a 1 GiB file of 64 KiB chunks, serialized on the
    /// file. Reference counts, gc candidates and the new bytes end as the two calls leave
    /// them, except that a chunk both maps name is not queued for gc on the way.
    pub(crate) fn replace_revision<'m>(
        &mut self,
        prev: RevisionId,
        rev: RevisionId,
        rr: &RevisionRecord,
        map: impl Iterator<Item = (u64, &'m Extent)>,
        ino: InodeId,
        new: impl Fn(&ChunkHash) -> Option<ChunkRecord>,
    ) -> Result<u64> {
        self.write_revision(Some(prev), rev, rr, map, ino, new)
    }

    /// Writes revision `rev` (extents, record, history row, attributes) in place of `prev`
    /// if given, counting each chunk's references once with the net change; returns the
    /// stored bytes of the chunks new to the table.
    fn write_revision<'m>(
        &mut self,
        prev: Option<RevisionId>,
        rev: RevisionId,
        rr: &RevisionRecord,
        map: impl Iterator<Item = (u64, &'m Extent)>,
        ino: InodeId,
        new: impl Fn(&ChunkHash) -> Option<ChunkRecord>,
    ) -> Result<u64> {
        // Ordered, so the same commit makes the same table writes every time (the crash
        // tests replay a run's device operations exactly).
        let mut delta: std::collections::BTreeMap<ChunkHash, i64> = Default::default();
        if let Some(prev) = prev {
            if let Some(old) = get_revision(self.revisions.table()?, prev)? {
                for (off, e) in extents_of(self.extents.table()?, prev)? {
                    *delta.entry(e.chunk).or_default() -= 1;
                    self.extents.remove((prev.0, off))?;
                }
                self.remove_revision_rows(prev, &old)?;
            }
        }
        for (off, e) in map {
            self.extents.insert((rev.0, off), e.encode().as_slice())?;
            *delta.entry(e.chunk).or_default() += 1;
        }
        let mut new_bytes = 0u64;
        for (h, d) in delta {
            if d < 0 {
                self.drop_chunk_refs(&h, d.unsigned_abs())?;
            } else if d > 0 {
                let mut rec = None;
                if self.add_chunk_refs(&h, d as u64, || {
                    rec = new(&h);
                    rec
                })? {
                    new_bytes += rec.map_or(0, |r| r.stored_len as u64);
                }
            }
        }
        let rr = RevisionRecord {
            new_stored_bytes: new_bytes,
            ..*rr
        };
        self.revisions.insert(rev.0, rr.encode().as_slice())?;
        self.history_revs.insert((rr.history.0, rev.0), ())?;
        record_revision_xattrs(self.xattrs.table()?, &mut self.rev_xattrs, ino, rev)?;
        Ok(new_bytes)
    }

    /// A revision's record, history row and attributes (its extents are the caller's).
    fn remove_revision_rows(&mut self, rev: RevisionId, rr: &RevisionRecord) -> Result<()> {
        self.revisions.remove(rev.0)?;
        self.history_revs.remove((rr.history.0, rev.0))?;
        self.rev_xattrs.remove(rev.0)?;
        Ok(())
    }

    pub fn revision(&self, rev: RevisionId) -> Result<Option<RevisionRecord>> {
        get_revision(self.revisions.table()?, rev)
    }

    /// Marks revision `rev` complete; false if it was already (or does not exist).
    pub fn seal(&mut self, rev: RevisionId) -> Result<bool> {
        match get_revision(self.revisions.table()?, rev)? {
            Some(mut rr) if !rr.sealed => {
                rr.sealed = true;
                self.revisions.insert(rev.0, rr.encode().as_slice())?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Deletes a revision: its extents (dropping one chunk reference each), its record, its
    /// place in its history and its attributes. Chunks left with no reference stay until gc
    /// removes them.
    pub(crate) fn drop_revision(&mut self, rev: RevisionId) -> Result<()> {
        let Some(rr) = get_revision(self.revisions.table()?, rev)? else {
            return Ok(());
        };
        for (off, e) in extents_of(self.extents.table()?, rev)? {
            self.drop_chunk_ref(&e.chunk)?;
            self.extents.remove((rev.0, off))?;
        }
        self.remove_revision_rows(rev, &rr)
    }

    /// The history with the smallest id at or after `from`.
    pub(crate) fn history_from(
        &self,
        from: HistoryId,
    ) -> Result<Option<(HistoryId, HistoryRecord)>> {
        match self.histories.table()?.range(from.0..)?.next() {
            Some(item) => {
                let (k, v) = item?;
                Ok(Some((
                    HistoryId(k.value()),
                    HistoryRecord::decode(v.value())?,
                )))
            }
            None => Ok(None),
        }
    }

    pub(crate) fn remove_history(&mut self, hid: HistoryId) -> Result<()> {
        self.histories.remove(hid.0)?;
        Ok(())
    }

    /// Deletes inode `ino`, its extended attributes and (in a shared namespace) the record
    /// of what it is a version of.
    pub(crate) fn remove_inode(&mut self, ino: InodeId) -> Result<()> {
        self.inodes.remove(ino.0)?;
        if self.has_table("versions")? {
            self.extra(VERSIONS)?.remove(ino.0)?;
        }
        clear_xattrs(&mut self.xattrs, ino)
    }

    fn has_table(&self, name: &str) -> Result<bool> {
        Ok(self
            .wtxn
            .list_tables()?
            .any(|t| redb::TableHandle::name(&t) == name))
    }

    /// Makes the tables of a slot of a shared namespace (`bindings`, `versions`).
    pub(crate) fn create_shared_tables(&mut self) -> Result<()> {
        self.wtxn.open_table(BINDINGS)?;
        self.wtxn.open_table(VERSIONS)?;
        Ok(())
    }

    /// Sets this slot's record of the entry `(parent, name)`.
    pub fn put_binding(&mut self, parent: InodeId, name: &[u8], b: &Binding) -> Result<()> {
        self.extra(BINDINGS)?
            .insert((parent.0, name), b.encode().as_slice())?;
        Ok(())
    }

    /// Drops this slot's record of `(parent, name)` (superseded by another slot's).
    pub fn remove_binding(&mut self, parent: InodeId, name: &[u8]) -> Result<()> {
        self.extra(BINDINGS)?.remove((parent.0, name))?;
        Ok(())
    }

    pub fn binding(&self, parent: InodeId, name: &[u8]) -> Result<Option<Binding>> {
        self.wtxn
            .open_table(BINDINGS)?
            .get((parent.0, name))?
            .map(|v| Binding::decode(v.value()))
            .transpose()
    }

    pub fn put_version(&mut self, ino: InodeId, m: &VersionMeta) -> Result<()> {
        self.wtxn
            .open_table(VERSIONS)?
            .insert(ino.0, m.encode().as_slice())?;
        Ok(())
    }

    pub fn version(&self, ino: InodeId) -> Result<Option<VersionMeta>> {
        self.wtxn
            .open_table(VERSIONS)?
            .get(ino.0)?
            .map(|v| VersionMeta::decode(v.value()))
            .transpose()
    }

    /// The shared namespace's clock as last stored (0 before the first stamp).
    pub(crate) fn ns_stamp(&self) -> Result<u64> {
        Ok(self
            .counters
            .table()?
            .get(NS_STAMP)?
            .map_or(0, |v| v.value()))
    }

    pub fn set_ns_stamp(&mut self, stamp: u64) -> Result<()> {
        if stamp > self.ns_stamp()? {
            self.counters.insert(NS_STAMP, stamp)?;
        }
        Ok(())
    }

    /// Starts inode numbers at `next` (a slot's range of a shared namespace), if they are
    /// below it.
    pub(crate) fn set_ino_floor(&mut self, next: u64) -> Result<()> {
        if counter(self.counters.table()?, NEXT_INO)? < next {
            self.counters.insert(NEXT_INO, next)?;
        }
        Ok(())
    }

    pub fn get_inode(&self, ino: InodeId) -> Result<Option<InodeRecord>> {
        get_inode(self.inodes.table()?, ino)
    }

    /// The inode, or a corruption error: callers use it for inodes that must exist.
    pub fn inode(&self, ino: InodeId) -> Result<InodeRecord> {
        self.get_inode(ino)?
            .ok_or_else(|| Corruption::Missing(Missing::Inode(ino)).into())
    }

    pub fn put_inode(&mut self, ino: InodeId, rec: &InodeRecord) -> Result<()> {
        self.inodes.insert(ino.0, rec.encode().as_slice())?;
        Ok(())
    }

    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>> {
        lookup(self.dirents.table()?, parent, name)
    }

    pub fn alloc_ino(&mut self) -> Result<InodeId> {
        let n = counter(self.counters.table()?, NEXT_INO)?;
        self.counters.insert(NEXT_INO, n + 1)?;
        Ok(InodeId(n))
    }

    /// Adds the entry `name` -> `child` to `parent`, which must not have it yet.
    pub fn add_entry(&mut self, parent: InodeId, name: &[u8], child: InodeId) -> Result<()> {
        let cookie = counter(self.counters.table()?, NEXT_COOKIE)?;
        self.counters.insert(NEXT_COOKIE, cookie + 1)?;
        self.add_entry_at(parent, name, child, cookie)
    }

    /// `add_entry` with a cookie taken before (`reserve_ids`).
    pub(crate) fn add_entry_at(
        &mut self,
        parent: InodeId,
        name: &[u8],
        child: InodeId,
        cookie: u64,
    ) -> Result<()> {
        let old = self.dirents.insert((parent.0, name), (child.0, cookie))?;
        assert!(old.is_none(), "add_entry over an existing name");
        self.dirlist.insert((parent.0, cookie), name)?;
        Ok(())
    }

    /// Points the existing entry `name` of `parent` at `child`, keeping its readdir cookie:
    /// an exchange changes what a name refers to, not where the name sits in a listing.
    pub fn repoint_entry(&mut self, parent: InodeId, name: &[u8], child: InodeId) -> Result<()> {
        let (_, cookie) = self
            .dirents
            .table()?
            .get((parent.0, name))?
            .map(|v| v.value())
            .ok_or(Corruption::Missing(Missing::Entry { dir: parent }))?;
        self.dirents.insert((parent.0, name), (child.0, cookie))?;
        Ok(())
    }

    /// Moves the entry `name` of `parent` to `new_name` of `new_parent` (which must not
    /// exist). Within one directory the entry keeps its cookie, so a readdir pass running
    /// while files are renamed in place returns each entry once: a new cookie would put the
    /// renamed entry after the pass's position and list it a second time.
    pub fn move_entry(
        &mut self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
    ) -> Result<()> {
        if parent != new_parent {
            let child = self
                .remove_entry(parent, name)?
                .ok_or(Corruption::Missing(Missing::Entry { dir: parent }))?;
            return self.add_entry(new_parent, new_name, child);
        }
        let (child, cookie) = self
            .dirents
            .remove((parent.0, name))?
            .map(|v| v.value())
            .ok_or(Corruption::Missing(Missing::Entry { dir: parent }))?;
        let old = self.dirents.insert((parent.0, new_name), (child, cookie))?;
        assert!(old.is_none(), "move_entry over an existing name");
        self.dirlist.insert((parent.0, cookie), new_name)?;
        Ok(())
    }

    pub fn remove_entry(&mut self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>> {
        let Some((child, cookie)) = self.dirents.remove((parent.0, name))?.map(|v| v.value())
        else {
            return Ok(None);
        };
        self.dirlist.remove((parent.0, cookie))?;
        Ok(Some(InodeId(child)))
    }

    pub fn dir_is_empty(&self, dir: InodeId) -> Result<bool> {
        Ok(self
            .dirlist
            .table()?
            .range((dir.0, 0)..(dir.0, u64::MAX))?
            .next()
            .is_none())
    }

    /// Starts a new history owned by `ino`.
    pub fn new_history(&mut self, ino: InodeId) -> Result<HistoryId> {
        let hid = counter(self.counters.table()?, NEXT_HISTORY)?;
        self.counters.insert(NEXT_HISTORY, hid + 1)?;
        self.new_history_at(HistoryId(hid), ino)?;
        Ok(HistoryId(hid))
    }

    /// `new_history` with an id taken before (`reserve_ids`).
    pub(crate) fn new_history_at(&mut self, hid: HistoryId, ino: InodeId) -> Result<()> {
        let h = HistoryRecord {
            ino,
            unlinked: None,
            path: Vec::new(),
        };
        self.histories.insert(hid.0, h.encode().as_slice())?;
        Ok(())
    }

    /// Takes `n` inode numbers, history ids and readdir cookies at once, for the mount to
    /// hand out later without a transaction each (`space::deferred`): the first of each.
    /// Those it never uses are skipped, as a crash skips them.
    pub(crate) fn reserve_ids(&mut self, n: u64) -> Result<[u64; 3]> {
        let mut first = [0; 3];
        for (f, name) in first.iter_mut().zip([NEXT_INO, NEXT_HISTORY, NEXT_COOKIE]) {
            *f = counter(self.counters.table()?, name)?;
            self.counters.insert(name, *f + n)?;
        }
        Ok(first)
    }

    /// Marks a history as belonging to a path that no longer exists.
    pub fn retire_history(&mut self, hid: HistoryId, path: Vec<u8>, when: Timestamp) -> Result<()> {
        let mut h = get_history(self.histories.table()?, hid)?;
        h.unlinked = Some(when);
        h.path = path;
        self.histories.insert(hid.0, h.encode().as_slice())?;
        Ok(())
    }

    pub fn set_history_owner(&mut self, hid: HistoryId, ino: InodeId) -> Result<()> {
        let mut h = get_history(self.histories.table()?, hid)?;
        h.ino = ino;
        h.unlinked = None;
        h.path.clear();
        self.histories.insert(hid.0, h.encode().as_slice())?;
        Ok(())
    }

    /// The full path of the entry `name` in directory `parent`, from the root.
    pub fn path_of(&self, parent: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        let mut parts = vec![name.to_vec()];
        let mut dir = parent;
        while dir != InodeId::ROOT {
            let rec = self.inode(dir)?;
            parts.push(rec.target.clone());
            dir = rec.parent;
        }
        parts.reverse();
        Ok(parts.join(&b'/'))
    }

    /// The revisions of a history, oldest first (sealed or not).
    pub fn history_revisions(&self, hid: HistoryId) -> Result<Vec<RevisionId>> {
        revisions_of(self.history_revs.table()?, hid)
    }

    pub fn xattrs(&self, ino: InodeId) -> Result<Xattrs> {
        xattrs_of(self.xattrs.table()?, ino)
    }

    pub fn put_xattr(&mut self, ino: InodeId, name: &[u8], value: &[u8]) -> Result<()> {
        self.xattrs.insert((ino.0, name), value)?;
        Ok(())
    }

    /// Whether `ino` had the attribute.
    pub fn remove_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<bool> {
        Ok(self.xattrs.remove((ino.0, name))?.is_some())
    }

    /// Makes `x` the whole set of `ino`'s extended attributes.
    pub fn replace_xattrs(&mut self, ino: InodeId, x: &Xattrs) -> Result<()> {
        clear_xattrs(&mut self.xattrs, ino)?;
        for (n, v) in x {
            self.put_xattr(ino, n, v)?;
        }
        Ok(())
    }

    pub fn revision_xattrs(&self, rev: RevisionId) -> Result<Xattrs> {
        revision_xattrs(self.rev_xattrs.table()?, rev)
    }

    /// Adds a sealed revision to history `hid` with the content of revision `from`, taking a
    /// reference on each of its chunks. Used when a rename replaces a path's file.
    pub fn copy_revision(&mut self, from: RevisionId, hid: HistoryId) -> Result<RevisionId> {
        let src = get_revision(self.revisions.table()?, from)?
            .ok_or(Corruption::Missing(Missing::Revision(from)))?;
        let rev = counter(self.counters.table()?, NEXT_REV)?;
        self.counters.insert(NEXT_REV, rev + 1)?;
        let rows: Vec<(u64, Vec<u8>)> = self
            .extents
            .table()?
            .range((from.0, 0)..=(from.0, u64::MAX))?
            .map(|r| r.map(|(k, v)| (k.value().1, v.value().to_vec())))
            .collect::<std::result::Result<_, _>>()?;
        for (off, v) in rows {
            let e = Extent::decode(&v)?;
            self.add_chunk_ref(&e.chunk, || None)?;
            self.extents.insert((rev, off), v.as_slice())?;
        }
        let rr = RevisionRecord {
            committed: Timestamp::now(),
            new_stored_bytes: 0,
            sealed: true,
            history: hid,
            write_ms: 0,
            ..src
        };
        self.revisions.insert(rev, rr.encode().as_slice())?;
        self.history_revs.insert((hid.0, rev), ())?;
        let x = self
            .rev_xattrs
            .table()?
            .get(from.0)?
            .map(|v| v.value().to_vec());
        if let Some(x) = x {
            self.rev_xattrs.insert(rev, x.as_slice())?;
        }
        Ok(RevisionId(rev))
    }
}

/// The metadata table of a space: it alone begins write transactions, with the
/// durability policy every commit follows, and hands out read snapshots (`Reader`).
pub struct Catalog {
    db: std::sync::Arc<Database>,
    /// A non-durable commit (a namespace change) happened since the last durable one.
    durability: Mutex<Durability>,
    /// The journal a durable commit is made durable through (`journal`); None: every
    /// durable commit is one of redb's (a multi-slot space's slot).
    journal: Option<Arc<journal::Journal>>,
}

/// Which metadata commits are durable (without a journal). Write transactions run one at a
/// time (redb), so the one committing is a single field.
#[derive(Default)]
struct Durability {
    /// Non-durable commits made (counted before each commits, while it holds the writer).
    nondurable: u64,
    /// The count of non-durable commits made durable by the last durable commit.
    durable_upto: u64,
    /// Durable transactions committed (with a journal: checkpoints):
    /// `Stats::commits.durable`, with the journal's syncs.
    durable_commits: u64,
}

/// Page cache redb may use for the metadata table.
const META_CACHE_BYTES: usize = 64 << 20;

/// Opens (or with `create`, creates) the metadata table on `meta`. An existing table is opened
/// with redb's full integrity check: every page checksum verified and the allocator state
/// rebuilt. That costs one read of the table per mount, and turns a table damaged outside
/// redb into a clear error instead of a panic or wrong answers later.
pub(crate) fn open_db(
    meta: &Arc<dyn Device>,
    create: bool,
    failed: Arc<crate::device::Failure>,
) -> Result<Database> {
    if !create && meta.is_empty() {
        return Err(Corruption::Catalog("is empty".into()).into());
    }
    Database::builder()
        .set_cache_size(META_CACHE_BYTES)
        .set_check_integrity_on_open(!create)
        .create_with_backend(MetaBackend {
            dev: meta.clone(),
            failed,
        })
        .map_err(|e| match e {
            // An error of the device itself (it carries an errno, or the device's typed
            // fault: fenced, targets); redb reports what it finds wrong in the file's
            // contents (a bad magic number) as an I/O error too, without either, and that is
            // damage.
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if io.raw_os_error().is_some()
                    || io.get_ref().is_some_and(|x| x.is::<crate::error::Fault>()) =>
            {
                Error::from(io)
            }
            other => {
                Corruption::Catalog(format!("is damaged and cannot be opened: {other}")).into()
            }
        })
}

/// Writes an empty table onto `meta` (which must be empty): the root directory `root`, the
/// counters, `config`, and `segments` free; of a slot of a shared namespace, its inode
/// range and the shared tables.
pub(crate) fn init(
    meta: &Arc<dyn Device>,
    root: &InodeRecord,
    config: &Config,
    segments: std::ops::Range<u64>,
    shared_slot: Option<crate::format::SlotId>,
) -> Result<()> {
    let db = open_db(meta, true, Arc::default())?;
    let mut txn = db.begin_write()?;
    txn.set_two_phase_commit(true);
    create_tables(&txn)?;
    {
        let mut t = Txn::on(&txn, None)?;
        t.init(root, config, segments)?;
        if let Some(slot) = shared_slot {
            // A slot of a shared namespace numbers its inodes in its own range, so an
            // inode number names one object on every node (FORMAT.md "Shared namespace").
            t.set_ino_floor(crate::format::slot_ino_base(slot))?;
            t.create_shared_tables()?;
            // Every slot's root is a version of the one root.
            t.put_version(
                InodeId::ROOT,
                &crate::format::VersionMeta {
                    of: InodeId::ROOT,
                    ..Default::default()
                },
            )?;
        }
    }
    txn.commit()?;
    Ok(())
}

/// The metadata table's storage: redb does all its file I/O through this, so the same crash
/// and fault devices that stand in for the data file stand in for the table in tests.
/// Locking is not delegated: the space's own `lock` file already makes its holder the only
/// process that opens the table.
pub(crate) struct MetaBackend {
    pub dev: Arc<dyn Device>,
    /// Set by any failed write, length change or sync of the table: the space's sticky
    /// failure flag (shared with the chunk store), raised here because redb may report such
    /// an error from inside a transaction, as a later "previous I/O error", or not at all
    /// (a failed write of pages that a later commit never needed).
    pub failed: Arc<crate::device::Failure>,
}

impl MetaBackend {
    /// A device result as redb's storage trait wants it (`io::Error`; a typed fault rides
    /// as its payload, `Fault::into_io`), a failure raised as sticky.
    fn watch<T>(&self, r: crate::error::DevResult<T>) -> io::Result<T> {
        if let Err(e) = &r {
            if self
                .failed
                .raise(format!("a metadata table write or sync failed: {e}"))
            {
                log::error!(
                    "metadata table I/O failed, refusing further writes until remount: {e}"
                );
            }
        }
        r.map_err(crate::error::Fault::into_io)
    }
}

impl MetaBackend {
    /// Once the space has failed, nothing more reaches the table, not even redb's own
    /// bookkeeping at close: with a journal, transactions committed without a sync name
    /// chunks whose bytes may be in a write that failed, and redb's close would otherwise
    /// make them the table's state. Refused, redb's next open falls back to the last
    /// durable commit, and the journal's records (which carry those bytes) are applied.
    fn refuse_if_failed(&self) -> io::Result<()> {
        match self.failed.is_set() {
            true => Err(io::Error::other(
                "the space has failed: the metadata table is not written any more",
            )),
            false => Ok(()),
        }
    }
}

impl std::fmt::Debug for MetaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MetaBackend({} bytes)", self.dev.len())
    }
}

impl redb::StorageBackend for MetaBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.dev.len())
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        // A failed read changes nothing on disk: an error for this request, not sticky.
        self.dev
            .read_at(out, offset)
            .map_err(crate::error::Fault::into_io)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.refuse_if_failed()?;
        self.watch(self.dev.set_len(len))
    }
    fn sync_data(&self) -> io::Result<()> {
        self.refuse_if_failed()?;
        self.watch(self.dev.sync())
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.refuse_if_failed()?;
        self.watch(self.dev.write_at(data, offset))
    }
}

/// A write transaction of the metadata table. Only the catalog begins (`Catalog::begin`),
/// commits (`Catalog::commit`) and aborts them; changes go through `Txn::open`'s typed
/// operations.
pub struct WriteTxn {
    txn: WriteTransaction,
    /// Its changes, for its journal record.
    log: Mutex<TxnLog>,
    journaled: bool,
    /// It must be durable when its commit returns (or, with a journal, once its record
    /// is: `Catalog::make_durable`). Raised by a member of a commit group that needs it.
    durable: std::sync::atomic::AtomicBool,
    /// The held changes it applied (`Space::apply_held`): settled once it commits.
    pub(crate) applied: Mutex<Applied>,
}

/// What a transaction applied of the changes a space held (`space::deferred`).
#[derive(Default)]
pub(crate) struct Applied {
    /// Attribute changes, by inode and generation.
    pub(crate) attrs: Vec<(InodeId, u64)>,
    /// Creates, by inode.
    pub(crate) creates: Vec<InodeId>,
}

impl WriteTxn {
    /// Drops the transaction and every change made in it.
    pub(crate) fn abort(self) -> Result<()> {
        Ok(self.txn.abort()?)
    }

    /// It must be durable (a sync riding in a group begun by a commit that need not be).
    pub(crate) fn want_durable(&self) {
        self.durable
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// It is to be a checkpoint (`Space::checkpoint`): committed durably by redb itself,
    /// after the data file's sync, and the journal starts over.
    pub(crate) fn want_checkpoint(&self) {
        self.want_durable();
        self.log.lock().checkpoint = true;
    }

    pub(crate) fn durable(&self) -> bool {
        self.durable.load(std::sync::atomic::Ordering::Relaxed)
    }
}

use crate::store::StoredBytes;

impl Catalog {
    pub(crate) fn new(db: std::sync::Arc<Database>) -> Catalog {
        Catalog {
            db,
            durability: Mutex::new(Durability::default()),
            journal: None,
        }
    }

    /// The catalog of a space with a journal (replayed already: `journal::replay`).
    pub(crate) fn with_journal(db: std::sync::Arc<Database>, j: Arc<journal::Journal>) -> Self {
        Catalog {
            journal: Some(j),
            ..Catalog::new(db)
        }
    }

    pub(crate) fn journal(&self) -> Option<&Arc<journal::Journal>> {
        self.journal.as_ref()
    }

    /// Begins a write transaction. Without a journal, a durable one commits in two phases
    /// (its pages are synced before the commit slot naming them is written), so on open
    /// redb never has to fall back to the previous commit: an acknowledged commit cannot be
    /// silently rolled back, and a damaged table is an error; non-durable transactions
    /// (namespace changes) become durable with the next durable one. With a journal, every
    /// transaction commits to redb without a sync and a durable one is made durable by its
    /// journal record (`commit`, `make_durable`). The caller commits it (`Space::commit`,
    /// which makes a failed commit sticky) or aborts it.
    pub(crate) fn begin(&self, durable: bool) -> Result<WriteTxn> {
        let txn = self.db.begin_write()?;
        Ok(WriteTxn {
            txn,
            log: Mutex::new(TxnLog::default()),
            journaled: self.journal.is_some(),
            durable: std::sync::atomic::AtomicBool::new(durable),
            applied: Mutex::default(),
        })
    }

    /// Commits `txn`, counting it (`durable_commits`, `mark`). The caller makes a failure
    /// sticky (`Space::commit`): the table's state on disk is unknown then. With a journal:
    /// queues its record (while it still holds redb's writer, so records follow commits),
    /// carrying the stored bytes of the chunks it added if they are few (`bytes`), and
    /// returns the record's number, for the caller to wait for (`make_durable` if it is
    /// durable, else `make_written` or nothing); a transaction that frees segments, or
    /// asked to be one, is a checkpoint instead (None, durable once this returns).
    pub(crate) fn commit(&self, txn: WriteTxn, bytes: &dyn StoredBytes) -> Result<Option<u64>> {
        let durable = txn.durable();
        let WriteTxn { mut txn, log, .. } = txn;
        let Some(j) = &self.journal else {
            if durable {
                txn.set_two_phase_commit(true);
            } else {
                set_durability(&mut txn, redb::Durability::None)?;
            }
            let c = self.committing(durable);
            txn.commit()?;
            self.committed(c);
            return Ok(None);
        };
        let log = log.into_inner();
        set_durability(&mut txn, redb::Durability::None)?;
        let seq = j.reserve();
        txn.open_table(COUNTERS)?
            .insert(journal::JOURNAL_SEQ, seq)?;
        if log.checkpoint || log.frees {
            // The chunks earlier records carried are in the data file from now on.
            j.sync_data()?;
            set_durability(&mut txn, redb::Durability::Immediate)?;
            txn.set_two_phase_commit(true);
            j.checkpoint_begin(seq);
            let r = txn.commit();
            j.checkpoint_end(seq, r.is_ok());
            r?;
            self.durability.lock().durable_commits += 1;
            return Ok(None);
        }
        let total: u64 = log.new_chunks.iter().map(|c| c.1 as u64).sum();
        let mut inline = Vec::new();
        let mut needs_data = false;
        if total > journal::INLINE_BYTES {
            needs_data = true;
        } else {
            for &(offset, len) in &log.new_chunks {
                match bytes.stored_bytes(offset, len) {
                    Some(b) => {
                        inline.push(crate::format::journal::InlineChunk { offset, bytes: b })
                    }
                    None => {
                        needs_data = true;
                        inline.clear();
                        break;
                    }
                }
            }
        }
        j.push(seq, log.encode(j.id, seq, &inline), needs_data);
        if durable {
            // The close waiting for this record has its write under way during redb's
            // commit (`Journal::write_ahead`).
            j.write_ahead()?;
        }
        txn.commit()?;
        Ok(Some(seq))
    }

    /// Waits until journal record `seq` (and every one before it) is durable, or with
    /// `durable` false only written into the journal file (`Journal::make_written`).
    /// Ok(false): the journal has no room for them before a checkpoint, which the caller
    /// makes.
    pub(crate) fn make_durable(&self, seq: u64, durable: bool) -> Result<bool> {
        let Some(j) = &self.journal else {
            return Ok(true);
        };
        let flushed = match durable {
            true => j.make_durable(seq)?,
            false => j.make_written(seq)?,
        };
        Ok(flushed == journal::Flushed::Done)
    }

    /// Writes out queued records past the queue's bound. Ok(false) as `make_durable`.
    pub(crate) fn bound_queue(&self) -> Result<bool> {
        match &self.journal {
            Some(j) => Ok(j.bound_queue()? == journal::Flushed::Done),
            None => Ok(true),
        }
    }

    /// A checkpoint is due (`journal::CHECKPOINT_BYTES`, `CHECKPOINT_TXNS`).
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.journal.as_ref().is_some_and(|j| j.checkpoint_due())
    }

    /// The open write transaction is about to commit (the caller still holds redb's
    /// writer): a non-durable one is counted now, before any reader can see it, so a mark
    /// taken after a reader saw it (`mark`) covers it. A durable one returns how many
    /// non-durable ones it covers.
    fn committing(&self, durable: bool) -> Committing {
        let mut d = self.durability.lock();
        match durable {
            true => Committing(Some(d.nondurable)),
            false => {
                d.nondurable += 1;
                Committing(None)
            }
        }
    }

    /// The transaction `c` described committed.
    fn committed(&self, c: Committing) {
        if let Committing(Some(upto)) = c {
            let mut d = self.durability.lock();
            d.durable_upto = d.durable_upto.max(upto);
            d.durable_commits += 1;
        }
    }

    /// Durable operations so far: durable transactions (checkpoints), and the journal's
    /// syncs.
    pub(crate) fn durable_commits(&self) -> u64 {
        self.durability.lock().durable_commits + self.journal.as_ref().map_or(0, |j| j.syncs())
    }

    /// The commits made so far that may not be durable yet: `durable_since(mark)` says
    /// whether they are all durable now (without a journal, the non-durable commits
    /// counted; with one, the newest record queued).
    pub(crate) fn mark(&self) -> u64 {
        match &self.journal {
            Some(j) => j.last(),
            None => self.durability.lock().nondurable,
        }
    }

    /// Whether every commit counted in `mark` has become durable.
    pub(crate) fn durable_since(&self, mark: u64) -> bool {
        match &self.journal {
            Some(j) => j.is_durable(mark),
            None => self.durability.lock().durable_upto >= mark,
        }
    }

    /// A read snapshot.
    pub(crate) fn reader(&self) -> Result<Reader> {
        Reader::new(&self.db)
    }

    /// The store's view of the committed chunks.
    pub(crate) fn chunk_index(&self) -> ChunkIndex {
        ChunkIndex(self.db.clone())
    }

    /// The redb database itself: for the engine's tests that damage a space on purpose
    /// (`Space::catalog`). Nothing else reaches redb but through the catalog.
    #[doc(hidden)]
    pub fn raw(&self) -> &Database {
        &self.db
    }
}

fn set_durability(txn: &mut WriteTransaction, d: redb::Durability) -> Result<()> {
    txn.set_durability(d)
        .map_err(|e| Error::Meta(crate::error::MetaFault::Other(e.to_string())))
}

/// What `Catalog::committing` says of the transaction about to commit, for `committed`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Committing(Option<u64>);

/// The catalog's answer to the store's "where do these committed chunks lie".
pub(crate) struct ChunkIndex(std::sync::Arc<Database>);

impl crate::store::CommittedChunks for ChunkIndex {
    fn committed(&self, hashes: &[ChunkHash]) -> Result<Vec<Option<ChunkRecord>>> {
        let txn = self.0.begin_read()?;
        let t = txn.open_table(CHUNKS)?;
        hashes.iter().map(|h| get_chunk(&t, h)).collect()
    }
}

/// One read snapshot of the catalog. Each method opens the tables it reads (cheap on a
/// read transaction), so a point lookup costs one table open, not thirteen.
pub struct Reader {
    txn: ReadTransaction,
}

impl Reader {
    pub fn new(db: &Database) -> Result<Reader> {
        Ok(Reader {
            txn: db.begin_read()?,
        })
    }

    pub fn inode(&self, ino: InodeId) -> Result<Option<InodeRecord>> {
        get_inode(&self.txn.open_table(INODES)?, ino)
    }

    /// `inode` of each of `inos`, the table opened once (a listing's entries: opening it
    /// per entry was most of a listing's cost).
    pub fn inodes(&self, inos: &[InodeId]) -> Result<Vec<Option<InodeRecord>>> {
        let t = self.txn.open_table(INODES)?;
        inos.iter().map(|i| get_inode(&t, *i)).collect()
    }

    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>> {
        lookup(&self.txn.open_table(DIRENTS)?, parent, name)
    }

    /// Entries of `dir` with cookies greater than `after`, at most `limit` of them.
    pub fn list_dir(&self, dir: InodeId, after: u64, limit: usize) -> Result<Vec<DirEntry>> {
        list_dir(
            &self.txn.open_table(DIRLIST)?,
            &self.txn.open_table(DIRENTS)?,
            dir,
            after,
            limit,
        )
    }

    pub fn xattrs(&self, ino: InodeId) -> Result<Xattrs> {
        xattrs_of(&self.txn.open_table(XATTRS)?, ino)
    }

    pub fn xattr(&self, ino: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>> {
        let t = self.txn.open_table(XATTRS)?;
        Ok(t.get((ino.0, name))?.map(|v| v.value().to_vec()))
    }

    pub fn revision_xattrs(&self, rev: RevisionId) -> Result<Xattrs> {
        revision_xattrs(&self.txn.open_table(REV_XATTRS)?, rev)
    }

    /// The extents of revision `rev`, by file offset.
    pub fn extents(&self, rev: RevisionId) -> Result<Vec<(u64, Extent)>> {
        extents_of(&self.txn.open_table(EXTENTS)?, rev)
    }

    /// `extents` of each of `revs`, the table opened once.
    pub fn extents_many(&self, revs: &[RevisionId]) -> Result<Vec<Vec<(u64, Extent)>>> {
        let t = self.txn.open_table(EXTENTS)?;
        revs.iter().map(|r| extents_of(&t, *r)).collect()
    }

    pub fn config(&self) -> Result<Config> {
        Config::read(&self.txn.open_table(CONFIG)?)
    }

    pub fn history(&self, hid: HistoryId) -> Result<HistoryRecord> {
        get_history(&self.txn.open_table(HISTORIES)?, hid)
    }

    /// History ids greater than `after`, at most `limit`.
    pub fn history_ids(&self, after: HistoryId, limit: usize) -> Result<Vec<HistoryId>> {
        let t = self.txn.open_table(HISTORIES)?;
        let mut out = Vec::new();
        for item in t.range(after.0 + 1..)? {
            out.push(HistoryId(item?.0.value()));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The most recently unlinked history whose path was `path`.
    pub fn unlinked_history_at(&self, path: &[u8]) -> Result<Option<HistoryId>> {
        let t = self.txn.open_table(HISTORIES)?;
        let mut best: Option<(Timestamp, u64)> = None;
        for item in t.iter()? {
            let (k, v) = item?;
            let h = HistoryRecord::decode(v.value())?;
            if let Some(when) = h.unlinked {
                if h.path == path && best.is_none_or(|(t, _)| when >= t) {
                    best = Some((when, k.value()));
                }
            }
        }
        Ok(best.map(|(_, hid)| HistoryId(hid)))
    }

    /// The revisions of a history, oldest first (sealed or not).
    pub fn history_revisions(&self, hid: HistoryId) -> Result<Vec<RevisionId>> {
        revisions_of(&self.txn.open_table(HISTORY_REVS)?, hid)
    }

    pub fn revision(&self, rev: RevisionId) -> Result<Option<RevisionRecord>> {
        get_revision(&self.txn.open_table(REVISIONS)?, rev)
    }

    pub(crate) fn advice_config(&self) -> Result<AdviceConfig> {
        read_advice(&self.txn.open_table(CONFIG)?)
    }

    /// The newest `limit` revisions' (commit time in unix seconds, seconds spent writing,
    /// size in bytes), those whose write time was measured.
    pub(crate) fn recent_write_times(&self, limit: usize) -> Result<Vec<(f64, f64, u64)>> {
        let t = self.txn.open_table(REVISIONS)?;
        let mut out = Vec::new();
        for item in t.iter()?.rev().take(limit) {
            let (_, v) = item?;
            let r = RevisionRecord::decode(v.value())?;
            if r.write_ms > 0 {
                let end = r.committed.secs as f64 + r.committed.nanos as f64 / 1e9;
                out.push((end, r.write_ms as f64 / 1000.0, r.size));
            }
        }
        Ok(out)
    }

    pub(crate) fn revision_count(&self) -> Result<u64> {
        Ok(self.txn.open_table(REVISIONS)?.len()?)
    }

    pub fn chunk(&self, h: &ChunkHash) -> Result<Option<ChunkRecord>> {
        get_chunk(&self.txn.open_table(CHUNKS)?, h)
    }

    /// Every revision with the worst of `score(segment)` over the segments its chunks are
    /// in (None: a revision of holes only), in revision order. One pass over the extents;
    /// chunk lookups are cached, at most `CACHE` entries (then the cache starts over).
    pub(crate) fn revisions_by_segments(
        &self,
        segment_bytes: u64,
        mut score: impl FnMut(u64) -> i64,
    ) -> Result<Vec<(RevisionId, RevisionRecord, Option<i64>)>> {
        const CACHE: usize = 1 << 20;
        let extents = self.txn.open_table(EXTENTS)?;
        let chunks = self.txn.open_table(CHUNKS)?;
        let revisions = self.txn.open_table(REVISIONS)?;
        let mut seg_of: std::collections::HashMap<ChunkHash, (u64, u64)> = Default::default();
        let mut worst: std::collections::BTreeMap<u64, i64> = Default::default();
        for item in extents.iter()? {
            let (k, v) = item?;
            let e = Extent::decode(v.value())?;
            let (first, last) = match seg_of.get(&e.chunk) {
                Some(s) => *s,
                None => {
                    let Some(c) = get_chunk(&chunks, &e.chunk)?.filter(|c| !c.is_remote()) else {
                        continue;
                    };
                    let end = c.offset.0 + u64::from(c.stored_len).max(1) - 1;
                    let s = (c.offset.0 / segment_bytes, end / segment_bytes);
                    if seg_of.len() >= CACHE {
                        seg_of.clear();
                    }
                    seg_of.insert(e.chunk, s);
                    s
                }
            };
            let w = (first..=last).map(&mut score).min().unwrap_or(i64::MAX);
            let slot = worst.entry(k.value().0).or_insert(i64::MAX);
            *slot = (*slot).min(w);
        }
        let mut out = Vec::new();
        for item in revisions.iter()? {
            let (k, v) = item?;
            let rr = RevisionRecord::decode(v.value())?;
            let rev = k.value();
            out.push((RevisionId(rev), rr, worst.get(&rev).copied()));
        }
        Ok(out)
    }

    /// Every chunk stored in the data file (gc, scrub, usage: what segments hold); chunks
    /// held only by the object-store tier are left out (`for_each_chunk_record`).
    pub(crate) fn for_each_chunk(
        &self,
        f: impl FnMut(ChunkHash, ChunkRecord) -> Result<()>,
    ) -> Result<()> {
        for_each_chunk_in(&self.txn.open_table(CHUNKS)?, false, f)
    }

    /// Every chunk record, those held only by the object-store tier too.
    pub(crate) fn for_each_chunk_record(
        &self,
        f: impl FnMut(ChunkHash, ChunkRecord) -> Result<()>,
    ) -> Result<()> {
        for_each_chunk_in(&self.txn.open_table(CHUNKS)?, true, f)
    }

    pub(crate) fn for_each_inode(&self, mut f: impl FnMut(InodeId, InodeRecord)) -> Result<()> {
        for item in self.txn.open_table(INODES)?.iter()? {
            let (k, v) = item?;
            f(InodeId(k.value()), InodeRecord::decode(v.value())?);
        }
        Ok(())
    }

    /// Every extent of every revision with its revision, in (revision, offset) order.
    pub(crate) fn for_each_revision_extent(
        &self,
        mut f: impl FnMut(RevisionId, &Extent) -> Result<()>,
    ) -> Result<()> {
        for item in self.txn.open_table(EXTENTS)?.iter()? {
            let (k, v) = item?;
            f(RevisionId(k.value().0), &Extent::decode(v.value())?)?;
        }
        Ok(())
    }

    /// Every extent of every revision (for stats).
    pub(crate) fn for_each_extent(&self, mut f: impl FnMut(&Extent)) -> Result<()> {
        for item in self.txn.open_table(EXTENTS)?.iter()? {
            f(&Extent::decode(item?.1.value())?);
        }
        Ok(())
    }

    pub(crate) fn free_segments(&self) -> Result<BTreeSet<SegmentId>> {
        free_segments_in(&self.txn.open_table(FREE)?)
    }

    /// Unlinked inodes (nlink 0) for which `open` says no handle is open.
    pub(crate) fn dead_inodes(&self, open: impl Fn(InodeId) -> bool) -> Result<Vec<InodeId>> {
        dead_inodes_in(&self.txn.open_table(INODES)?, open)
    }

    pub(crate) fn history_count(&self) -> Result<u64> {
        Ok(self.txn.open_table(HISTORIES)?.len()?)
    }

    /// Every history, by id.
    pub(crate) fn for_each_history(
        &self,
        mut f: impl FnMut(HistoryId, HistoryRecord) -> Result<()>,
    ) -> Result<()> {
        for item in self.txn.open_table(HISTORIES)?.iter()? {
            let (k, v) = item?;
            f(HistoryId(k.value()), HistoryRecord::decode(v.value())?)?;
        }
        Ok(())
    }

    /// Chunks queued for gc (their reference count reached zero).
    pub(crate) fn gc_candidates(&self) -> Result<Vec<ChunkHash>> {
        let mut out = Vec::new();
        for item in self.txn.open_table(GC_CANDIDATES)?.iter()? {
            out.push(hash_key(item?.0.value(), "gc candidate")?);
        }
        Ok(out)
    }

    /// A table only some spaces have (the shared namespace's, an old space's whiteouts):
    /// None where this one has none.
    fn optional<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<Option<ReadOnlyTable<K, V>>> {
        match self.txn.open_table(def) {
            Ok(t) => Ok(Some(t)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// This slot's whiteouts (none before the first).
    pub fn whiteouts(&self) -> Result<Vec<(Vec<u8>, Timestamp)>> {
        let Some(t) = self.optional(WHITEOUTS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let at = Timestamp::decode_value(v.value(), "whiteout")?;
            out.push((k.value().to_vec(), at));
        }
        Ok(out)
    }

    /// This slot's records of the shared namespace (none in a space without one).
    pub fn bindings(&self) -> Result<Vec<(InodeId, Vec<u8>, Binding)>> {
        let Some(t) = self.optional(BINDINGS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let (p, n) = k.value();
            out.push((InodeId(p), n.to_vec(), Binding::decode(v.value())?));
        }
        Ok(out)
    }

    /// Every local inode's version record (none in a space without a shared namespace).
    pub fn versions(&self) -> Result<Vec<(InodeId, VersionMeta)>> {
        let Some(t) = self.optional(VERSIONS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            out.push((InodeId(k.value()), VersionMeta::decode(v.value())?));
        }
        Ok(out)
    }

    pub fn version(&self, ino: InodeId) -> Result<Option<VersionMeta>> {
        let Some(t) = self.optional(VERSIONS)? else {
            return Ok(None);
        };
        t.get(ino.0)?
            .map(|v| VersionMeta::decode(v.value()))
            .transpose()
    }

    /// The shared namespace's clock as stored.
    pub(crate) fn ns_stamp(&self) -> Result<u64> {
        Ok(self
            .txn
            .open_table(COUNTERS)?
            .get(NS_STAMP)?
            .map_or(0, |v| v.value()))
    }

    /// The raw tables of this snapshot, for `ckptfs check`, which must see rows that do not
    /// decode in order to report them.
    pub fn raw(&self) -> Result<RawTables> {
        let txn = &self.txn;
        Ok(RawTables {
            inodes: txn.open_table(INODES)?,
            dirents: txn.open_table(DIRENTS)?,
            dirlist: txn.open_table(DIRLIST)?,
            histories: txn.open_table(HISTORIES)?,
            history_revs: txn.open_table(HISTORY_REVS)?,
            revisions: txn.open_table(REVISIONS)?,
            extents: txn.open_table(EXTENTS)?,
            chunks: txn.open_table(CHUNKS)?,
            candidates: txn.open_table(GC_CANDIDATES)?,
            free: txn.open_table(FREE)?,
            counters: txn.open_table(COUNTERS)?,
            xattrs: txn.open_table(XATTRS)?,
            rev_xattrs: txn.open_table(REV_XATTRS)?,
        })
    }
}

/// The tables of one read snapshot, undecoded (see `Reader::raw`).
pub struct RawTables {
    pub inodes: ReadOnlyTable<u64, &'static [u8]>,
    pub dirents: ReadOnlyTable<(u64, &'static [u8]), (u64, u64)>,
    pub dirlist: ReadOnlyTable<(u64, u64), &'static [u8]>,
    pub histories: ReadOnlyTable<u64, &'static [u8]>,
    pub history_revs: ReadOnlyTable<(u64, u64), ()>,
    pub revisions: ReadOnlyTable<u64, &'static [u8]>,
    pub extents: ReadOnlyTable<(u64, u64), &'static [u8]>,
    pub chunks: ReadOnlyTable<&'static [u8], &'static [u8]>,
    pub candidates: ReadOnlyTable<&'static [u8], ()>,
    pub free: ReadOnlyTable<u64, ()>,
    pub counters: ReadOnlyTable<&'static str, u64>,
    pub xattrs: ReadOnlyTable<(u64, &'static [u8]), &'static [u8]>,
    pub rev_xattrs: ReadOnlyTable<u64, &'static [u8]>,
}

impl RawTables {
    /// The inode, decoded.
    pub fn inode(&self, ino: InodeId) -> Result<Option<InodeRecord>> {
        get_inode(&self.inodes, ino)
    }
}

fn get_history(
    t: &impl ReadableTable<u64, &'static [u8]>,
    hid: HistoryId,
) -> Result<HistoryRecord> {
    match t.get(hid.0)? {
        Some(v) => HistoryRecord::decode(v.value()),
        None => Err(Corruption::Missing(Missing::History(hid)).into()),
    }
}

fn get_revision(
    t: &impl ReadableTable<u64, &'static [u8]>,
    rev: RevisionId,
) -> Result<Option<RevisionRecord>> {
    match t.get(rev.0)? {
        Some(v) => Ok(Some(RevisionRecord::decode(v.value())?)),
        None => Ok(None),
    }
}

pub fn is_dir(rec: &InodeRecord) -> bool {
    rec.kind == NodeKind::Dir
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Codec;

    pub(super) fn db() -> Database {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .expect("in-memory table");
        let txn = db.begin_write().unwrap();
        create_tables(&txn).unwrap();
        let root = InodeRecord::new(NodeKind::Dir, 0o755, 0, 0);
        Txn::on(&txn, None)
            .unwrap()
            .init(&root, &Config::default(), 0..4)
            .unwrap();
        txn.commit().unwrap();
        db
    }

    fn record(refs: u64) -> ChunkRecord {
        ChunkRecord {
            offset: DataOffset(0),
            stored_len: 10,
            raw_len: 10,
            codec: Codec::Raw,
            refs,
        }
    }

    /// Commits a revision naming chunk `h` twice (two extents), with the chunk new.
    fn commit_two_refs(db: &Database, h: ChunkHash) -> RevisionId {
        let txn = db.begin_write().unwrap();
        let rev = {
            let mut t = Txn::on(&txn, None).unwrap();
            let rev = t.next_revision_id().unwrap();
            let e = Extent {
                chunk: h,
                chunk_off: 0,
                len: 10,
            };
            let rr = RevisionRecord {
                size: 20,
                committed: Timestamp::EPOCH,
                new_stored_bytes: 0,
                sealed: true,
                history: HistoryId(1),
                write_ms: 0,
            };
            let new = t
                .put_revision(
                    rev,
                    &rr,
                    [(0, &e), (10, &e)].into_iter(),
                    InodeId::ROOT,
                    |_| Some(record(0)),
                )
                .unwrap();
            assert_eq!(new, 10, "the new chunk's bytes count once");
            assert_eq!(t.chunk(&h).unwrap().unwrap().refs, 2);
            rev
        };
        txn.commit().unwrap();
        rev
    }

    #[test]
    fn references_count_each_extent_and_dropping_queues_the_chunk_for_gc() {
        let db = db();
        let h = ChunkHash([1; 32]);
        let rev = commit_two_refs(&db, h);
        let txn = db.begin_write().unwrap();
        let mut t = Txn::on(&txn, None).unwrap();
        t.drop_revision(rev).unwrap();
        assert_eq!(t.chunk(&h).unwrap().unwrap().refs, 0);
        let (freed, bytes) = t.delete_dead_chunks(|_| false, |_, _| {}).unwrap();
        assert_eq!(
            (freed, bytes),
            (1, 10),
            "the unreferenced chunk was a candidate"
        );
        assert!(t.chunk(&h).unwrap().is_none());
    }

    /// A count that would go below zero is reported as corruption, not clamped at zero
    /// (which would let gc delete a chunk other extents still name).
    #[test]
    fn a_reference_count_underflow_is_corruption() {
        let db = db();
        let h = ChunkHash([2; 32]);
        let rev = commit_two_refs(&db, h);
        let txn = db.begin_write().unwrap();
        let mut t = Txn::on(&txn, None).unwrap();
        // Damage: the chunk claims one reference while two extents name it.
        t.chunks
            .insert(h.0.as_slice(), record(1).encode().as_slice())
            .unwrap();
        match t.drop_revision(rev) {
            Err(Error::Corrupt(Corruption::RefUnderflow(x))) => assert_eq!(x, h),
            other => panic!("want corruption, got {other:?}"),
        }
    }

    fn extent(h: ChunkHash) -> Extent {
        Extent {
            chunk: h,
            chunk_off: 0,
            len: 10,
        }
    }

    fn revision_record(sealed: bool) -> RevisionRecord {
        RevisionRecord {
            size: 0,
            committed: Timestamp::EPOCH,
            new_stored_bytes: 0,
            sealed,
            history: HistoryId(1),
            write_ms: 0,
        }
    }

    /// Replacing an unsealed revision leaves the tables as dropping it and putting the new
    /// one does: the same reference counts, the same dead chunks for gc, the same new bytes,
    /// the old revision's extents gone and the new one's in place. The maps overlap (a chunk
    /// both name), one chunk only the old names (twice), one only the new (twice), and
    /// another revision shares a chunk.
    #[test]
    fn replacing_a_revision_counts_references_as_dropping_and_putting_it() {
        let [a, b, c, d] = [11u8, 12, 13, 14].map(|x| ChunkHash([x; 32]));
        let run = |replace: bool| {
            let db = db();
            let txn = db.begin_write().unwrap();
            let out = {
                let mut t = Txn::on(&txn, None).unwrap();
                let other = t.next_revision_id().unwrap();
                let (ea, eb, ec, ed) = (extent(a), extent(b), extent(c), extent(d));
                t.put_revision(
                    other,
                    &revision_record(true),
                    [(0, &eb)].into_iter(),
                    InodeId::ROOT,
                    |_| Some(record(0)),
                )
                .unwrap();
                let prev = t.next_revision_id().unwrap();
                t.put_revision(
                    prev,
                    &revision_record(false),
                    [(0, &ea), (10, &ea), (20, &eb), (30, &ec), (40, &ec)].into_iter(),
                    InodeId::ROOT,
                    |_| Some(record(0)),
                )
                .unwrap();
                let rev = t.next_revision_id().unwrap();
                let new_map = [(0, &ea), (10, &ed), (20, &ed), (30, &eb)];
                let new = if replace {
                    t.replace_revision(
                        prev,
                        rev,
                        &revision_record(false),
                        new_map.into_iter(),
                        InodeId::ROOT,
                        |_| Some(record(0)),
                    )
                    .unwrap()
                } else {
                    t.drop_revision(prev).unwrap();
                    t.put_revision(
                        rev,
                        &revision_record(false),
                        new_map.into_iter(),
                        InodeId::ROOT,
                        |_| Some(record(0)),
                    )
                    .unwrap()
                };
                assert!(t.revision(prev).unwrap().is_none());
                assert!(extents_of(t.extents.table().unwrap(), prev)
                    .unwrap()
                    .is_empty());
                let extents: Vec<(u64, ChunkHash)> = extents_of(t.extents.table().unwrap(), rev)
                    .unwrap()
                    .into_iter()
                    .map(|(o, e)| (o, e.chunk))
                    .collect();
                assert_eq!(extents, vec![(0, a), (10, d), (20, d), (30, b)]);
                assert_eq!(
                    t.revision(rev).unwrap().unwrap().new_stored_bytes,
                    new,
                    "the record keeps the new bytes"
                );
                let refs: Vec<u64> = [a, b, c, d]
                    .iter()
                    .map(|h| t.chunk(h).unwrap().unwrap().refs)
                    .collect();
                let dead = t.delete_dead_chunks(|_| false, |_, _| {}).unwrap();
                (new, refs, dead)
            };
            txn.commit().unwrap();
            out
        };
        let replaced = run(true);
        assert_eq!(replaced, run(false));
        assert_eq!(replaced, (10, vec![1, 2, 0, 2], (1, 10)));
    }

    #[test]
    fn an_extent_naming_a_missing_chunk_is_corruption() {
        let db = db();
        let h = ChunkHash([3; 32]);
        let rev = commit_two_refs(&db, h);
        let txn = db.begin_write().unwrap();
        let mut t = Txn::on(&txn, None).unwrap();
        t.chunks.remove(h.0.as_slice()).unwrap();
        let unknown = |r| matches!(r, Err(Error::Corrupt(Corruption::UnknownChunk(x))) if x == h);
        assert!(unknown(t.drop_revision(rev)));
        assert!(unknown(t.add_chunk_ref(&h, || None).map(|_| ())));
    }
}
