//! The journal: what makes a close durable at the cost of one sync.
//!
//! Without it every close was a durable redb transaction: the data file's sync, then
//! redb's two-phase commit (two more), with the table's one writer held through all three,
//! so the creates of other writers queued behind it and eight writers hardly shared a
//! commit. With it (single-slot spaces, FORMAT.md "Journal"):
//!
//! - every metadata transaction commits to redb without a sync (`Durability::None`), and,
//!   while it still holds redb's writer, queues a record of the rows it wrote and removed
//!   (`Logged` tables record them as they are changed) here, numbered in commit order;
//! - a close that must be durable waits until its record is: whoever finds no flush under
//!   way writes every queued record in one write and syncs the journal once, while the
//!   others wait for that flush (a group commit that never holds redb's writer);
//! - the stored bytes of the chunks a small transaction added ride in its record (at most
//!   `INLINE_BYTES`), so its close does not wait for the data file's sync at all; a larger
//!   one's record waits for the data file's sync, done by the flush that writes it;
//! - now and then (`CHECKPOINT_BYTES` of records or `CHECKPOINT_TXNS` transactions since
//!   the last, a transaction that frees segments, unmount) a checkpoint syncs the data file
//!   and commits redb durably; the journal then starts over at offset 0;
//! - an open applies the records after the table's last checkpoint (`replay`): the chunk
//!   bytes written where their records say, the rows applied, all committed durably.
//!
//! Each transaction also sets the counter `journal_seq` to its record's number, so the
//! table says which records it already holds. Bounds: records queued and not yet written
//! are written out (unsynced) past `QUEUE_BYTES`; the journal file is `JOURNAL_BYTES`; a
//! flush that would not fit asks for a checkpoint instead (`Flushed::Full`).

use super::tables::*;
use crate::device::{Device, Failure};
use crate::error::{Corruption, Error, Result};
use crate::format::journal::{self as rec, Header, InlineChunk, JOURNAL_BLOCK, JOURNAL_HEADER};
use crate::placement::{Location, Placement};
use parking_lot::{Condvar, Mutex};
use redb::{
    AccessGuard, Key, ReadableDatabase, ReadableTable, Table, TableDefinition, Value,
    WriteTransaction,
};
use std::borrow::Borrow;
use std::cell::OnceCell;
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

/// The journal file's size, made at format (or at the first open of an older space).
pub const JOURNAL_BYTES: u64 = 64 << 20;
/// A checkpoint is due once this many bytes of records were written since the last.
pub(crate) const CHECKPOINT_BYTES: u64 = 16 << 20;
/// ... or this many transactions committed: redb frees the pages a transaction without a
/// sync replaced only at the next durable commit, so the table grows until then.
pub(crate) const CHECKPOINT_TXNS: u64 = 1024;
/// Records queued (closes of a mount that defers durability to fsync) are written out,
/// unsynced, once they hold this much: the bound on the queue's memory.
const QUEUE_BYTES: usize = 4 << 20;
/// The most chunk bytes one transaction carries in its record; above it, its close waits
/// for the data file's sync instead.
pub(crate) const INLINE_BYTES: u64 = 512 << 10;
/// The most queued record bytes a commit writes ahead (`Journal::write_ahead`): it does so
/// while it holds redb's writer, and a larger write (a 64 KiB file's chunk carried in its
/// record) kept the other writers' commits waiting longer than the close gained: eight
/// writers of 64 KiB files closed 8-12% fewer files per second with every record written
/// ahead, while one writer of 1 KiB files gained 10-15% (`ckptfs-bench closes`, 2-core VM).
const WRITE_AHEAD_BYTES: usize = 16 << 10;
/// A transaction recording more rows than this (a gc dropping many revisions) stops
/// recording and commits as a checkpoint instead: the bound on a record's memory.
const LOG_BYTES: usize = 16 << 20;
/// The counter naming the newest record the table holds.
pub(crate) const JOURNAL_SEQ: &str = "journal_seq";
/// The counter holding the journal's id (what its records' checksums cover).
pub(crate) const JOURNAL_ID: &str = "journal_id";

