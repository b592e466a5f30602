//! The shared namespace's merge rules (FORMAT.md "Shared namespace"): what every node sees,
//! computed alike on every node from every slot's records. Pure functions over the slots'
//! views, so the rules are tested without a mount (below).
//!
//! - An entry `(parent, name)` is the record with the highest `(stamp, slot)` among every
//!   slot's records of it; a tombstone there means no entry. Changes of one name are
//!   serialised across nodes (`ckptfs_engine::nslock`) and each one's stamp is above what
//!   it saw, so the highest record is the last change.
//! - An object's place is the one record naming it that is also the entry at its key: an
//!   object renamed away is named by the new place's record, and the old place's record
//!   lost to the rename's tombstone.
//! - An object's versions (one or more per slot) give its attributes: mode and owner from
//!   the version that set them last (`attr_stamp`), times from the one that set them last
//!   (`times_stamp`). A regular file's versions are layers of its bytes, painted oldest
//!   (`created`) first, each cut at the shortest truncate other versions made after it
//!   started (`clip`); its size is the largest cut layer.

use ckptfs_engine::face::{Binding, InodeId, SlotId, Timestamp};
use ckptfs_engine::face::{PubVersion, SlotView};
use std::collections::BTreeMap;

/// Every slot's view, this node's own included.
pub struct Views<'a> {
    pub list: Vec<(SlotId, &'a SlotView)>,
}

/// One layer of a regular file: a version and how much of it shows.
#[derive(Clone, Copy, Debug)]
pub struct Layer<'a> {
    pub slot: SlotId,
    pub version: &'a PubVersion,
    /// Bytes at or past this offset of the layer do not show (u64::MAX: uncut).
    pub cut: u64,
}

impl Layer<'_> {
    pub fn size(&self) -> u64 {
        self.version.node.size.min(self.cut)
    }
}

impl<'a> Views<'a> {
    /// The record that decides `(parent, name)`, tombstone or not.
    pub fn decide(&self, parent: InodeId, name: &[u8]) -> Option<(SlotId, Binding)> {
        let key = (parent, name.to_vec());
        self.list
            .iter()
            .filter_map(|(s, v)| v.bindings.get(&key).map(|b| (*s, *b)))
            .max_by_key(|(s, b)| (b.stamp, *s))
    }

    /// The entry at `(parent, name)`, if there is one.
    pub fn entry(&self, parent: InodeId, name: &[u8]) -> Option<(SlotId, Binding)> {
        self.decide(parent, name).filter(|(_, b)| !b.is_tombstone())
    }

    /// Whether a slot other than `me` has a record of `(parent, name)`: then a removal by
    /// `me` must leave a tombstone to hide it.
    pub fn others_have(&self, me: SlotId, parent: InodeId, name: &[u8]) -> bool {
        let key = (parent, name.to_vec());
        self.list
            .iter()
            .any(|(s, v)| *s != me && v.bindings.contains_key(&key))
    }

    /// The entries of directory `dir`, by name.
    pub fn list(&self, dir: InodeId) -> BTreeMap<Vec<u8>, Binding> {
        let mut names: std::collections::BTreeSet<&Vec<u8>> = Default::default();
        for (_, v) in &self.list {
            if let Some(n) = v.by_parent.get(&dir) {
                names.extend(n.iter());
            }
        }
        names
            .into_iter()
            .filter_map(|n| self.entry(dir, n).map(|(_, b)| (n.clone(), b)))
            .collect()
    }

    /// Where object `obj` is: its parent and name. None for an object no entry names (the
    /// root has no place either).
    pub fn location(&self, obj: InodeId) -> Option<(InodeId, Vec<u8>)> {
        for (_, v) in &self.list {
            let Some(places) = v.by_child.get(&obj) else {
                continue;
            };
            for (p, n) in places {
                if self.entry(*p, n).is_some_and(|(_, b)| b.child == obj) {
                    return Some((*p, n.clone()));
                }
            }
        }
        None
    }

    /// Whether object `obj` is in the tree (the root always is).
    pub fn exists(&self, obj: InodeId) -> bool {
        obj == InodeId::ROOT || self.location(obj).is_some()
    }

    /// Whether directory `anc` is `obj` or one of the directories above it.
    pub fn is_ancestor(&self, anc: InodeId, mut obj: InodeId) -> bool {
        // Bounded by the depth of a tree without cycles; the bound keeps a damaged record
        // set (a cycle) from looping.
        for _ in 0..4096 {
            if obj == anc {
                return true;
            }
            match self.location(obj) {
                Some((p, _)) => obj = p,
                None => return false,
            }
        }
        false
    }

