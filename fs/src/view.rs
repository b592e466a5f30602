//! The read-only revision view, `/.ckptfs/revisions/<path>/<revision id>`.
//!
//! It lives under a name reserved at the root (`.ckptfs`), which users cannot create, so it
//! cannot collide with their files. Its inodes are virtual (the top two bits of the inode
//! number say which kind), so they never collide with real ones. It holds only directories
//! and read-only regular files: no symlinks, so nothing in it can name anything outside it.
//! Directories of the live tree appear as directories; each regular file appears as a
//! directory of its listed revisions. Modes follow the live file's read bits, so the view
//! shows nobody more than the file itself does.

use super::{Attr, DirItem, Error, Fs, HandleId, OpenNode, Result};
use ckptfs_engine::face::{HistoryId, InodeId, InodeRecord, NodeKind, RevisionId, Timestamp};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The reserved name at the root.
pub const CTL_NAME: &[u8] = b".ckptfs";
const REVISIONS_NAME: &[u8] = b"revisions";
const HISTORIES_NAME: &[u8] = b"histories";
const ADVICE_NAME: &[u8] = b"advice";
const VIEW_DIR: u64 = 2;
const REV_FILE: u64 = 3;
/// Within VIEW_DIR inodes, this bit marks `/.ckptfs/histories/<id>` (0: the histories dir).
const HIST_BIT: u64 = 1 << 61;

/// Within VIEW_DIR inodes, this bit marks the view's single files (real inode numbers stay
/// far below it).
const SPECIAL_BIT: u64 = 1 << 60;

/// `/.ckptfs` itself.
pub const CTL: InodeId = InodeId(VIEW_DIR << 62);

/// `/.ckptfs/advice`: `ckptfs advise` as a file, for job scripts (read-only; its text is
/// computed at open).
pub const ADVICE: InodeId = InodeId((VIEW_DIR << 62) | SPECIAL_BIT | 1);

pub fn is_virtual(ino: InodeId) -> bool {
    ino.0 >> 62 >= VIEW_DIR
}

fn hist_dir(hid: HistoryId) -> InodeId {
    InodeId((VIEW_DIR << 62) | HIST_BIT | hid.0)
}

fn view_dir(real: InodeId) -> InodeId {
    InodeId((VIEW_DIR << 62) | real.0)
}

fn rev_file(rev: RevisionId) -> InodeId {
    InodeId((REV_FILE << 62) | rev.0)
}

enum Virt {
    Ctl,
    /// `/.ckptfs/histories` (None) or one history by id, live or unlinked.
    Hist(Option<HistoryId>),
    /// The view of a live directory or file.
    Of(InodeId),
    Rev(RevisionId),
    Advice,
}

fn decode(ino: InodeId) -> Option<Virt> {
    let low = ino.0 & ((1 << 62) - 1);
    match ino.0 >> 62 {
        VIEW_DIR if low == 0 => Some(Virt::Ctl),
        VIEW_DIR if low == SPECIAL_BIT | 1 => Some(Virt::Advice),
        VIEW_DIR if low & SPECIAL_BIT != 0 && low & HIST_BIT == 0 => None,
        VIEW_DIR if low & HIST_BIT != 0 => {
            let hid = low & !HIST_BIT;
            Some(Virt::Hist((hid != 0).then_some(HistoryId(hid))))
        }
        VIEW_DIR => Some(Virt::Of(InodeId(low))),
        REV_FILE => Some(Virt::Rev(RevisionId(low))),
        _ => None,
    }
}

/// Read bits of `perm`, with search bits where reading is allowed (for directories).
fn read_only(perm: u32, dir: bool) -> u32 {
    let r = perm & 0o444;
    if dir {
        r | (r >> 2)
    } else {
        r
    }
}

/// The view of a live directory keeps exactly its read and search bits, so the view lists
/// and reaches no more than the live tree; the directory of a file's revisions may be listed
/// and searched by whoever may read the file.
fn view_dir_perm(like: &InodeRecord) -> u32 {
    match like.kind {
        NodeKind::Dir => like.perm & 0o555,
        _ => read_only(like.perm, true),
    }
}

fn dir_attr(ino: InodeId, like: &InodeRecord) -> Attr {
    Attr {
        ino,
        data_bytes: None,
        rec: InodeRecord {
            kind: NodeKind::Dir,
            perm: view_dir_perm(like),
            nlink: 2,
            size: 0,
            history: HistoryId::NONE,
            target: Vec::new(),
            ..like.clone()
        },
    }
}