/// The rows one transaction changed, recorded as its `Logged` tables change them, and the
/// chunks it added (by where they lie): what its journal record is made of.
#[derive(Default)]
pub struct TxnLog {
    rows: Vec<u8>,
    count: u32,
    /// (data offset, stored length) of each chunk the transaction added.
    pub(crate) new_chunks: Vec<(u64, u32)>,
    /// The transaction frees segments (gc): it must be a checkpoint, since a record applied
    /// after one of those segments was filled again would name bytes no longer there.
    pub(crate) frees: bool,
    /// A checkpoint was asked for (`Space::checkpoint`), or the rows passed `LOG_BYTES`.
    pub(crate) checkpoint: bool,
}

impl TxnLog {
    fn row(&mut self, table: u8, op: u8, key: &[u8], value: &[u8]) {
        if self.checkpoint {
            return;
        }
        rec::push_row(&mut self.rows, table, op, key, value);
        self.count += 1;
        if self.rows.len() > LOG_BYTES {
            self.checkpoint = true;
            self.rows = Vec::new();
            self.count = 0;
        }
    }

    /// The record, numbered `seq`, with `chunks`' bytes.
    pub(crate) fn encode(&self, id: u64, seq: u64, chunks: &[InlineChunk]) -> Vec<u8> {
        rec::encode_record(id, seq, self.count, &self.rows, chunks)
    }
}

/// A redb table whose changes are also recorded in the transaction's log (when the space
/// has a journal). Reads go to the table (`table`); the only changes are `insert`,
/// `remove` and `pop_first_key`, each recorded as it is made.
///
/// The table is opened in the transaction at its first use, not with the `Txn`: a small
/// close or setattr touches two or three of the catalog's fourteen tables, and opening
/// (and at commit, closing) all of them was a fifth of the daemon's CPU in an untar of
/// small files (`perf`, 5,000 files).
pub struct Logged<'t, K: Key + 'static, V: Value + 'static> {
    t: OnceCell<Table<'t, K, V>>,
    txn: &'t WriteTransaction,
    def: TableDefinition<'static, K, V>,
    id: u8,
    /// None: nothing is recorded (a space without a journal).
    log: Option<&'t Mutex<TxnLog>>,
}

impl<'t, K: Key + 'static, V: Value + 'static> Logged<'t, K, V> {
    pub(crate) fn open(
        txn: &'t WriteTransaction,
        log: Option<&'t Mutex<TxnLog>>,
        def: TableDefinition<'static, K, V>,
    ) -> Result<Self> {
        let id = table_id(redb::TableHandle::name(&def))
            .expect("every table the catalog changes has a number");
        Ok(Logged {
            t: OnceCell::new(),
            txn,
            def,
            id,
            log,
        })
    }

    /// The table, opened in the transaction now if this is its first use.
    pub(crate) fn table(&self) -> Result<&Table<'t, K, V>> {
        if let Some(t) = self.t.get() {
            return Ok(t);
        }
        let t = self.txn.open_table(self.def)?;
        Ok(self.t.get_or_init(|| t))
    }

    fn table_mut(&mut self) -> Result<&mut Table<'t, K, V>> {
        self.table()?;
        Ok(self.t.get_mut().expect("opened just above"))
    }

    /// Records one change in the transaction's log (nothing without a journal).
    fn record(&self, op: u8, key: &[u8], value: &[u8]) {
        if let Some(log) = self.log {
            log.lock().row(self.id, op, key, value);
        }
    }

    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<AccessGuard<'_, V>>> {
        self.table()?;
        self.record(
            rec::OP_INSERT,
            K::as_bytes(key.borrow()).as_ref(),
            V::as_bytes(value.borrow()).as_ref(),
        );
        Ok(self.table_mut()?.insert(key, value)?)
    }

    pub(crate) fn remove<'k>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<AccessGuard<'_, V>>> {
        self.table()?;
        self.record(rec::OP_REMOVE, K::as_bytes(key.borrow()).as_ref(), &[]);
        Ok(self.table_mut()?.remove(key)?)
    }

    /// Removes the first row and returns its key's bytes.
    pub(crate) fn pop_first_key(&mut self) -> Result<Option<Vec<u8>>> {
        let key = self
            .table()?
            .first()?
            .map(|(k, _)| K::as_bytes(&k.value()).as_ref().to_vec());
        if let Some(k) = &key {
            self.record(rec::OP_REMOVE, k, &[]);
            self.table_mut()?.remove(K::from_bytes(k))?;
        }
        Ok(key)
    }
}