    /// Every version of `obj`, oldest layer first.
    pub fn versions(&self, obj: InodeId) -> Vec<(SlotId, &'a PubVersion)> {
        let mut out: Vec<(SlotId, &PubVersion)> = Vec::new();
        for (s, v) in &self.list {
            if let Some(ids) = v.of.get(&obj) {
                for id in ids {
                    if let Some(pv) = v.versions.get(id) {
                        out.push((*s, pv));
                    }
                }
            }
        }
        out.sort_by_key(|(s, v)| (v.meta.created, *s, v.id()));
        out
    }

    /// The newest change of an entry of `dir` (its modification time).
    pub fn dir_stamp(&self, dir: InodeId) -> u64 {
        self.list
            .iter()
            .filter_map(|(_, v)| v.parent_stamp.get(&dir).copied())
            .max()
            .unwrap_or(0)
    }
}

/// A file's layers with their cuts (oldest first).
pub fn layers<'a>(versions: &[(SlotId, &'a PubVersion)]) -> Vec<Layer<'a>> {
    versions
        .iter()
        .map(|(slot, v)| {
            let cut = versions
                .iter()
                .filter(|(_, o)| o.id() != v.id())
                .filter(|(_, o)| o.meta.clip_stamp != 0 && o.meta.clip_stamp > v.meta.created)
                .map(|(_, o)| o.meta.clip_len)
                .min()
                .unwrap_or(u64::MAX);
            Layer {
                slot: *slot,
                version: v,
                cut,
            }
        })
        .collect()
}

/// The file's size: the largest layer as cut.
pub fn size(layers: &[Layer]) -> u64 {
    layers.iter().map(Layer::size).max().unwrap_or(0)
}

/// Attributes merged from an object's versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