impl Fs {
    /// The record the view shows for `real`: in a shared namespace its attributes as every
    /// node sees them, with the history of this slot's file (another slot's file shows no
    /// revisions here: its slot keeps them).
    fn view_record(&self, real: InodeId) -> Result<InodeRecord> {
        let Some(sh) = &self.shared else {
            return self.record(real);
        };
        let mut rec = self.getattr(real)?.rec;
        rec.history = HistoryId::NONE;
        if real != InodeId::ROOT && ckptfs_engine::face::owner_slot(real) == sh.me {
            if let Some(local) = self.space.ns().get_inode(real)? {
                rec.history = local.history;
                rec.nlink = local.nlink;
            }
        }
        Ok(rec)
    }

    /// A revision file shows the extended attributes its revision recorded; the view's
    /// directories have none.
    pub(crate) fn view_xattrs(&self, ino: InodeId) -> Result<ckptfs_engine::face::Xattrs> {
        self.view_getattr(ino)?;
        match decode(ino) {
            Some(Virt::Rev(rev)) => Ok(self.space.ns().revision_xattrs(rev)?),
            _ => Ok(Default::default()),
        }
    }

    pub(crate) fn view_getattr(&self, ino: InodeId) -> Result<Attr> {
        match decode(ino).ok_or(Error::NotFound)? {
            Virt::Ctl => Ok(dir_attr(ino, &self.view_record(InodeId::ROOT)?)),
            Virt::Hist(None) => {
                // A history is reached by id, around the permissions of the directories
                // holding its file, so only root and the root's owner may enter here.
                let root = self.view_record(InodeId::ROOT)?;
                let perm = root.perm & 0o500;
                Ok(dir_attr(ino, &InodeRecord { perm, ..root }))
            }
            Virt::Hist(Some(hid)) => {
                let h = self.space.ns().history(hid).map_err(|_| Error::NotFound)?;
                Ok(dir_attr(ino, &self.history_owner(&h)?))
            }
            Virt::Of(real) => {
                let rec = self.view_record(real)?;
                match rec.kind {
                    NodeKind::Dir | NodeKind::File if rec.nlink > 0 => Ok(dir_attr(ino, &rec)),
                    _ => Err(Error::NotFound),
                }
            }
            Virt::Advice => {
                let root = self.view_record(InodeId::ROOT)?;
                let now = Timestamp::now();
                Ok(Attr {
                    ino,
                    data_bytes: None,
                    rec: InodeRecord {
                        kind: NodeKind::File,
                        perm: read_only(root.perm, false),
                        nlink: 1,
                        // The text is made at open and read with direct I/O, so this
                        // length is only indicative.
                        size: self.advice_text().len() as u64,
                        mtime: now,
                        ctime: now,
                        atime: now,
                        current_rev: RevisionId(0),
                        history: HistoryId::NONE,
                        target: Vec::new(),
                        parent: InodeId(0),
                        ..root
                    },
                })
            }
            Virt::Rev(rev) => {
                let rr = self.space.ns().revision(rev)?.ok_or(Error::NotFound)?;
                let h = self.space.ns().history(rr.history)?;
                let owner = self.history_owner(&h)?;
                Ok(Attr {
                    ino,
                    data_bytes: None,
                    rec: InodeRecord {
                        kind: NodeKind::File,
                        perm: read_only(owner.perm, false),
                        nlink: 1,
                        size: rr.size,
                        mtime: rr.committed,
                        ctime: rr.committed,
                        atime: rr.committed,
                        crtime: rr.committed,
                        current_rev: rev,
                        history: HistoryId::NONE,
                        target: Vec::new(),
                        parent: InodeId(0),
                        ..owner
                    },
                })
            }
        }
    }

    pub(crate) fn view_lookup(&self, parent: InodeId, name: &[u8]) -> Result<Attr> {
        match decode(parent).ok_or(Error::NotFound)? {
            Virt::Ctl if name == REVISIONS_NAME => self.view_getattr(view_dir(InodeId::ROOT)),
            Virt::Ctl if name == HISTORIES_NAME => self.view_getattr(hist_dir(HistoryId::NONE)),
            Virt::Ctl if name == ADVICE_NAME => self.view_getattr(ADVICE),
            Virt::Ctl => Err(Error::NotFound),
            Virt::Hist(None) => {
                // Ids outside 1..2^61 would name the histories dir itself or alias another
                // history's inode number.
                let hid = parse_id(name)?;
                if hid == 0 || hid >= HIST_BIT {
                    return Err(Error::NotFound);
                }
                self.view_getattr(hist_dir(HistoryId(hid)))
            }
            Virt::Hist(Some(hid)) => {
                let id = parse_id(name)?;
                if !self.space.ns().revisions(hid)?.iter().any(|r| r.id.0 == id) {
                    return Err(Error::NotFound);
                }
                self.view_getattr(rev_file(RevisionId(id)))
            }
            Virt::Of(real) => {
                let rec = self.view_record(real)?;
                match rec.kind {
                    NodeKind::Dir => {
                        let child = match self.shared {
                            Some(_) => self.lookup(real, name)?.ino,
                            None => self.space.ns().lookup(real, name)?.ok_or(Error::NotFound)?,
                        };
                        self.view_getattr(self.view_of(child)?)
                    }
                    NodeKind::File if rec.history == HistoryId::NONE => Err(Error::NotFound),
                    NodeKind::File => {
                        let id = parse_id(name)?;
                        let listed = self.space.ns().revisions(rec.history)?;
                        if !listed.iter().any(|r| r.id.0 == id) {
                            return Err(Error::NotFound);
                        }
                        self.view_getattr(rev_file(RevisionId(id)))
                    }
                    _ => Err(Error::NotFound),
                }
            }
            Virt::Rev(_) | Virt::Advice => Err(Error::NotDir),
        }
    }