/// The tables a record may name, by number. Numbers are on disk: append only.
const TABLES: [&str; 17] = [
    "inodes",
    "dirents",
    "dirlist",
    "revisions",
    "history_revs",
    "histories",
    "free_segments",
    "gc_candidates",
    "config",
    "extents",
    "chunks",
    "counters",
    "xattrs",
    "revision_xattrs",
    "whiteouts",
    "bindings",
    "versions",
];

fn table_id(name: &str) -> Option<u8> {
    TABLES.iter().position(|t| *t == name).map(|i| i as u8)
}

fn apply_row<K: Key + 'static, V: Value + 'static>(
    txn: &WriteTransaction,
    def: TableDefinition<K, V>,
    r: &rec::Row,
) -> Result<()> {
    let mut t = txn.open_table(def)?;
    match r.op {
        rec::OP_INSERT => {
            t.insert(K::from_bytes(&r.key), V::from_bytes(&r.value))?;
        }
        _ => {
            t.remove(K::from_bytes(&r.key))?;
        }
    }
    Ok(())
}

/// Applies one recorded row change.
fn apply(txn: &WriteTransaction, r: &rec::Row) -> Result<()> {
    match r.table {
        0 => apply_row(txn, INODES, r),
        1 => apply_row(txn, DIRENTS, r),
        2 => apply_row(txn, DIRLIST, r),
        3 => apply_row(txn, REVISIONS, r),
        4 => apply_row(txn, HISTORY_REVS, r),
        5 => apply_row(txn, HISTORIES, r),
        6 => apply_row(txn, FREE, r),
        7 => apply_row(txn, GC_CANDIDATES, r),
        8 => apply_row(txn, CONFIG, r),
        9 => apply_row(txn, EXTENTS, r),
        10 => apply_row(txn, CHUNKS, r),
        11 => apply_row(txn, COUNTERS, r),
        12 => apply_row(txn, XATTRS, r),
        13 => apply_row(txn, REV_XATTRS, r),
        14 => apply_row(txn, WHITEOUTS, r),
        15 => apply_row(txn, BINDINGS, r),
        16 => apply_row(txn, VERSIONS, r),
        n => Err(Corruption::Record {
            record: "journal record",
            why: format!("names table {n}, which this build does not have"),
        }
        .into()),
    }
}

/// A record queued for the journal.
struct Queued {
    seq: u64,
    bytes: Vec<u8>,
    /// It names chunks whose bytes are only in the data file: that file's sync must come
    /// before the record is written.
    needs_data: bool,
}