pub fn attributes(versions: &[(SlotId, &PubVersion)]) -> Option<Merged> {
    let owner = versions
        .iter()
        .max_by_key(|(s, v)| (v.meta.attr_stamp, *s, v.id()))?
        .1;
    let times = versions
        .iter()
        .max_by_key(|(s, v)| (v.meta.times_stamp, *s, v.id()))?
        .1;
    let ctime = versions
        .iter()
        .map(|(_, v)| v.node.ctime)
        .max()
        .unwrap_or(times.node.ctime);
    Some(Merged {
        perm: owner.node.perm,
        uid: owner.node.uid,
        gid: owner.node.gid,
        mtime: times.node.mtime,
        ctime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckptfs_engine::face::{NodeKind, VersionMeta};
    use ckptfs_engine::face::{PubNode, Record};

    fn bind(child: u64, stamp: u64) -> Binding {
        Binding {
            child: InodeId(child),
            stamp,
            kind: if child == 0 {
                NodeKind::File
            } else {
                NodeKind::Dir
            },
        }
    }

    fn view(recs: Vec<Record>) -> SlotView {
        let mut v = SlotView::default();
        v.apply(recs);
        v
    }

    fn version(id: u64, of: u64, created: u64, size: u64, clip: (u64, u64)) -> PubVersion {
        PubVersion {
            meta: VersionMeta {
                of: InodeId(of),
                created,
                attr_stamp: created,
                times_stamp: created,
                clip_stamp: clip.0,
                clip_len: clip.1,
            },
            node: PubNode {
                ino: InodeId(id),
                kind: NodeKind::File,
                perm: 0o600 + id as u32,
                uid: 0,
                gid: 0,
                mtime: Timestamp::default(),
                ctime: Timestamp::default(),
                size,
                rev: 0,
                target: Vec::new(),
                extents: Vec::new().into(),
            },
        }
    }

    fn r(p: u64, n: &str, b: Binding) -> Record {
        Record::Bind(InodeId(p), n.as_bytes().to_vec(), b)
    }

    #[test]
    fn the_highest_record_decides_and_a_tombstone_removes() {
        let a = view(vec![r(1, "x", bind(10, 5)), r(1, "y", bind(11, 5))]);
        let b = view(vec![r(1, "x", bind(0, 7)), r(1, "z", bind(12, 6))]);
        let v = Views {
            list: vec![(SlotId(0), &a), (SlotId(1), &b)],
        };
        assert!(v.entry(InodeId(1), b"x").is_none(), "removed by slot 1");
        assert!(v.others_have(SlotId(0), InodeId(1), b"x"));
        assert!(!v.others_have(SlotId(0), InodeId(1), b"y"));
        let names: Vec<_> = v.list(InodeId(1)).into_keys().collect();
        assert_eq!(names, vec![b"y".to_vec(), b"z".to_vec()]);
        // Equal stamps: the higher slot wins, on every node alike.
        let c = view(vec![r(1, "y", bind(13, 5))]);
        let v = Views {
            list: vec![(SlotId(0), &a), (SlotId(2), &c)],
        };
        assert_eq!(v.entry(InodeId(1), b"y").unwrap().1.child, InodeId(13));
    }

    #[test]
    fn a_renamed_directory_takes_every_slots_entries_along() {
        // Slot 0 made /run/tmp (object 20); slot 1 wrote /run/tmp/rank1 into it; slot 0
        // renamed tmp to step: one new record and a tombstone, both slot 0's.
        let s0 = view(vec![
            r(1, "run", bind(2, 1)),
            r(2, "tmp", bind(20, 2)),
            r(20, "rank0", bind(21, 3)),
            r(2, "tmp", bind(0, 9)),
            r(2, "step", bind(20, 9)),
        ]);
        let s1 = view(vec![r(20, "rank1", bind(1 << 40 | 5, 4))]);
        let v = Views {
            list: vec![(SlotId(0), &s0), (SlotId(1), &s1)],
        };
        assert!(v.entry(InodeId(2), b"tmp").is_none());
        let step = v.entry(InodeId(2), b"step").unwrap().1.child;
        let names: Vec<_> = v.list(step).into_keys().collect();
        assert_eq!(names, vec![b"rank0".to_vec(), b"rank1".to_vec()]);
        assert_eq!(
            v.location(InodeId(1 << 40 | 5)),
            Some((InodeId(20), b"rank1".to_vec()))
        );
        assert_eq!(
            v.location(InodeId(20)),
            Some((InodeId(2), b"step".to_vec()))
        );
        assert!(v.is_ancestor(InodeId(2), InodeId(1 << 40 | 5)));
        assert!(!v.is_ancestor(InodeId(21), InodeId(20)));
    }

    #[test]
    fn an_object_renamed_by_another_slot_is_in_one_place_only() {
        let s0 = view(vec![r(1, "f", bind(30, 1))]);
        let s1 = view(vec![r(1, "f", bind(0, 5)), r(1, "g", bind(30, 5))]);
        let v = Views {
            list: vec![(SlotId(0), &s0), (SlotId(1), &s1)],
        };
        assert_eq!(v.location(InodeId(30)), Some((InodeId(1), b"g".to_vec())));
        assert_eq!(v.list(InodeId(1)).len(), 1);
        // Removed by a third slot: nowhere, so its owner may retire it.
        let s2 = view(vec![r(1, "g", bind(0, 8))]);
        let v = Views {
            list: vec![(SlotId(0), &s0), (SlotId(1), &s1), (SlotId(2), &s2)],
        };
        assert!(!v.exists(InodeId(30)));
    }

    #[test]
    fn layers_are_cut_by_later_truncates_of_other_versions() {
        // Object 40: slot 0's layer (created 1, 100 bytes), slot 1's layer (created 5, 50
        // bytes); slot 2 truncated to 10 at 7 with an empty layer of its own (10 bytes).
        let a = version(40, 40, 1, 100, (0, 0));
        let b = version(41, 40, 5, 50, (0, 0));
        let c = version(42, 40, 7, 10, (7, 10));
        let vs = vec![(SlotId(0), &a), (SlotId(1), &b), (SlotId(2), &c)];
        let l = layers(&vs);
        assert_eq!(
            l.iter().map(|l| l.cut).collect::<Vec<_>>(),
            [10, 10, u64::MAX]
        );
        assert_eq!(size(&l), 10);
        // A later layer is not cut by an earlier truncate, and grows the file.
        let d = version(43, 40, 9, 300, (0, 0));
        let vs = vec![
            (SlotId(0), &a),
            (SlotId(1), &b),
            (SlotId(2), &c),
            (SlotId(0), &d),
        ];
        assert_eq!(size(&layers(&vs)), 300);
        // A truncate that extends: the truncating layer's own size.
        let e = version(44, 40, 11, 1000, (11, 1000));
        let vs = vec![(SlotId(0), &a), (SlotId(1), &e)];
        assert_eq!(size(&layers(&vs)), 1000);
        // The newest attribute change decides the mode.
        let m = attributes(&vs).unwrap();
        assert_eq!(m.perm, 0o600 + 44);
    }
}