    pub(crate) fn view_parent(&self, dir: InodeId) -> Result<InodeId> {
        match decode(dir).ok_or(Error::NotFound)? {
            Virt::Ctl => Ok(InodeId::ROOT),
            Virt::Hist(None) => Ok(CTL),
            Virt::Hist(Some(_)) => Ok(hist_dir(HistoryId::NONE)),
            Virt::Of(real) if real == InodeId::ROOT => Ok(CTL),
            Virt::Of(real) => {
                let rec = self.view_record(real)?;
                if rec.kind == NodeKind::Dir && self.shared.is_some() {
                    Ok(view_dir(self.sh_parent(real)?))
                } else if rec.kind == NodeKind::Dir {
                    Ok(view_dir(rec.parent))
                } else {
                    // A file's parent is not recorded; ".." of its revision directory is
                    // the view root, which is always a directory of the view.
                    Ok(view_dir(InodeId::ROOT))
                }
            }
            Virt::Rev(_) | Virt::Advice => Err(Error::NotDir),
        }
    }

    pub(crate) fn view_readdir(
        &self,
        dir: InodeId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DirItem>> {
        match decode(dir).ok_or(Error::NotFound)? {
            Virt::Ctl => Ok([
                (3, view_dir(InodeId::ROOT), REVISIONS_NAME, NodeKind::Dir),
                (4, hist_dir(HistoryId::NONE), HISTORIES_NAME, NodeKind::Dir),
                (5, ADVICE, ADVICE_NAME, NodeKind::File),
            ]
            .into_iter()
            .filter(|(o, _, _, _)| *o > after)
            .map(|(offset, ino, name, kind)| DirItem {
                offset,
                ino,
                kind,
                name: name.to_vec(),
            })
            .collect()),
            Virt::Hist(None) => Ok(self
                .space
                .ns()
                .history_ids(HistoryId(after.saturating_sub(2)), limit)?
                .into_iter()
                .map(|hid| DirItem {
                    offset: hid.0 + 2,
                    ino: hist_dir(hid),
                    kind: NodeKind::Dir,
                    name: hid.to_string().into_bytes(),
                })
                .collect()),
            Virt::Hist(Some(hid)) => Ok(self.revision_items(hid, after, limit)?),
            Virt::Of(real) => {
                let rec = self.view_record(real)?;
                match rec.kind {
                    NodeKind::Dir => {
                        let mut out = Vec::new();
                        let mut cursor = after;
                        // Skip entries the view does not show (symlinks, special files).
                        loop {
                            let batch: Vec<ckptfs_engine::face::DirEntry> = match self.shared {
                                Some(_) => self
                                    .sh_readdir(real, cursor, limit)?
                                    .into_iter()
                                    .map(|d| ckptfs_engine::face::DirEntry {
                                        name: d.name,
                                        ino: d.ino,
                                        cookie: d.offset,
                                    })
                                    .collect(),
                                None => self.space.ns().list_dir(real, cursor, limit)?,
                            };
                            if batch.is_empty() {
                                return Ok(out);
                            }
                            for e in batch {
                                cursor = e.cookie;
                                let k = self.view_record(e.ino)?.kind;
                                if matches!(k, NodeKind::Dir | NodeKind::File) {
                                    out.push(DirItem {
                                        offset: e.cookie,
                                        ino: self.view_of(e.ino)?,
                                        kind: NodeKind::Dir,
                                        name: e.name,
                                    });
                                    if out.len() >= limit {
                                        return Ok(out);
                                    }
                                }
                            }
                        }
                    }
                    NodeKind::File => self.revision_items(rec.history, after, limit),
                    _ => Err(Error::NotFound),
                }
            }
            Virt::Rev(_) | Virt::Advice => Err(Error::NotDir),
        }
    }

    /// The view inode of a live directory, or of a live file: the directory of its history,
    /// which stays the same when a rename replaces the file at that path.
    fn view_of(&self, real: InodeId) -> Result<InodeId> {
        let rec = self.view_record(real)?;
        Ok(match rec.kind {
            NodeKind::File => hist_dir(rec.history),
            _ => view_dir(real),
        })
    }

    fn revision_items(&self, hid: HistoryId, after: u64, limit: usize) -> Result<Vec<DirItem>> {
        // Another slot's file (a shared namespace): its revisions are that slot's.
        if hid == HistoryId::NONE {
            return Ok(Vec::new());
        }
        Ok(self
            .space
            .ns()
            .revisions(hid)?
            .into_iter()
            .filter(|r| r.id.0 + 3 > after)
            .take(limit)
            .map(|r| DirItem {
                offset: r.id.0 + 3,
                ino: rev_file(r.id),
                kind: NodeKind::File,
                name: r.id.0.to_string().into_bytes(),
            })
            .collect())
    }

    /// Whose modes the view of a history shows: its live file's, or, once the path is
    /// unlinked, read access for the owner of the root directory only.
    fn history_owner(&self, h: &ckptfs_engine::face::HistoryRecord) -> Result<InodeRecord> {
        if h.unlinked.is_none() {
            if let Some(r) = self.space.ns().get_inode(h.ino)? {
                return Ok(r);
            }
        }
        let root = self.view_record(InodeId::ROOT)?;
        Ok(InodeRecord {
            kind: NodeKind::File,
            perm: 0o400,
            ..root
        })
    }

    /// Opens a revision file for reading; its revision is pinned against gc while open.
    pub(crate) fn open_view(&self, ino: InodeId, fh: HandleId, write: bool) -> Result<()> {
        if write {
            return Err(Error::ReadOnly);
        }
        if ino == ADVICE {
            self.view_getattr(ino)?;
            let text = Arc::new(self.advice_text().into_bytes());
            self.advice_opens.lock().insert(fh, text);
            return Ok(());
        }
        let Some(Virt::Rev(rev)) = decode(ino) else {
            return Err(Error::IsDir);
        };
        let mut open = self.open.lock();
        let node = match open.nodes.get(&ino) {
            Some(n) => n.clone(),
            None => {
                // Pin, then load: a gc that samples pins after this sees it, and one that
                // already dropped the revision makes the load fail with ENOENT, not EIO later.
                let (base, file) = self.space.pins().pin(None, || {
                    let file = self
                        .space
                        .files()
                        .load_revision(rev)
                        .map_err(|_| Error::NotFound)?;
                    Ok::<_, Error>((rev, file))
                })?;
                let attr = self.view_getattr(ino)?;
                let n = Arc::new(Mutex::new(OpenNode {
                    rec: attr.rec,
                    file,
                    base,
                    opens: 0,
                    writers: 0,
                    handles: HashMap::new(),
                    ahead: ckptfs_engine::face::ReadAhead::default(),
                    clip: None,
                    xattr_epoch: 0,
                    no_caps_at: None,
                }));
                open.nodes.insert(ino, n.clone());
                n
            }
        };
        // Revision files are read-only; the handle is tracked only so that its reads and
        // release reach this node.
        open.add_handle(fh, ino, &node);
        node.lock().opens += 1;
        Ok(())
    }
}

impl Fs {
    /// The text of `/.ckptfs/advice`: the advice, or why there is none yet (no failure
    /// model configured, no checkpoint measured), after the same first line.
    pub fn advice_text(&self) -> String {
        let inputs = match self.space.report().advice_inputs() {
            Ok(i) => i,
            Err(e) => return format!("checkpoint-now: unknown\nerror: {e}\n"),
        };
        match ckptfs_engine::face::advice_report(&inputs, &Default::default()) {
            Ok(r) => ckptfs_engine::face::render_advice(&r),
            Err(e) => format!("checkpoint-now: unknown\nno advice: {e}\n"),
        }
    }

    pub(crate) fn advice_read(&self, fh: HandleId, off: u64, len: usize) -> Result<Vec<u8>> {
        let text = self
            .advice_opens
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(Error::Invalid)?;
        let start = (off as usize).min(text.len());
        let end = start.saturating_add(len).min(text.len());
        Ok(text[start..end].to_vec())
    }
}

/// Only the canonical decimal spelling names an id ("7", not "07" or "+7"), so each view
/// entry has one name.
fn parse_id(name: &[u8]) -> Result<u64> {
    let canonical = !name.is_empty()
        && name.iter().all(u8::is_ascii_digit)
        && (name[0] != b'0' || name.len() == 1);
    std::str::from_utf8(name)
        .ok()
        .filter(|_| canonical)
        .and_then(|s| s.parse().ok())
        .ok_or(Error::NotFound)
}

/// Revision timestamps for listings.
pub fn unix_seconds(t: Timestamp) -> f64 {
    t.secs as f64 + t.nanos as f64 / 1e9
}