struct State {
    /// The number the next transaction gets, and the newest record queued.
    next_seq: u64,
    pushed: u64,
    queue: VecDeque<Queued>,
    queued_bytes: usize,
    /// Every record numbered up to this is in the journal file (or covered by a
    /// checkpoint), and up to `synced` durable.
    written: u64,
    synced: u64,
    /// Where the next write goes (a block boundary).
    write_off: u64,
    /// The records in the last block written (from its start), when that write was not
    /// synced and ended inside the block: the next write starts at that block again,
    /// rewriting them first, so records written one at a time without a sync (namespace
    /// changes, `make_written`) share blocks instead of taking 4 KiB each. Empty once a
    /// sync covered them (the block may then hold records acknowledged as durable, which no
    /// write may touch), after a checkpoint, and after a write that ended on a block's end.
    /// At most `JOURNAL_BLOCK` bytes.
    tail: Vec<u8>,
    /// Bytes and transactions since the last checkpoint (what `checkpoint_due` weighs).
    since_bytes: u64,
    since_txns: u64,
    /// A checkpoint numbered this is being committed: nothing is written until it is
    /// (records after it go to offset 0, records before it are covered by it).
    checkpointing: Option<u64>,
    /// The checkpoint numbered this is durable: the next write starts at offset 0 and
    /// leaves out records numbered up to it.
    restart_after: Option<u64>,
    /// A thread is writing (and syncing) records.
    flushing: bool,
    /// Syncs of the journal made (`Stats::commits.durable`).
    syncs: u64,
}

/// The journal of a space (see the module doc).
pub struct Journal {
    dev: Arc<dyn Device>,
    /// This open's id (`JOURNAL_ID`).
    pub(crate) id: u64,
    st: Mutex<State>,
    changed: Condvar,
    /// The data file's sync (the store's `flush_sync`), for records whose chunks are only
    /// there; set once the store exists.
    data_sync: OnceLock<Box<dyn Fn() -> Result<()> + Send + Sync>>,
    failed: Arc<Failure>,
}

/// How far a flush goes.
#[derive(Clone, Copy)]
enum Until {
    /// Every record numbered up to this is durable.
    Synced(u64),
    /// ... is in the journal file, synced or not.
    Written(u64),
    /// The queue is under `QUEUE_BYTES`.
    Bounded,
}

/// What a write of queued records does after the write.
#[derive(Clone, Copy, PartialEq, Eq)]
enum After {
    /// Syncs the journal.
    Sync,
    /// Starts the write's writeback (`Device::start_writeback`), for a sync soon after.
    Writeback,
    /// Nothing: the kernel writes the pages back when it will, or a later sync does.
    Nothing,
}

/// What a flush came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flushed {
    Done,
    /// The records do not fit in the journal before a checkpoint: the caller makes one
    /// (it covers them).
    Full,
}

impl Journal {
    /// The journal on `dev`, after the table's record `last` (everything the file holds
    /// numbered up to `last` is in the table, or was never acknowledged).
    pub(crate) fn new(dev: Arc<dyn Device>, id: u64, last: u64, failed: Arc<Failure>) -> Journal {
        Journal {
            dev,
            id,
            st: Mutex::new(State {
                next_seq: last + 1,
                pushed: last,
                queue: VecDeque::new(),
                queued_bytes: 0,
                written: last,
                synced: last,
                write_off: 0,
                tail: Vec::new(),
                since_bytes: 0,
                since_txns: 0,
                checkpointing: None,
                restart_after: None,
                flushing: false,
                syncs: 0,
            }),
            changed: Condvar::new(),
            data_sync: OnceLock::new(),
            failed,
        }
    }

    pub(crate) fn set_data_sync(&self, f: Box<dyn Fn() -> Result<()> + Send + Sync>) {
        let _ = self.data_sync.set(f);
    }

    /// The next record's number. Called under redb's writer, so numbers follow commits.
    pub(crate) fn reserve(&self) -> u64 {
        let mut s = self.st.lock();
        let seq = s.next_seq;
        s.next_seq += 1;
        s.since_txns += 1;
        seq
    }

    /// Queues record `seq` (numbered by `reserve`, under the same hold of redb's writer).
    pub(crate) fn push(&self, seq: u64, bytes: Vec<u8>, needs_data: bool) {
        let mut s = self.st.lock();
        s.pushed = seq;
        s.queued_bytes += bytes.len();
        s.queue.push_back(Queued {
            seq,
            bytes,
            needs_data,
        });
    }

    /// The newest record queued.
    pub(crate) fn last(&self) -> u64 {
        self.st.lock().pushed
    }

    /// The data file's sync (before a checkpoint: the chunks records carried are only
    /// there from then on).
    pub(crate) fn sync_data(&self) -> Result<()> {
        match self.data_sync.get() {
            Some(f) => f(),
            None => Ok(()),
        }
    }

    pub(crate) fn is_durable(&self, seq: u64) -> bool {
        self.st.lock().synced >= seq
    }

    pub(crate) fn syncs(&self) -> u64 {
        self.st.lock().syncs
    }

    /// Whether enough went into the journal since the last checkpoint to make one.
    pub(crate) fn checkpoint_due(&self) -> bool {
        let s = self.st.lock();
        s.checkpointing.is_none()
            && (s.since_bytes >= CHECKPOINT_BYTES || s.since_txns >= CHECKPOINT_TXNS)
    }

    /// Whether records were committed since the last checkpoint.
    pub(crate) fn dirty(&self) -> bool {
        self.st.lock().since_txns > 0
    }

    /// Checkpoint `seq` is about to commit: hold every write until it has.
    pub(crate) fn checkpoint_begin(&self, seq: u64) {
        let mut s = self.st.lock();
        while s.flushing {
            self.changed.wait(&mut s);
        }
        s.checkpointing = Some(seq);
    }

    /// Checkpoint `seq` committed (`ok`) or failed (the space is failed then).
    pub(crate) fn checkpoint_end(&self, seq: u64, ok: bool) {
        log::debug!("journal checkpoint {seq}: committed {ok}");
        let mut s = self.st.lock();
        s.checkpointing = None;
        if ok {
            s.synced = s.synced.max(seq);
            s.written = s.written.max(seq);
            s.restart_after = Some(seq);
            s.tail.clear();
            s.since_bytes = 0;
            s.since_txns = 0;
            while s.queue.front().is_some_and(|q| q.seq <= seq) {
                let q = s.queue.pop_front().expect("front");
                s.queued_bytes -= q.bytes.len();
            }
        }
        self.changed.notify_all();
    }

    /// Writes the queued records out without a sync once they pass `QUEUE_BYTES`.
    pub(crate) fn bound_queue(&self) -> Result<Flushed> {
        if self.st.lock().queued_bytes < QUEUE_BYTES {
            return Ok(Flushed::Done);
        }
        self.flush(Until::Bounded)
    }

    /// Makes every record numbered up to `upto` durable.
    pub(crate) fn make_durable(&self, upto: u64) -> Result<Flushed> {
        self.flush(Until::Synced(upto))
    }

    /// Writes every record numbered up to `upto` into the journal file, without a sync (or
    /// finds it written, or covered by a checkpoint). The daemon's death then keeps them
    /// (they are in the kernel's page cache, which the next open reads), a power loss only
    /// once a later sync made them durable: what a namespace change of the default mode
    /// waits for before it is acknowledged. Waits for a write or a checkpoint under way
    /// (the records it did not take are written after it).
    pub(crate) fn make_written(&self, upto: u64) -> Result<Flushed> {
        self.flush(Until::Written(upto))
    }

    /// Writes the queued records (and syncs them, for `Until::Synced`) until `until` holds.
    fn flush(&self, until: Until) -> Result<Flushed> {
        let mut s = self.st.lock();
        loop {
            if self.failed.is_set() {
                return Err(Error::Failed);
            }
            let done = match until {
                Until::Synced(u) => s.synced >= u,
                Until::Written(u) => s.written >= u,
                Until::Bounded => s.queued_bytes < QUEUE_BYTES,
            };
            if done {
                return Ok(Flushed::Done);
            }
            if s.flushing || s.checkpointing.is_some() {
                self.changed.wait(&mut s);
                continue;
            }
            let after = match until {
                Until::Synced(_) => After::Sync,
                Until::Bounded => After::Writeback,
                // Left to the kernel: starting a namespace change's block on its way to
                // the disk cost 40-60 us more of the daemon's CPU per change (mkdir,
                // rename, unlink, 2-core VM), and the next close's sync writes it anyway.
                Until::Written(_) => After::Nothing,
            };
            if self.write_queued(&mut s, after)? == Flushed::Full {
                return Ok(Flushed::Full);
            }
        }
    }

    /// Writes the queued records now, without a sync, and starts their writeback, unless
    /// another thread is writing or a checkpoint is being made (then it leaves them queued
    /// and returns at once: it never waits). Called by a commit that a close will wait
    /// for, right after queueing its record and before redb's commit: the record's write
    /// to the disk then runs during that commit, and the close's sync after it waits only
    /// for the disk's cache flush (on the project's VM a 4 KiB write then sync cost about
    /// 100 us, of which about half the write). Records whose chunks are only in the data
    /// file are left to the flush, which syncs that file first. The caller holds redb's
    /// writer meanwhile, so a page-cache write the kernel throttles (dirty pages over its
    /// limit) or a full disk queue delays the table's other transactions too, where before
    /// it delayed only the closes waiting for the flush: `WRITE_AHEAD_BYTES` keeps the write
    /// small.
    pub(crate) fn write_ahead(&self) -> Result<()> {
        let mut s = self.st.lock();
        if s.flushing
            || s.checkpointing.is_some()
            || s.queue.is_empty()
            || s.queued_bytes > WRITE_AHEAD_BYTES
            || s.queue.iter().any(|q| q.needs_data)
        {
            return Ok(());
        }
        // Full: the records stay queued, and the close's flush asks for a checkpoint.
        self.write_queued(&mut s, After::Writeback).map(|_| ())
    }

    /// Writes every queued record in one write, then does `after`, as the one thread
    /// writing (`flushing`, held while the state's lock is let go for the I/O).
    fn write_queued(
        &self,
        s: &mut parking_lot::MutexGuard<'_, State>,
        after: After,
    ) -> Result<Flushed> {
        let sync = after == After::Sync;
        s.flushing = true;
        let mut batch: Vec<Queued> = s.queue.drain(..).collect();
        s.queued_bytes = 0;
        let restart = s.restart_after;
        if let Some(c) = restart {
            batch.retain(|q| q.seq > c);
        }
        let restarting = restart.is_some() && !batch.is_empty();
        let off = if restarting { 0 } else { s.write_off };
        // The unsynced records of the last block go first, where that block starts; a sync
        // with nothing to write covers them.
        let mut prefix = std::mem::take(&mut s.tail);
        if restarting || (batch.is_empty() && sync) {
            prefix.clear();
        }
        let start = if prefix.is_empty() {
            off
        } else {
            off - JOURNAL_BLOCK
        };
        let r = parking_lot::MutexGuard::unlocked(s, || {
            let r = self.write_batch(&prefix, &batch, start, sync);
            if let (Ok(Some((len @ 1.., _))), After::Writeback) = (&r, after) {
                self.dev.start_writeback(start, *len);
            }
            r
        });
        s.flushing = false;
        self.changed.notify_all();
        match r {
            Ok(Some((len, tail))) => {
                if let Some(last) = batch.last() {
                    s.written = s.written.max(last.seq);
                    if restart.is_some() {
                        s.restart_after = None;
                    }
                }
                // A write of nothing (`len` 0) after a prefix leaves the offset where it was.
                s.write_off = if restarting {
                    len
                } else {
                    s.write_off.max(start + len)
                };
                s.since_bytes += (start + len).saturating_sub(off);
                s.tail = if sync { Vec::new() } else { tail };
                if sync {
                    s.synced = s.synced.max(s.written);
                    s.syncs += 1;
                }
                Ok(Flushed::Done)
            }
            Ok(None) => {
                // Did not fit: back to the queue, in order, for after the checkpoint (which
                // covers the tail's records too).
                s.tail = prefix;
                for q in batch.into_iter().rev() {
                    s.queued_bytes += q.bytes.len();
                    s.queue.push_front(q);
                }
                Ok(Flushed::Full)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes `prefix` (the unsynced records of the block at `off`, or nothing) and then
    /// `batch` at `off`, padded to `JOURNAL_BLOCK`, and syncs with `sync`; the data file
    /// first if a record needs it. The bytes written and the records of its last block
    /// when it ends inside one (the next write's prefix, unless synced). Ok(None): it does
    /// not fit.
    fn write_batch(
        &self,
        prefix: &[u8],
        batch: &[Queued],
        off: u64,
        sync: bool,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        if batch.iter().any(|q| q.needs_data) {
            self.sync_data()?;
        }
        if batch.is_empty() {
            if sync {
                self.watch(self.dev.sync())?;
            }
            return Ok(Some((0, prefix.to_vec())));
        }
        let len = prefix.len() + batch.iter().map(|q| q.bytes.len()).sum::<usize>();
        let padded = (len as u64).div_ceil(JOURNAL_BLOCK) * JOURNAL_BLOCK;
        if off + padded > self.dev.len() {
            return Ok(None);
        }
        let mut buf = Vec::with_capacity(padded as usize);
        buf.extend_from_slice(prefix);
        for q in batch {
            buf.extend_from_slice(&q.bytes);
        }
        let tail = buf[len - len % JOURNAL_BLOCK as usize..].to_vec();
        buf.resize(padded as usize, 0);
        log::trace!(
            "journal write at {off}: records {}..={} ({} bytes, {} of them rewritten), sync \
             {sync}",
            batch[0].seq,
            batch[batch.len() - 1].seq,
            buf.len(),
            prefix.len()
        );
        self.watch(self.dev.write_at(&buf, off))?;
        if sync {
            self.watch(self.dev.sync())?;
        }
        Ok(Some((padded, tail)))
    }

    fn watch<T>(&self, r: crate::error::DevResult<T>) -> Result<T> {
        r.map_err(|e| {
            if self
                .failed
                .raise(format!("a journal write or sync failed: {e}"))
            {
                log::error!("journal I/O failed, refusing further writes until remount: {e}");
            }
            Error::from(crate::error::Fault::into_io(e))
        })
    }
}

/// What `replay` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Records applied, and the chunk bytes they wrote into the data file.
    pub records: u64,
    pub chunk_bytes: u64,
    /// The newest record the table holds now: the journal goes on after it.
    pub last: u64,
    /// The journal's new id: records written before this open no longer verify.
    pub id: u64,
}

/// Reads the records of journal `id` after `from` in `dev`: the run of verified records
/// numbered one after the other from offset 0 (the journal starts over there after every
/// checkpoint), until one is missing, torn, of another open or out of order; those
/// numbered after `from` are returned. The table may hold records past its last
/// checkpoint (redb can keep a commit made without a sync), so the run may start at or
/// before `from`, never after `from + 1`.
pub(crate) fn read_records(dev: &dyn Device, id: u64, from: u64) -> Result<Vec<rec::Payload>> {
    let end = dev.len();
    let mut off = 0u64;
    let mut prev: Option<u64> = None;
    let mut out = Vec::new();
    while off + JOURNAL_HEADER as u64 <= end {
        let mut head = [0u8; JOURNAL_HEADER];
        dev.read_at(&mut head, off)
            .map_err(crate::error::Fault::into_io)?;
        // A record starts with its magic (never a zero byte): a zero here is the padding
        // after a write's last record (which may be shorter than a header, the next
        // write's record after it), or at a block's start the journal's end.
        if head[0] == 0 {
            if off.is_multiple_of(JOURNAL_BLOCK) {
                break;
            }
            off = off.next_multiple_of(JOURNAL_BLOCK);
            continue;
        }
        match rec::decode_header(&head) {
            Header::Zero | Header::Other => break,
            Header::Record { len, seq, sum } => {
                let len = len as u64;
                let in_order = match prev {
                    Some(p) => seq == p + 1,
                    None => seq <= from + 1,
                };
                if !in_order || off + JOURNAL_HEADER as u64 + len > end {
                    break;
                }
                let mut payload = vec![0u8; len as usize];
                dev.read_at(&mut payload, off + JOURNAL_HEADER as u64)
                    .map_err(crate::error::Fault::into_io)?;
                if !rec::verify(id, &head, &payload, &sum) {
                    break;
                }
                if seq > from {
                    out.push(rec::decode_payload(&payload)?);
                }
                prev = Some(seq);
                off += JOURNAL_HEADER as u64 + len;
            }
        }
    }
    Ok(out)
}

/// Applies the journal's records after the table's last checkpoint: the chunk bytes they
/// carry written into the data file where their records say (read, patched and written
/// back a block at a time: `place` writes whole blocks), synced, then their rows, in one
/// durable transaction that also gives the journal a new id (`JOURNAL_ID`), so nothing
/// written to it before this open is ever taken for a record again.
pub(crate) fn replay(
    db: &redb::Database,
    dev: &dyn Device,
    place: &dyn Placement,
) -> Result<Replayed> {
    let (from, id) = {
        let r = db.begin_read()?;
        match r.open_table(COUNTERS) {
            Ok(t) => (
                t.get(JOURNAL_SEQ)?.map(|v| v.value()).unwrap_or(0),
                t.get(JOURNAL_ID)?.map(|v| v.value()).unwrap_or(0),
            ),
            Err(redb::TableError::TableDoesNotExist(_)) => (0, 0),
            Err(e) => return Err(e.into()),
        }
    };
    let records = read_records(dev, id, from)?;
    log::debug!(
        "journal replay after record {from} (id {id:x}): {} records",
        records.len()
    );
    let mut done = Replayed {
        last: from + records.len() as u64,
        id: new_id(id),
        ..Default::default()
    };
    let seg = place.segment_bytes();
    let align = place.write_align() as u64;
    for r in &records {
        for c in &r.chunks {
            write_patched(place, seg, align, c)?;
            done.chunk_bytes += c.bytes.len() as u64;
        }
    }
    if done.chunk_bytes > 0 {
        place.sync().map_err(crate::error::Fault::into_io)?;
    }
    let mut txn = db.begin_write()?;
    txn.set_two_phase_commit(true);
    for r in &records {
        for row in &r.rows {
            apply(&txn, row)?;
        }
        done.records += 1;
    }
    {
        let mut c = txn.open_table(COUNTERS)?;
        c.insert(JOURNAL_SEQ, done.last)?;
        c.insert(JOURNAL_ID, done.id)?;
    }
    txn.commit()?;
    Ok(done)
}

/// A journal id unlike `old` (and, with the time and process in it, unlike any before).
fn new_id(old: u64) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&old.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    let id = u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8"));
    if id == old {
        id ^ 1
    } else {
        id
    }
}

/// Writes a chunk's bytes at its data offset: the blocks it touches are read, patched and
/// written whole.
fn write_patched(place: &dyn Placement, seg: u64, align: u64, c: &InlineChunk) -> Result<()> {
    let start = c.offset / align * align;
    let end = (c.offset + c.bytes.len() as u64).next_multiple_of(align);
    if start / seg != (end - 1) / seg {
        return Err(Corruption::Record {
            record: "journal record",
            why: format!("a chunk at {} crosses a segment boundary", c.offset),
        }
        .into());
    }
    let at = Location::of(crate::format::DataOffset(start), seg);
    let mut buf = crate::device::IoBuf::new();
    buf.extend_zeros((end - start) as usize);
    place
        .read(at, buf.as_mut_slice())
        .map_err(crate::error::Fault::into_io)?;
    let from = (c.offset - start) as usize;
    buf.as_mut_slice()[from..from + c.bytes.len()].copy_from_slice(&c.bytes);
    place
        .write(at, buf.as_slice())
        .map_err(crate::error::Fault::into_io)?;
    Ok(())
}
