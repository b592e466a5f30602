//! Every on-disk structure, encoded and decoded here and nowhere else: explicit offsets,
//! little-endian, no serde. `engine/FORMAT.md` draws the same layouts; change both together.
//!
//! Decoders take bytes just read from disk and validate them before anything else sees them
//! ("check after reading"); encoders assert a record is valid before it is written.

use crate::error::{Corruption, Error, Result};
pub use crate::ids::*;

mod cursor;
pub mod journal;
pub mod manifest;
pub mod targets;
pub use ckptfs_kernels::float::Transform;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const MAGIC: [u8; 8] = *b"CKPTFS\0\x01";
/// Version 1: the layout below. Version 2: the same, with at least one incompatible feature
/// flag set; a superblock says 2 exactly when it has one, so builds from before the flags
/// (which read version 1 only) refuse such a space instead of misreading it.
pub(crate) const FORMAT_VERSION: u32 = 1;
pub(crate) const FORMAT_VERSION_WITH_INCOMPAT: u32 = 2;
pub(crate) const SUPERBLOCK_LEN: usize = 4096;
const SUPERBLOCK_USED: usize = 64;
/// Feature flags: three u64 at 96..120, blake3 of bytes 0..120 at 120..152. All zero when no
/// flag is set (a superblock written before the flags existed reads as "no features").
const FEATURES_AT: usize = 96;
const FEATURES_SUM_AT: usize = 120;
const FEATURES_END: usize = 152;

/// Feature flags, as ext4 has them. A build refuses to open a space with an `incompat` bit it
/// does not know, opens one with an unknown `ro_compat` bit only read-only, and ignores
/// unknown `compat` bits. FORMAT.md lists which feature sets which bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub compat: u64,
    pub ro_compat: u64,
    pub incompat: u64,
}

impl Features {
    /// Tables `xattrs` and `revision_xattrs`. Older builds ignore them (and leave rows their
    /// gc should have removed, which `ckptfs check` of a newer build reports).
    pub const COMPAT_XATTRS: Features = Features {
        compat: 1,
        ro_compat: 0,
        incompat: 0,
    };
    /// Chunks with codec 2 or 3 (byte shuffle + LZ4): a build without them cannot read the
    /// chunks. Set at format, or before the first such chunk is written (a mount with
    /// `--codec shuffle`, or with the default `lz4` on a space formatted before the storm
    /// rule).
    pub const INCOMPAT_SHUFFLE_CODECS: Features = Features {
        compat: 0,
        ro_compat: 0,
        incompat: 1,
    };
    /// Several slots (`format --slots N`, N > 1): the slot count in the superblock, the
    /// `slots/` directory with the slot headers and one metadata table per slot, and the
    /// data file split into per-slot segment ranges. Set at format only.
    pub(crate) const INCOMPAT_SLOTS: Features = Features {
        compat: 0,
        ro_compat: 0,
        incompat: 2,
    };
    /// Several storage targets (`format --target DIR ... --redundancy M+K`): no data file;
    /// the `targets` and `placement` files in the backing directory, and one preallocated
    /// `ckptfs-target` file in each target directory holding erasure-coded shards. Set at
    /// format only.
    pub(crate) const INCOMPAT_TARGETS: Features = Features {
        compat: 0,
        ro_compat: 0,
        incompat: 4,
    };
    /// The shared namespace of a multi-slot space (FORMAT.md "Shared namespace"): entries
    /// are bindings `(parent object, name) -> object` published by any slot, objects have
    /// global inode numbers (slot in bits 40..), namespace changes are serialised by
    /// intents in the 128-byte hints. Set at format with `INCOMPAT_SLOTS`; a multi-slot
    /// space without it (the path-merged namespace of earlier builds) is refused.
    pub(crate) const INCOMPAT_SHARED_NAMESPACE: Features = Features {
        compat: 0,
        ro_compat: 0,
        incompat: 8,
    };
    /// Chunks with codecs 4..=11 (the float codec: zstd frames of rotated byte planes).
    /// A build without them cannot read the chunks. Set before the first such chunk is
    /// written (`format --codec float`, `mount --codec float`); a space with it mounts with
    /// `float` unless `--codec` says otherwise.
    pub const INCOMPAT_FLOAT_CODEC: Features = Features {
        compat: 0,
        ro_compat: 0,
        incompat: 16,
    };
    /// The journal (`journal` in the backing directory, FORMAT.md "Journal"): closes are
    /// durable through its records, and the metadata table holds them only after the next
    /// checkpoint, so a build without it would open a table missing acknowledged closes. Set
    /// when the journal is made: at format, or at the first read-write open of a
    /// single-slot space formatted before.
    pub const INCOMPAT_JOURNAL: Features = Features {
        compat: 0,
        ro_compat: 0,
        incompat: 32,
    };
    /// Chunk records at `DataOffset::REMOTE`: chunks held only by the space's object-store
    /// tier, fetched on demand (`ckptfs mount s3://...` on an empty directory). A build
    /// without them would read such a record as an offset past the data file's end. Set
    /// before the first such record is written.
    pub const INCOMPAT_REMOTE_CHUNKS: Features = Features {
        compat: 0,
        ro_compat: 0,
        incompat: 64,
    };
    /// Chunks with codecs 12..=15: the float codec's transforms that rotate by three bits
    /// (`Transform::ROTATIONS`). A build that knows only ids 4..=11 would refuse such a chunk
    /// on every read. Set with `INCOMPAT_FLOAT_CODEC` wherever that is set by this build (a
    /// read-write mount with the float codec, a format, a restore of such chunks), so a
    /// space that has it may hold them.
    pub const INCOMPAT_FLOAT_ROTATE3: Features = Features {
        compat: 0,
        ro_compat: 0,
        incompat: 128,
    };
    /// Every flag this build knows.
    pub const KNOWN: Features = Features {
        compat: 1,
        ro_compat: 0,
        incompat: 255,
    };
    /// What `format` sets: the features every new space has. Codecs 2 and 3 among them:
    /// the default policy writes them for chunks LZ4 would crawl through (`codec`), and a
    /// space marked from the start is never rewritten for them at a mount (a multi-slot
    /// space's superblock is shared by every node).
    pub(crate) const AT_FORMAT: Features = Features {
        compat: Features::COMPAT_XATTRS.compat,
        ro_compat: 0,
        incompat: Features::INCOMPAT_SHUFFLE_CODECS.incompat,
    };

    pub fn union(self, o: Features) -> Features {
        Features {
            compat: self.compat | o.compat,
            ro_compat: self.ro_compat | o.ro_compat,
            incompat: self.incompat | o.incompat,
        }
    }

    pub fn contains(self, o: Features) -> bool {
        self.union(o) == self
    }

    /// The bits of `self` this build does not know.
    pub fn unknown(self) -> Features {
        Features {
            compat: self.compat & !Self::KNOWN.compat,
            ro_compat: self.ro_compat & !Self::KNOWN.ro_compat,
            incompat: self.incompat & !Self::KNOWN.incompat,
        }
    }

    /// The superblock version these flags call for.
    pub(crate) fn format_version(self) -> u32 {
        if self.incompat != 0 {
            FORMAT_VERSION_WITH_INCOMPAT
        } else {
            FORMAT_VERSION
        }
    }

    pub fn is_empty(self) -> bool {
        self == Features::default()
    }
}

/// Names of the fixed set of files in a backing directory, all made at format time.
pub const SUPERBLOCK_FILE: &str = "superblock";
pub const DATA_FILE: &str = "data";
pub const META_FILE: &str = "meta.redb";
pub const LOCK_FILE: &str = "lock";
pub const LOG_FILE: &str = "daemon.log";
/// The journal of a single-slot space on a data file (`catalog::journal`).
pub const JOURNAL_FILE: &str = "journal";
/// The settings of a space's object-store tier (`ckptfs-remote`), if it has one.
pub const REMOTE_FILE: &str = "remote";
/// Segments a slot needs at least: two for chunks, two for its manifest area.
pub(crate) const MIN_SLOT_SEGMENTS: u64 = 4;

/// The directory of a multi-slot space holding the slot headers and the slots' tables.
pub(crate) const SLOTS_DIR: &str = "slots";
/// In `SLOTS_DIR`: two header copies per slot (`SlotHeader`).
pub(crate) const SLOT_HEADERS_FILE: &str = "headers";
pub const SPACE_FILES: [&str; 6] = [
    SUPERBLOCK_FILE,
    DATA_FILE,
    META_FILE,
    JOURNAL_FILE,
    LOCK_FILE,
    LOG_FILE,
];
/// The space-directory file listing the targets.
pub(crate) const TARGETS_FILE: &str = "targets";
/// The space-directory file of per-segment placement records.
pub(crate) const PLACEMENT_FILE: &str = "placement";
/// The names a space over several targets has in its backing directory (its data is in
/// the targets' `ckptfs-target` files).
pub(crate) const TARGETED_SPACE_FILES: [&str; 6] = [
    SUPERBLOCK_FILE,
    META_FILE,
    LOCK_FILE,
    LOG_FILE,
    TARGETS_FILE,
    PLACEMENT_FILE,
];
/// The names a multi-slot space has at its top level (its tables are in `SLOTS_DIR`).
pub(crate) const SLOTTED_SPACE_FILES: [&str; 5] =
    [SUPERBLOCK_FILE, DATA_FILE, SLOTS_DIR, LOCK_FILE, LOG_FILE];

/// The metadata table of slot `slot` of a multi-slot space, relative to the backing dir.
pub(crate) fn slot_meta_file(slot: SlotId) -> String {
    format!("{SLOTS_DIR}/{:04}.redb", slot.0)
}

/// A record of kind `record` that does not decode.
fn malformed(record: &'static str) -> Error {
    Corruption::Record {
        record,
        why: "it does not decode".into(),
    }
    .into()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Chunking parameters, fixed at format time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkParams {
    pub min_bytes: u32,
    pub avg_bytes: u32,
    pub max_bytes: u32,
}

impl ChunkParams {
    pub(crate) const MIN_AVG_BYTES: u32 = 4096;
    pub(crate) const MAX_AVG_BYTES: u32 = 4 << 20;

    /// min = avg/4 and max = avg*4, the spread FastCDC's authors recommend.
    pub fn from_avg(avg_bytes: u32) -> Result<Self> {
        if !avg_bytes.is_power_of_two()
            || !(Self::MIN_AVG_BYTES..=Self::MAX_AVG_BYTES).contains(&avg_bytes)
        {
            return Err(Error::Invalid(format!(
                "chunk size must be a power of two between {} KiB and {} MiB, got {avg_bytes} bytes",
                Self::MIN_AVG_BYTES >> 10,
                Self::MAX_AVG_BYTES >> 20
            )));
        }
        Ok(ChunkParams {
            min_bytes: avg_bytes / 4,
            avg_bytes,
            max_bytes: avg_bytes * 4,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub uuid: [u8; 16],
    pub data_size_bytes: u64,
    pub chunk: ChunkParams,
    /// The data file is allocated and reclaimed in segments of this size.
    pub segment_bytes: u32,
    pub created_unix_s: u64,
    /// Slots (nodes that may mount the space at once): 1 unless `Features::INCOMPAT_SLOTS`.
    pub slots: u32,
    /// Must agree with `version` (see `FORMAT_VERSION_WITH_INCOMPAT`): set both with
    /// `with_features`.
    pub features: Features,
}

impl Superblock {
    /// This superblock with `features` added, and the version they call for.
    pub fn with_features(&self, features: Features) -> Superblock {
        let features = self.features.union(features);
        Superblock {
            version: features.format_version(),
            features,
            ..self.clone()
        }
    }

    /// Segments are at least 8 MiB (large sequential writes) and hold at least two maximal
    /// chunks (so the tail wasted when a chunk does not fit stays under half a segment).
    pub fn segment_bytes_for(chunk: ChunkParams) -> u32 {
        (8u32 << 20).max(2 * chunk.max_bytes)
    }

    pub fn segments(&self) -> u64 {
        self.data_size_bytes / self.segment_bytes as u64
    }

    /// Slot `slot`'s share of the data file: an equal share, in slot order (the whole data
    /// file for a single-slot space).
    pub(crate) fn slot_share(&self, slot: SlotId) -> std::ops::Range<u64> {
        let (n, s) = (self.slots.max(1) as u64, self.segments());
        let i = slot.0 as u64;
        i * s / n..(i + 1) * s / n
    }

    /// Segments per half of a slot's manifest area: 1/64 of its share, at least one; none in
    /// a single-slot space (nothing reads it from elsewhere).
    pub(crate) fn manifest_half_segments(&self, slot: SlotId) -> u64 {
        if self.slots <= 1 {
            return 0;
        }
        let r = self.slot_share(slot);
        ((r.end - r.start) / 64).max(1)
    }

    /// The data-file offset and length of half `half` (0 or 1) of slot `slot`'s manifest
    /// area: the first segments of its share.
    pub(crate) fn manifest_half(&self, slot: SlotId, half: u64) -> (u64, u64) {
        let h = self.manifest_half_segments(slot);
        let seg = self.segment_bytes as u64;
        ((self.slot_share(slot).start + half * h) * seg, h * seg)
    }

    /// The segments slot `slot` allocates chunks from: its share after its manifest area.
    pub fn slot_segments(&self, slot: SlotId) -> std::ops::Range<u64> {
        let r = self.slot_share(slot);
        r.start + 2 * self.manifest_half_segments(slot)..r.end
    }
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.data_size_bytes > 0);
        assert!(ChunkParams::from_avg(self.chunk.avg_bytes).is_ok());
        assert!(self.segment_bytes >= 2 * self.chunk.max_bytes);
        let mut b = vec![0u8; SUPERBLOCK_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        assert_eq!(
            self.slots > 1,
            self.features.contains(Features::INCOMPAT_SLOTS),
            "a slot count above 1 goes with the slots feature"
        );
        if self.slots > 1 {
            b[12..16].copy_from_slice(&self.slots.to_le_bytes());
        }
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.data_size_bytes.to_le_bytes());
        b[40..44].copy_from_slice(&self.chunk.min_bytes.to_le_bytes());
        b[44..48].copy_from_slice(&self.chunk.avg_bytes.to_le_bytes());
        b[48..52].copy_from_slice(&self.chunk.max_bytes.to_le_bytes());
        b[52..56].copy_from_slice(&self.segment_bytes.to_le_bytes());
        b[56..64].copy_from_slice(&self.created_unix_s.to_le_bytes());
        let sum = blake3::hash(&b[..SUPERBLOCK_USED]);
        b[SUPERBLOCK_USED..SUPERBLOCK_USED + 32].copy_from_slice(sum.as_bytes());
        if !self.features.is_empty() {
            let f = &self.features;
            b[FEATURES_AT..FEATURES_AT + 8].copy_from_slice(&f.compat.to_le_bytes());
            b[FEATURES_AT + 8..FEATURES_AT + 16].copy_from_slice(&f.ro_compat.to_le_bytes());
            b[FEATURES_AT + 16..FEATURES_SUM_AT].copy_from_slice(&f.incompat.to_le_bytes());
            let sum = blake3::hash(&b[..FEATURES_SUM_AT]);
            b[FEATURES_SUM_AT..FEATURES_END].copy_from_slice(sum.as_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() < SUPERBLOCK_USED + 32 || b[0..8] != MAGIC {
            return Err(Error::NotASpace(
                "not a ckptfs backing space (bad superblock magic)".into(),
            ));
        }
        let sum = blake3::hash(&b[..SUPERBLOCK_USED]);
        if sum.as_bytes() != &b[SUPERBLOCK_USED..SUPERBLOCK_USED + 32] {
            return Err(Corruption::Superblock("its checksum does not match".into()).into());
        }
        let version = u32_at(b, 8);
        if version != FORMAT_VERSION && version != FORMAT_VERSION_WITH_INCOMPAT {
            return Err(Error::NotASpace(format!(
                "backing space has format version {version}; this ckptfs reads versions \
                 {FORMAT_VERSION} and {FORMAT_VERSION_WITH_INCOMPAT}"
            )));
        }
        let features =
            if b.len() < FEATURES_END || b[FEATURES_AT..FEATURES_END].iter().all(|&x| x == 0) {
                Features::default()
            } else {
                let sum = blake3::hash(&b[..FEATURES_SUM_AT]);
                if sum.as_bytes() != &b[FEATURES_SUM_AT..FEATURES_END] {
                    return Err(Corruption::Superblock(
                        "the checksum of its feature flags does not match".into(),
                    )
                    .into());
                }
                Features {
                    compat: u64_at(b, FEATURES_AT),
                    ro_compat: u64_at(b, FEATURES_AT + 8),
                    incompat: u64_at(b, FEATURES_AT + 16),
                }
            };
        if features.format_version() != version {
            return Err(Corruption::Superblock(format!(
                "it says version {version} but has incompatible feature flags {:#x}",
                features.incompat
            ))
            .into());
        }
        let chunk = ChunkParams::from_avg(u32_at(b, 44))
            .map_err(|_| Corruption::Superblock("its chunk size is out of range".into()))?;
        if chunk.min_bytes != u32_at(b, 40) || chunk.max_bytes != u32_at(b, 48) {
            return Err(Error::from(Corruption::Superblock(
                "its chunk size bounds are inconsistent".into(),
            )));
        }
        let data_size_bytes = u64_at(b, 32);
        let segment_bytes = u32_at(b, 52);
        if data_size_bytes == 0 || segment_bytes < 2 * chunk.max_bytes {
            return Err(Corruption::Superblock("its sizes are out of range".into()).into());
        }
        let slots = match features.contains(Features::INCOMPAT_SLOTS) {
            true => u32_at(b, 12),
            false => 1,
        };
        let segments = data_size_bytes / segment_bytes as u64;
        if slots == 0 || (slots > 1 && segments / (slots as u64) < MIN_SLOT_SEGMENTS) {
            return Err(Corruption::Superblock(format!(
                "its slot count {slots} does not fit {segments} segments"
            ))
            .into());
        }
        Ok(Superblock {
            version,
            uuid: b[16..32].try_into().expect("16 bytes"),
            data_size_bytes,
            chunk,
            segment_bytes,
            created_unix_s: u64_at(b, 56),
            slots,
            features,
        })
    }
}

/// The first block of `slots/headers`: what every slot starts from (`SlotTableHead`).
pub(crate) const SLOT_TABLE_HEAD_LEN: u64 = 4096;
const SLOT_TABLE_MAGIC: [u8; 8] = *b"CKSLOTS\x01";

/// The head of `slots/headers`: the space it belongs to, the slot count, and the retention
/// policy `format` was given, which each slot's table starts with at its first claim (the
/// tables are made then, not at format, so unused slots cost one header each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotTableHead {
    pub uuid: [u8; 16],
    pub slots: u32,
    /// `keep_revisions`, `keep_age_secs`, `keep_unlinked_secs`, `auto_gc_free_percent`.
    pub config: [u64; 4],
}

impl SlotTableHead {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SLOT_TABLE_HEAD_LEN as usize];
        b[0..8].copy_from_slice(&SLOT_TABLE_MAGIC);
        b[8..12].copy_from_slice(&self.slots.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        for (i, v) in self.config.iter().enumerate() {
            b[32 + 8 * i..40 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        let sum = blake3::hash(&b[..64]);
        b[64..96].copy_from_slice(sum.as_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<SlotTableHead> {
        if b.len() < 96 || b[0..8] != SLOT_TABLE_MAGIC {
            return Err(Corruption::Record {
                record: "slot table head",
                why: "bad magic".into(),
            }
            .into());
        }
        if blake3::hash(&b[..64]).as_bytes() != &b[64..96] {
            return Err(Corruption::Record {
                record: "slot table head",
                why: "checksum mismatch".into(),
            }
            .into());
        }
        Ok(SlotTableHead {
            slots: u32_at(b, 8),
            uuid: b[16..32].try_into().expect("16 bytes"),
            config: [0, 1, 2, 3].map(|i| u64_at(b, 32 + 8 * i)),
        })
    }
}

/// Bytes per slot of the hint region at the end of `slots/headers` (`SlotHint`).
pub(crate) const SLOT_HINT_LEN: u64 = 128;

/// The length of `slots/headers` for `slots` slots: head, header pairs, hints (padded to
/// whole 4 KiB blocks).
pub(crate) fn slot_table_len(slots: u32) -> u64 {
    SLOT_TABLE_HEAD_LEN
        + slots as u64 * SLOT_HEADER_PAIR
        + (slots as u64 * SLOT_HINT_LEN).div_ceil(4096) * 4096
}

/// Keys an intent names at most (`Intent`).
pub(crate) const INTENT_KEYS: usize = 6;

/// What a slot is about to change in the shared namespace (FORMAT.md "Intents"): up to
/// `INTENT_KEYS` keys (hashes of what the change touches: a name in a directory, a
/// directory's existence, every directory rename), each exclusive (bit 0 set) or shared.
/// Two intents conflict when they share a key and at least one holds it exclusively.
/// `prio` orders conflicting intents (older first, then lower slot): it is the stamp the
/// change first announced with, kept across its retries so that a waiting change ages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Intent {
    /// Raised by every announcement; 0 (with no keys) is no intent.
    pub seq: u64,
    pub prio: u64,
    pub keys: [u64; INTENT_KEYS],
}

impl Intent {
    pub fn is_empty(&self) -> bool {
        self.keys.iter().all(|&k| k == 0)
    }

    /// Whether two intents touch one key and at least one of them exclusively.
    pub(crate) fn conflicts(&self, o: &Intent) -> bool {
        self.keys.iter().filter(|&&k| k != 0).any(|&a| {
            o.keys
                .iter()
                .filter(|&&k| k != 0)
                .any(|&b| a | 1 == b | 1 && (a & 1 == 1 || b & 1 == 1))
        })
    }
}

/// A slot's hint: the few fields of its newest header that say whether it published
/// something new, and its current namespace intent, packed densely, so that a node
/// refreshing its view of every slot reads 128 bytes per slot instead of 8 KiB, and the
/// whole header only of slots that changed. For the manifest pointer only a hint (the
/// header stays authoritative, FORMAT.md "Hints"); for the intent the only record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SlotHint {
    pub seq: u64,
    pub epoch: u64,
    pub manifest_gen: u64,
    pub manifest_len: u64,
    pub intent: Intent,
    /// A mounting node's coherence probe (a random nonce; 0: none), and the last probe of
    /// another slot this slot saw and answered (FORMAT.md "Coherence probe").
    pub probe: u64,
    pub echo: u64,
}

impl SlotHint {
    pub fn of(h: &SlotHeader) -> SlotHint {
        SlotHint {
            seq: h.seq,
            epoch: h.epoch,
            manifest_gen: h.manifest_gen,
            manifest_len: h.manifest_len,
            intent: Intent::default(),
            probe: 0,
            echo: 0,
        }
    }

    /// Where slot `slot`'s hint lives in `slots/headers` of a `slots`-slot space.
    pub fn offset(slots: u32, slot: SlotId) -> u64 {
        SLOT_TABLE_HEAD_LEN + slots as u64 * SLOT_HEADER_PAIR + slot.0 as u64 * SLOT_HINT_LEN
    }

    /// `seq | epoch | manifest gen | manifest len | intent seq | intent prio | 6 keys |
    /// probe | echo | blake3 of 0..112, 16 bytes`.
    pub fn encode(&self) -> [u8; SLOT_HINT_LEN as usize] {
        let mut b = [0u8; SLOT_HINT_LEN as usize];
        let words = [
            self.seq,
            self.epoch,
            self.manifest_gen,
            self.manifest_len,
            self.intent.seq,
            self.intent.prio,
        ];
        for (i, v) in words
            .iter()
            .chain(self.intent.keys.iter())
            .chain([self.probe, self.echo].iter())
            .enumerate()
        {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        let sum = blake3::hash(&b[..112]);
        b[112..128].copy_from_slice(&sum.as_bytes()[..16]);
        b
    }

    /// None for a hint not intact (then the header is read); all zeros (never written, a
    /// slot never claimed) is the default hint.
    pub fn decode(b: &[u8]) -> Option<SlotHint> {
        if b.iter().all(|&x| x == 0) {
            return Some(SlotHint::default());
        }
        if b.len() != SLOT_HINT_LEN as usize
            || blake3::hash(&b[..112]).as_bytes()[..16] != b[112..128]
        {
            return None;
        }
        Some(SlotHint {
            seq: u64_at(b, 0),
            epoch: u64_at(b, 8),
            manifest_gen: u64_at(b, 16),
            manifest_len: u64_at(b, 24),
            intent: Intent {
                seq: u64_at(b, 32),
                prio: u64_at(b, 40),
                keys: [0, 1, 2, 3, 4, 5].map(|i| u64_at(b, 48 + 8 * i)),
            },
            probe: u64_at(b, 96),
            echo: u64_at(b, 104),
        })
    }
}

/// The slot owning global inode number `ino` of a shared namespace (bits 40 and up; the
/// root, 1, is every slot's). Local inode numbers of slot `s` start at `slot_ino_base(s)`.
pub(crate) const SLOT_INO_SHIFT: u32 = 40;

pub fn owner_slot(ino: InodeId) -> SlotId {
    SlotId((ino.0 >> SLOT_INO_SHIFT) as u32)
}

/// The first inode number slot `s` allocates in a shared namespace (slot 0 as a
/// single-slot space: 2).
pub(crate) fn slot_ino_base(s: SlotId) -> u64 {
    ((s.0 as u64) << SLOT_INO_SHIFT) | 2
}

/// One entry of a shared namespace as one slot records it (table `bindings`, manifest
/// record 5): `(parent, name)` names `child`, or nothing (`child` 0: a tombstone: this
/// slot removed the name), as of `stamp`. Of the records every slot has for one
/// `(parent, name)`, the one with the highest `(stamp, slot)` is the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub child: InodeId,
    pub stamp: u64,
    pub kind: NodeKind,
}

/// Length of an encoded `Binding` value.
pub(crate) const BINDING_LEN: usize = 24;

impl Binding {
    pub fn is_tombstone(&self) -> bool {
        self.child.0 == 0
    }

    /// `child u64 | stamp u64 | kind u8 | 0 (7)` (a tombstone's kind is 0).
    pub fn encode(&self) -> [u8; BINDING_LEN] {
        let mut b = [0u8; BINDING_LEN];
        b[0..8].copy_from_slice(&self.child.0.to_le_bytes());
        b[8..16].copy_from_slice(&self.stamp.to_le_bytes());
        b[16] = if self.is_tombstone() {
            0
        } else {
            self.kind as u8
        };
        b
    }

    pub fn decode(b: &[u8]) -> Result<Binding> {
        if b.len() != BINDING_LEN {
            return Err(malformed("binding"));
        }
        let child = InodeId(u64_at(b, 0));
        let kind = match (child.0, b[16]) {
            (0, _) => NodeKind::File,
            (_, k) => NodeKind::from_u8(k).ok_or_else(|| malformed("binding kind"))?,
        };
        Ok(Binding {
            child,
            stamp: u64_at(b, 8),
            kind,
        })
    }
}

/// What makes a local inode of a shared namespace a *version* of an object (table
/// `versions`): the object it belongs to, and the stamps that order it among the other
/// slots' versions of that object (FORMAT.md "Versions"). A regular file's versions are
/// layers of its bytes; any object's versions carry its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct VersionMeta {
    /// The object (global inode number) this is a version of.
    pub of: InodeId,
    /// When this layer started: layers are painted oldest first.
    pub created: u64,
    /// When this version last set the mode or owner (the newest one decides those).
    pub attr_stamp: u64,
    /// When this version last set its times (a write's commit, utimens).
    pub times_stamp: u64,
    /// This version's last truncate: when, and to what length. Layers that started before
    /// it show no byte at or past that length; its own extents already reflect it.
    pub clip_stamp: u64,
    pub clip_len: u64,
}

pub(crate) const VERSION_META_LEN: usize = 48;

impl VersionMeta {
    pub fn encode(&self) -> [u8; VERSION_META_LEN] {
        let mut b = [0u8; VERSION_META_LEN];
        for (i, v) in [
            self.of.0,
            self.created,
            self.attr_stamp,
            self.times_stamp,
            self.clip_stamp,
            self.clip_len,
        ]
        .iter()
        .enumerate()
        {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<VersionMeta> {
        if b.len() != VERSION_META_LEN {
            return Err(malformed("version record"));
        }
        Ok(VersionMeta {
            of: InodeId(u64_at(b, 0)),
            created: u64_at(b, 8),
            attr_stamp: u64_at(b, 16),
            times_stamp: u64_at(b, 24),
            clip_stamp: u64_at(b, 32),
            clip_len: u64_at(b, 40),
        })
    }
}

/// Bytes per slot in `slots/headers`: two copies of `SLOT_HEADER_LEN`, written alternately.
pub(crate) const SLOT_HEADER_PAIR: u64 = 2 * SLOT_HEADER_LEN as u64;
pub(crate) const SLOT_HEADER_LEN: usize = 4096;
const SLOT_MAGIC: [u8; 8] = *b"CKSLOT\0\x01";
const SLOT_HOST_MAX: usize = 64;
const SLOT_MOUNTPOINT_AT: usize = 132;
pub(crate) const SLOT_MOUNTPOINT_MAX: usize = 1024;
const SLOT_USED_AT: usize = SLOT_MOUNTPOINT_AT + SLOT_MOUNTPOINT_MAX;
const SLOT_SUM_AT: usize = SLOT_HEADER_LEN - 32;

/// What a slot header says of its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// Never claimed since format: both copies all zero.
    Free = 0,
    /// Claimed by the owner named; the lease runs `lease_ms` from `renewed_unix_ns`.
    Held = 1,
    /// Released by its owner's unmount.
    Released = 2,
}

/// One copy of a slot's header (`slots/headers`, FORMAT.md "Slot headers"). Every write
/// goes to the copy `seq % 2` with `seq` one above the newest valid copy, so a torn write
/// leaves the other copy, and a reader takes the valid copy with the higher `seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    pub slot: SlotId,
    pub state: SlotState,
    pub seq: u64,
    /// Bumped by every claim: what fences an owner that lost its slot.
    pub epoch: u64,
    /// Wall-clock time of the owner's last renewal (taken before the renewal's read).
    pub renewed_unix_ns: u64,
    pub lease_ms: u32,
    pub pid: u32,
    /// Random per mount: tells two claims of one slot apart even from one host and pid.
    pub mount_id: [u8; 16],
    pub host: String,
    pub mountpoint: String,
    /// Bytes of the slot's segments in use, as of the header's write (for `ckptfs slots`,
    /// which never opens a slot's table).
    pub used_bytes: u64,
    /// The published manifest: generation (its half is `gen % 2`) and valid length.
    pub manifest_gen: u64,
    pub manifest_len: u64,
}

impl SlotHeader {
    /// The header of a slot never claimed.
    pub fn free(slot: SlotId) -> SlotHeader {
        SlotHeader {
            slot,
            state: SlotState::Free,
            seq: 0,
            epoch: 0,
            renewed_unix_ns: 0,
            lease_ms: 0,
            pid: 0,
            mount_id: [0; 16],
            host: String::new(),
            mountpoint: String::new(),
            used_bytes: 0,
            manifest_gen: 0,
            manifest_len: 0,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.host.len() <= SLOT_HOST_MAX && self.mountpoint.len() <= SLOT_MOUNTPOINT_MAX);
        let mut b = vec![0u8; SLOT_HEADER_LEN];
        b[0..8].copy_from_slice(&SLOT_MAGIC);
        b[8..12].copy_from_slice(&self.slot.0.to_le_bytes());
        b[12] = self.state as u8;
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..40].copy_from_slice(&self.renewed_unix_ns.to_le_bytes());
        b[40..44].copy_from_slice(&self.lease_ms.to_le_bytes());
        b[44..48].copy_from_slice(&self.pid.to_le_bytes());
        b[48..64].copy_from_slice(&self.mount_id);
        b[64..64 + self.host.len()].copy_from_slice(self.host.as_bytes());
        b[128..130].copy_from_slice(&(self.mountpoint.len() as u16).to_le_bytes());
        b[SLOT_MOUNTPOINT_AT..SLOT_MOUNTPOINT_AT + self.mountpoint.len()]
            .copy_from_slice(self.mountpoint.as_bytes());
        b[SLOT_USED_AT..SLOT_USED_AT + 8].copy_from_slice(&self.used_bytes.to_le_bytes());
        b[SLOT_USED_AT + 8..SLOT_USED_AT + 16].copy_from_slice(&self.manifest_gen.to_le_bytes());
        b[SLOT_USED_AT + 16..SLOT_USED_AT + 24].copy_from_slice(&self.manifest_len.to_le_bytes());
        let sum = blake3::hash(&b[..SLOT_SUM_AT]);
        b[SLOT_SUM_AT..].copy_from_slice(sum.as_bytes());
        b
    }

    /// Decodes one copy: `Ok(None)` for an all-zero copy (never written), an error for a
    /// copy that is torn or not slot `slot`'s.
    pub fn decode(b: &[u8], slot: SlotId) -> Result<Option<SlotHeader>> {
        if b.len() != SLOT_HEADER_LEN {
            return Err(malformed("slot header"));
        }
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let bad = |why: &str| -> Error {
            Corruption::Record {
                record: "slot header",
                why: format!("slot {slot}: {why}"),
            }
            .into()
        };
        if b[0..8] != SLOT_MAGIC {
            return Err(bad("bad magic"));
        }
        if blake3::hash(&b[..SLOT_SUM_AT]).as_bytes() != &b[SLOT_SUM_AT..] {
            return Err(bad("checksum mismatch (a torn or damaged write)"));
        }
        if u32_at(b, 8) != slot.0 {
            return Err(bad(&format!("it names slot {}", u32_at(b, 8))));
        }
        let state = match b[12] {
            1 => SlotState::Held,
            2 => SlotState::Released,
            _ => return Err(bad("unknown state")),
        };
        let text = |r: std::ops::Range<usize>| -> Result<String> {
            let raw = &b[r];
            let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
            String::from_utf8(raw[..end].to_vec()).map_err(|_| bad("text is not UTF-8"))
        };
        let mlen = u16::from_le_bytes([b[128], b[129]]) as usize;
        if mlen > SLOT_MOUNTPOINT_MAX {
            return Err(bad("mountpoint too long"));
        }
        Ok(Some(SlotHeader {
            slot,
            state,
            seq: u64_at(b, 16),
            epoch: u64_at(b, 24),
            renewed_unix_ns: u64_at(b, 32),
            lease_ms: u32_at(b, 40),
            pid: u32_at(b, 44),
            mount_id: b[48..64].try_into().expect("16 bytes"),
            host: text(64..64 + SLOT_HOST_MAX)?,
            mountpoint: text(SLOT_MOUNTPOINT_AT..SLOT_MOUNTPOINT_AT + mlen)?,
            used_bytes: u64_at(b, SLOT_USED_AT),
            manifest_gen: u64_at(b, SLOT_USED_AT + 8),
            manifest_len: u64_at(b, SLOT_USED_AT + 16),
        }))
    }

    /// The newest valid header of a slot from its two copies; `Free` when neither was ever
    /// written, an error only when neither copy is valid.
    pub fn newest(pair: &[u8], slot: SlotId) -> Result<SlotHeader> {
        let (a, b) = pair.split_at(SLOT_HEADER_LEN);
        match (SlotHeader::decode(a, slot), SlotHeader::decode(b, slot)) {
            (Ok(x), Ok(y)) => Ok(match (x, y) {
                (Some(x), Some(y)) => {
                    if x.seq >= y.seq {
                        x
                    } else {
                        y
                    }
                }
                (Some(x), None) | (None, Some(x)) => x,
                (None, None) => SlotHeader::free(slot),
            }),
            (Ok(Some(x)), Err(_)) | (Err(_), Ok(Some(x))) => Ok(x),
            // One copy torn, the other never written: a first claim that did not complete.
            (Ok(None), Err(_)) | (Err(_), Ok(None)) => Ok(SlotHeader::free(slot)),
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// Where the pair of slot `slot` starts in `slots/headers`.
    pub(crate) fn pair_offset(slot: SlotId) -> u64 {
        SLOT_TABLE_HEAD_LEN + slot.0 as u64 * SLOT_HEADER_PAIR
    }

    /// Where copy `seq % 2` of slot `slot` lives in `slots/headers`.
    pub fn offset(slot: SlotId, seq: u64) -> u64 {
        SLOT_TABLE_HEAD_LEN + slot.0 as u64 * SLOT_HEADER_PAIR + (seq % 2) * SLOT_HEADER_LEN as u64
    }
}

/// Seconds and nanoseconds since the Unix epoch (negative seconds before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    pub const EPOCH: Timestamp = Timestamp { secs: 0, nanos: 0 };
}

impl Timestamp {
    /// Now, by the engine's clock (`clock::now`).
    pub fn now() -> Self {
        crate::clock::now().into()
    }
    fn encode(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.secs.to_le_bytes());
        b[8..12].copy_from_slice(&self.nanos.to_le_bytes());
    }
    fn decode(b: &[u8]) -> Self {
        Timestamp {
            secs: i64_at(b, 0),
            nanos: u32_at(b, 8),
        }
    }

    /// A table value that is a timestamp alone (12 bytes; the whiteouts of old spaces).
    pub(crate) fn decode_value(b: &[u8], record: &'static str) -> Result<Self> {
        if b.len() != 12 {
            return Err(Corruption::Record {
                record,
                why: "it is not 12 bytes".into(),
            }
            .into());
        }
        Ok(Timestamp::decode(b))
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let (mut secs, mut nanos) = (-(d.as_secs() as i64), d.subsec_nanos());
                if nanos > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                Timestamp { secs, nanos }
            }
        }
    }
}

impl From<Timestamp> for SystemTime {
    fn from(t: Timestamp) -> Self {
        if t.secs >= 0 {
            UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
                + Duration::from_nanos(t.nanos as u64)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    /// Special nodes: only their inode is stored; the kernel implements their behaviour.
    Fifo = 4,
    Socket = 5,
    CharDevice = 6,
    BlockDevice = 7,
}

impl NodeKind {
    pub(crate) fn from_u8(k: u8) -> Option<NodeKind> {
        Some(match k {
            1 => NodeKind::File,
            2 => NodeKind::Dir,
            3 => NodeKind::Symlink,
            4 => NodeKind::Fifo,
            5 => NodeKind::Socket,
            6 => NodeKind::CharDevice,
            7 => NodeKind::BlockDevice,
            _ => return None,
        })
    }
}

/// One inode as committed in the metadata table. For a regular file, `size` and `current_rev`
/// always describe a committed revision: uncommitted writes live only in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRecord {
    pub kind: NodeKind,
    /// Permission bits including setuid/setgid/sticky (mode & 0o7777).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    /// 0 when the file has never been committed with content.
    pub current_rev: RevisionId,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    /// The parent directory of a directory (for ".."); 0 for other kinds.
    pub parent: InodeId,
    /// Device number of a character or block device node; 0 for other kinds.
    pub rdev: u32,
    /// The revision history this regular file commits into (`HistoryId::NONE` for other
    /// kinds).
    pub history: HistoryId,
    /// Symlink target; for a directory, its own name in its parent (to rebuild paths);
    /// empty for other kinds.
    pub target: Vec<u8>,
}

const INODE_FIXED: usize = 112;

impl InodeRecord {
    /// Takes what the namespace owns from `stored`, the record in the table: the link count,
    /// the history and the current revision (an unlink, rename or commit elsewhere changes
    /// them). An open file's copy owns the rest (size, times, mode) while it is open. The one
    /// place the two copies are merged.
    pub fn adopt_namespace(&mut self, stored: &InodeRecord) {
        self.nlink = stored.nlink;
        self.history = stored.history;
        self.current_rev = stored.current_rev;
    }

    /// A new, empty node owned by `uid:gid`, with all timestamps now and a link count of 1
    /// (2 for a directory).
    pub fn new(kind: NodeKind, perm: u32, uid: u32, gid: u32) -> Self {
        let now = Timestamp::now();
        InodeRecord {
            kind,
            perm: perm & 0o7777,
            uid,
            gid,
            nlink: if kind == NodeKind::Dir { 2 } else { 1 },
            size: 0,
            current_rev: RevisionId(0),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            parent: InodeId(0),
            rdev: 0,
            history: HistoryId::NONE,
            target: Vec::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.perm <= 0o7777);
        assert!(matches!(self.kind, NodeKind::Symlink | NodeKind::Dir) || self.target.is_empty());
        let mut b = vec![0u8; INODE_FIXED + self.target.len()];
        b[0] = self.kind as u8;
        b[4..8].copy_from_slice(&self.perm.to_le_bytes());
        b[8..12].copy_from_slice(&self.uid.to_le_bytes());
        b[12..16].copy_from_slice(&self.gid.to_le_bytes());
        b[16..20].copy_from_slice(&self.nlink.to_le_bytes());
        b[20..24].copy_from_slice(&self.rdev.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.current_rev.0.to_le_bytes());
        self.atime.encode(&mut b[40..52]);
        self.mtime.encode(&mut b[52..64]);
        self.ctime.encode(&mut b[64..76]);
        self.crtime.encode(&mut b[76..88]);
        b[88..96].copy_from_slice(&self.parent.0.to_le_bytes());
        b[96..100].copy_from_slice(&(self.target.len() as u32).to_le_bytes());
        b[104..112].copy_from_slice(&self.history.0.to_le_bytes());
        b[INODE_FIXED..].copy_from_slice(&self.target);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = |m: &str| {
            Error::from(Corruption::Record {
                record: "inode record",
                why: m.into(),
            })
        };
        if b.len() < INODE_FIXED {
            return Err(bad("too short"));
        }
        let kind = NodeKind::from_u8(b[0]).ok_or_else(|| bad("unknown kind"))?;
        let perm = u32_at(b, 4);
        let target_len = u32_at(b, 96) as usize;
        if perm > 0o7777 || b.len() != INODE_FIXED + target_len {
            return Err(bad("bad mode or length"));
        }
        Ok(InodeRecord {
            kind,
            perm,
            uid: u32_at(b, 8),
            gid: u32_at(b, 12),
            nlink: u32_at(b, 16),
            size: u64_at(b, 24),
            current_rev: RevisionId(u64_at(b, 32)),
            atime: Timestamp::decode(&b[40..52]),
            mtime: Timestamp::decode(&b[52..64]),
            ctime: Timestamp::decode(&b[64..76]),
            crtime: Timestamp::decode(&b[76..88]),
            parent: InodeId(u64_at(b, 88)),
            rdev: u32_at(b, 20),
            history: HistoryId(u64_at(b, 104)),
            target: b[INODE_FIXED..].to_vec(),
        })
    }
}

/// How a chunk's bytes are stored in the data file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Raw,
    /// lz4_flex block format, no size prefix; the raw length is in the chunk record.
    Lz4,
    /// Byte-shuffled as 4-byte elements (float32), then LZ4 (see `codec::shuffle`, the same transposition as the float codec's planes).
    Shuffle4Lz4,
    /// Byte-shuffled as 8-byte elements (float64), then LZ4.
    Shuffle8Lz4,
    /// The float codec (ids 4..=15, `4 + transform index`): one standard zstd frame of the
    /// chunk's transformed bytes (rotated by one or three bits and/or split into byte
    /// planes, as the transform says; `ckptfs_kernels::float`). Ids 12..=15 (rotation by
    /// three bits) need `Features::INCOMPAT_FLOAT_ROTATE3` besides the float codec's flag.
    Float(Transform),
}

impl Codec {
    /// First id of the float codec's twelve transforms.
    const FLOAT_BASE: u8 = 4;

    pub fn from_u8(c: u8) -> Option<Codec> {
        Some(match c {
            0 => Codec::Raw,
            1 => Codec::Lz4,
            2 => Codec::Shuffle4Lz4,
            3 => Codec::Shuffle8Lz4,
            4..=15 => Codec::Float(Transform::from_index(c - Self::FLOAT_BASE)?),
            _ => return None,
        })
    }

    /// The id stored in chunk records and manifests.
    pub fn id(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Lz4 => 1,
            Codec::Shuffle4Lz4 => 2,
            Codec::Shuffle8Lz4 => 3,
            Codec::Float(t) => Self::FLOAT_BASE + t.index(),
        }
    }

    /// The superblock flags a space needs before a chunk of this codec is written in it.
    pub fn features(self) -> Features {
        match self {
            Codec::Raw | Codec::Lz4 => Features::default(),
            Codec::Shuffle4Lz4 | Codec::Shuffle8Lz4 => Features::INCOMPAT_SHUFFLE_CODECS,
            Codec::Float(t) if t.rotate == 3 => {
                Features::INCOMPAT_FLOAT_CODEC.union(Features::INCOMPAT_FLOAT_ROTATE3)
            }
            Codec::Float(_) => Features::INCOMPAT_FLOAT_CODEC,
        }
    }
}

/// Where a distinct chunk lives and how many extents of kept revisions name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRecord {
    pub offset: DataOffset,
    pub stored_len: u32,
    pub raw_len: u32,
    pub codec: Codec,
    pub refs: u64,
}

pub(crate) const CHUNK_RECORD_LEN: usize = 32;

impl ChunkRecord {
    /// Held only by the object-store tier (`DataOffset::REMOTE`): read through the space's
    /// `RemoteChunks`, never from the data file; no segment's bytes are its.
    pub fn is_remote(&self) -> bool {
        self.offset == DataOffset::REMOTE
    }

    pub fn encode(&self) -> [u8; CHUNK_RECORD_LEN] {
        assert!(self.raw_len > 0 && self.stored_len > 0);
        assert!(self.codec != Codec::Raw || self.stored_len == self.raw_len);
        let mut b = [0u8; CHUNK_RECORD_LEN];
        b[0..8].copy_from_slice(&self.offset.0.to_le_bytes());
        b[8..12].copy_from_slice(&self.stored_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.raw_len.to_le_bytes());
        b[16] = self.codec.id();
        b[24..32].copy_from_slice(&self.refs.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = |m: &str| {
            Error::from(Corruption::Record {
                record: "chunk record",
                why: m.into(),
            })
        };
        if b.len() != CHUNK_RECORD_LEN {
            return Err(bad("wrong length"));
        }
        let codec = Codec::from_u8(b[16]).ok_or_else(|| bad("unknown codec"))?;
        let r = ChunkRecord {
            offset: DataOffset(u64_at(b, 0)),
            stored_len: u32_at(b, 8),
            raw_len: u32_at(b, 12),
            codec,
            refs: u64_at(b, 24),
        };
        if r.raw_len == 0 || r.stored_len == 0 || (codec == Codec::Raw && r.stored_len != r.raw_len)
        {
            return Err(bad("inconsistent lengths"));
        }
        Ok(r)
    }
}

/// One piece of a file: `len` bytes taken from `chunk` starting at `chunk_off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub chunk: ChunkHash,
    pub chunk_off: u32,
    pub len: u32,
}

pub(crate) const EXTENT_LEN: usize = 40;

impl Extent {
    pub fn encode(&self) -> [u8; EXTENT_LEN] {
        assert!(self.len > 0);
        let mut b = [0u8; EXTENT_LEN];
        b[0..32].copy_from_slice(&self.chunk.0);
        b[32..36].copy_from_slice(&self.chunk_off.to_le_bytes());
        b[36..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() != EXTENT_LEN || u32_at(b, 36) == 0 {
            return Err(malformed("extent record"));
        }
        Ok(Extent {
            chunk: ChunkHash(b[0..32].try_into().expect("32 bytes")),
            chunk_off: u32_at(b, 32),
            len: u32_at(b, 36),
        })
    }
}

/// A committed revision of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevisionRecord {
    pub size: u64,
    pub committed: Timestamp,
    /// Bytes this revision added to the data file (its differential cost).
    pub new_stored_bytes: u64,
    /// True when the revision was sealed by the last close; false for an fsync point.
    pub sealed: bool,
    /// The history (path lineage) this revision belongs to.
    pub history: HistoryId,
    /// Milliseconds from the first change this revision holds to its commit: how long the
    /// job spent writing it (`ckptfs advise` measures checkpoint cost from these). 0: not
    /// measured (a restore, a copy, or a revision written before this field existed).
    pub write_ms: u32,
}

pub(crate) const REVISION_RECORD_LEN: usize = 48;

impl RevisionRecord {
    pub fn encode(&self) -> [u8; REVISION_RECORD_LEN] {
        let mut b = [0u8; REVISION_RECORD_LEN];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        self.committed.encode(&mut b[8..20]);
        b[20..24].copy_from_slice(&self.write_ms.to_le_bytes());
        b[24..32].copy_from_slice(&self.new_stored_bytes.to_le_bytes());
        b[32] = self.sealed as u8;
        b[40..48].copy_from_slice(&self.history.0.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() != REVISION_RECORD_LEN || b[32] > 1 {
            return Err(malformed("revision record"));
        }
        Ok(RevisionRecord {
            size: u64_at(b, 0),
            committed: Timestamp::decode(&b[8..20]),
            new_stored_bytes: u64_at(b, 24),
            sealed: b[32] == 1,
            history: HistoryId(u64_at(b, 40)),
            write_ms: u32_at(b, 20),
        })
    }
}

/// The lineage of one path: the revisions it has had, across rename-replaces. While the
/// path exists `ino` is the file holding it; once unlinked, `unlinked` says when and `path`
/// where it was, so `ckptfs revisions` and `restore` can find it until gc drops it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryRecord {
    pub ino: InodeId,
    pub unlinked: Option<Timestamp>,
    pub path: Vec<u8>,
}

const HISTORY_FIXED: usize = 32;

impl HistoryRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HISTORY_FIXED + self.path.len()];
        b[0..8].copy_from_slice(&self.ino.0.to_le_bytes());
        if let Some(t) = self.unlinked {
            t.encode(&mut b[8..20]);
            b[20] = 1;
        }
        b[24..28].copy_from_slice(&(self.path.len() as u32).to_le_bytes());
        b[HISTORY_FIXED..].copy_from_slice(&self.path);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() < HISTORY_FIXED || b[20] > 1 || b.len() != HISTORY_FIXED + u32_at(b, 24) as usize
        {
            return Err(malformed("history record"));
        }
        Ok(HistoryRecord {
            ino: InodeId(u64_at(b, 0)),
            unlinked: (b[20] == 1).then(|| Timestamp::decode(&b[8..20])),
            path: b[HISTORY_FIXED..].to_vec(),
        })
    }
}

/// Longest extended-attribute name (Linux's XATTR_NAME_MAX; the kernel refuses longer ones
/// with ERANGE before they reach the daemon).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended-attribute value (Linux's XATTR_SIZE_MAX; larger ones get E2BIG).
pub const XATTR_VALUE_MAX: usize = 65536;
/// Room for one inode's attribute names, each counted with its terminating NUL: what
/// listxattr(2) can return at most (XATTR_LIST_MAX), so the list is always readable.
pub const XATTR_NAMES_ROOM: usize = 65536;
/// Room for one inode's attribute values together. An attribute beyond it gets ENOSPC, as
/// on ext4 when an inode's attribute block is full; it keeps what a revision records of its
/// file's attributes small next to the file.
pub const XATTR_VALUES_ROOM: usize = 256 * 1024;

/// One inode's extended attributes, by name.
pub type Xattrs = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;

/// Encodes a file's extended attributes as a revision records them:
/// `name_len u8 | value_len u32 | name | value`, repeated, in name order.
pub(crate) fn encode_xattrs(x: &Xattrs) -> Vec<u8> {
    let mut b = Vec::new();
    for (name, value) in x {
        b.push(name.len() as u8);
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(name);
        b.extend_from_slice(value);
    }
    b
}

pub(crate) fn decode_xattrs(mut b: &[u8]) -> Result<Xattrs> {
    let bad = || malformed("revision xattr record");
    let mut x = Xattrs::new();
    while !b.is_empty() {
        if b.len() < 5 {
            return Err(bad());
        }
        let nlen = b[0] as usize;
        let vlen = u32_at(b, 1) as usize;
        if nlen == 0 || vlen > XATTR_VALUE_MAX || b.len() < 5 + nlen + vlen {
            return Err(bad());
        }
        x.insert(
            b[5..5 + nlen].to_vec(),
            b[5 + nlen..5 + nlen + vlen].to_vec(),
        );
        b = &b[5 + nlen + vlen..];
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xattrs_round_trip_and_reject_truncation() {
        let mut x = Xattrs::new();
        x.insert(b"user.a".to_vec(), Vec::new());
        x.insert(b"user.b".to_vec(), vec![7; 300]);
        let b = encode_xattrs(&x);
        assert_eq!(b.len(), 2 * 5 + 12 + 300);
        assert_eq!(decode_xattrs(&b).unwrap(), x);
        assert!(decode_xattrs(&b[..b.len() - 1]).is_err());
        assert!(decode_xattrs(&[0, 0, 0, 0, 0]).is_err());
    }

    /// Golden bytes: an encoded superblock must not change without a format version bump.
    #[test]
    fn superblock_golden() {
        let sb = sample_superblock();
        let b = sb.encode();
        assert_eq!(
            blake3::hash(&b).to_hex().as_str(),
            blake3::hash(&golden_superblock()).to_hex().as_str()
        );
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        let mut bad = b.clone();
        bad[33] ^= 1;
        assert!(matches!(Superblock::decode(&bad), Err(Error::Corrupt(_))));
        let mut foreign = b.clone();
        foreign[0] = b'X';
        assert!(matches!(
            Superblock::decode(&foreign),
            Err(Error::NotASpace(_))
        ));
    }

    #[test]
    fn feature_flags_golden() {
        let plain = sample_superblock();
        let sb = plain.with_features(Features {
            compat: 1,
            ro_compat: 4,
            incompat: 1,
        });
        assert_eq!(sb.version, 2, "an incompatible flag makes it version 2");
        let b = sb.encode();
        // By hand from FORMAT.md: version 2, then the three flags after the first checksum,
        // then their own checksum over bytes 0..120.
        let mut want = golden_superblock();
        want[8] = 2;
        let sum = blake3::hash(&want[..64]);
        want[64..96].copy_from_slice(sum.as_bytes());
        want[96..104].copy_from_slice(&1u64.to_le_bytes());
        want[104..112].copy_from_slice(&4u64.to_le_bytes());
        want[112..120].copy_from_slice(&1u64.to_le_bytes());
        let sum = blake3::hash(&want[..120]);
        want[120..152].copy_from_slice(sum.as_bytes());
        assert!(b == want, "encoder differs from FORMAT.md's layout");
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        // Only compatible flags: still version 1, readable by builds from before the flags.
        let compat = plain.with_features(Features::COMPAT_XATTRS);
        assert_eq!(compat.version, 1);
        assert_eq!(Superblock::decode(&compat.encode()).unwrap(), compat);
        // A flipped flag bit is caught by the second checksum.
        let mut bad = b.clone();
        bad[97] ^= 1;
        assert!(matches!(Superblock::decode(&bad), Err(Error::Corrupt(_))));
        // Version and flags must agree.
        let v1_with_incompat = Superblock {
            version: 1,
            ..sb.clone()
        }
        .encode();
        assert!(matches!(
            Superblock::decode(&v1_with_incompat),
            Err(Error::Corrupt(_))
        ));
        let v2_without = Superblock {
            version: 2,
            ..plain.clone()
        }
        .encode();
        assert!(matches!(
            Superblock::decode(&v2_without),
            Err(Error::Corrupt(_))
        ));
        assert_eq!(
            sb.features.unknown(),
            Features {
                compat: 0,
                ro_compat: 4,
                incompat: 0
            }
        );
    }

    /// The superblock `golden_superblock` draws by hand.
    fn sample_superblock() -> Superblock {
        Superblock {
            version: FORMAT_VERSION,
            uuid: [7; 16],
            data_size_bytes: 1 << 30,
            chunk: ChunkParams::from_avg(65536).unwrap(),
            segment_bytes: 8 << 20,
            created_unix_s: 1_700_000_000,
            slots: 1,
            features: Features::default(),
        }
    }

    fn golden_superblock() -> Vec<u8> {
        // Written out by hand from FORMAT.md's diagram, independently of `encode`.
        let mut b = vec![0u8; SUPERBLOCK_LEN];
        b[0..8].copy_from_slice(b"CKPTFS\0\x01");
        b[8] = 1;
        b[16..32].fill(7);
        b[32..40].copy_from_slice(&(1u64 << 30).to_le_bytes());
        b[40..44].copy_from_slice(&16384u32.to_le_bytes());
        b[44..48].copy_from_slice(&65536u32.to_le_bytes());
        b[48..52].copy_from_slice(&262144u32.to_le_bytes());
        b[52..56].copy_from_slice(&(8u32 << 20).to_le_bytes());
        b[56..64].copy_from_slice(&1_700_000_000u64.to_le_bytes());
        let sum = blake3::hash(&b[..64]);
        b[64..96].copy_from_slice(sum.as_bytes());
        b
    }

    #[test]
    fn records_roundtrip_and_reject_garbage() {
        let ino = InodeRecord {
            kind: NodeKind::Symlink,
            perm: 0o777,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 4,
            current_rev: RevisionId(0),
            atime: Timestamp { secs: -5, nanos: 3 },
            mtime: Timestamp::now(),
            ctime: Timestamp::now(),
            crtime: Timestamp::now(),
            parent: InodeId(0),
            rdev: 0,
            history: HistoryId(0),
            target: b"step".to_vec(),
        };
        assert_eq!(InodeRecord::decode(&ino.encode()).unwrap(), ino);
        assert!(InodeRecord::decode(&ino.encode()[..50]).is_err());
        let c = ChunkRecord {
            offset: DataOffset(4096),
            stored_len: 10,
            raw_len: 20,
            codec: Codec::Lz4,
            refs: 3,
        };
        assert_eq!(ChunkRecord::decode(&c.encode()).unwrap(), c);
        let mut bad = c.encode();
        // Ids 0..=15 are codecs (4..=15 the float codec's transforms); 16 is not.
        bad[16] = 16;
        assert!(ChunkRecord::decode(&bad).is_err());
        for t in Transform::all() {
            let f = ChunkRecord {
                codec: Codec::Float(t),
                ..c
            };
            assert_eq!(ChunkRecord::decode(&f.encode()).unwrap(), f);
            assert_eq!(Codec::from_u8(Codec::Float(t).id()), Some(Codec::Float(t)));
        }
        let e = Extent {
            chunk: ChunkHash::of(b"x"),
            chunk_off: 5,
            len: 7,
        };
        assert_eq!(Extent::decode(&e.encode()).unwrap(), e);
        let r = RevisionRecord {
            size: 9,
            committed: Timestamp::now(),
            new_stored_bytes: 3,
            sealed: true,
            history: HistoryId(4),
            write_ms: 1234,
        };
        let h = HistoryRecord {
            ino: InodeId(9),
            unlinked: Some(Timestamp { secs: 5, nanos: 6 }),
            path: b"run/model.pt".to_vec(),
        };
        assert_eq!(HistoryRecord::decode(&h.encode()).unwrap(), h);
        assert_eq!(RevisionRecord::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn slot_headers_round_trip_and_the_newest_valid_copy_wins() {
        let slot = SlotId(3);
        let h = SlotHeader {
            slot,
            state: SlotState::Held,
            seq: 7,
            epoch: 2,
            renewed_unix_ns: 1_700_000_000_123_456_789,
            lease_ms: 30_000,
            pid: 4242,
            mount_id: [9; 16],
            host: "n017".into(),
            mountpoint: "/ckpt".into(),
            used_bytes: 1 << 30,
            manifest_gen: 5,
            manifest_len: 12288,
        };
        let b = h.encode();
        // By hand from FORMAT.md: a few fields at their offsets.
        assert_eq!(&b[0..8], b"CKSLOT\0\x01");
        assert_eq!(u32_at(&b, 8), 3);
        assert_eq!(b[12], 1);
        assert_eq!(u64_at(&b, 24), 2);
        assert_eq!(&b[64..68], b"n017");
        assert_eq!(&b[132..137], b"/ckpt");
        assert_eq!(u64_at(&b, 1156), 1 << 30);
        assert_eq!((u64_at(&b, 1164), u64_at(&b, 1172)), (5, 12288));
        assert_eq!(SlotHeader::decode(&b, slot).unwrap(), Some(h.clone()));
        assert!(
            SlotHeader::decode(&b, SlotId(4)).is_err(),
            "another slot's copy"
        );
        assert_eq!(
            SlotHeader::decode(&vec![0; SLOT_HEADER_LEN], slot).unwrap(),
            None
        );
        // A pair: the valid copy with the higher seq wins; a torn copy is passed over.
        let newer = SlotHeader {
            seq: 8,
            epoch: 3,
            ..h.clone()
        };
        let mut pair = vec![0u8; SLOT_HEADER_PAIR as usize];
        pair[..SLOT_HEADER_LEN].copy_from_slice(&newer.encode());
        pair[SLOT_HEADER_LEN..].copy_from_slice(&b);
        assert_eq!(SlotHeader::newest(&pair, slot).unwrap(), newer);
        pair[100] ^= 1;
        assert_eq!(
            SlotHeader::newest(&pair, slot).unwrap(),
            h,
            "torn newer copy"
        );
        pair[SLOT_HEADER_LEN + 100] ^= 1;
        assert!(SlotHeader::newest(&pair, slot).is_err(), "both copies torn");
        let zero = vec![0u8; SLOT_HEADER_PAIR as usize];
        assert_eq!(
            SlotHeader::newest(&zero, slot).unwrap().state,
            SlotState::Free
        );
        assert_eq!(SlotHeader::offset(slot, 8), 4096 + 3 * 8192);
        assert_eq!(SlotHeader::offset(slot, 7), 4096 + 3 * 8192 + 4096);
    }

    #[test]
    fn slot_hints_round_trip_and_sit_after_the_headers() {
        let h = SlotHint {
            seq: 9,
            epoch: 2,
            manifest_gen: 3,
            manifest_len: 8192,
            intent: Intent {
                seq: 4,
                prio: 77,
                keys: [11, 12, 13, 0, 0, 0],
            },
            probe: 99,
            echo: 98,
        };
        let b = h.encode();
        assert_eq!(u64_at(&b, 24), 8192);
        assert_eq!(u64_at(&b, 40), 77);
        assert_eq!(u64_at(&b, 56), 12);
        assert_eq!(u64_at(&b, 104), 98);
        assert_eq!(SlotHint::decode(&b), Some(h));
        let mut bad = b;
        bad[3] ^= 1;
        assert_eq!(SlotHint::decode(&bad), None);
        let mut bad = b;
        bad[50] ^= 1;
        assert_eq!(
            SlotHint::decode(&bad),
            None,
            "the intent is checksummed too"
        );
        assert_eq!(SlotHint::decode(&[0; 128]), Some(SlotHint::default()));
        assert_eq!(SlotHint::offset(4, SlotId(1)), 4096 + 4 * 8192 + 128);
        assert_eq!(slot_table_len(4), 4096 + 4 * 8192 + 4096);
        assert_eq!(slot_table_len(1024), 4096 + 1024 * 8192 + 131072);
    }

    #[test]
    fn slot_count_lives_in_bytes_12_to_16_with_its_flag() {
        let sb = Superblock {
            slots: 4,
            ..sample_superblock().with_features(Features::INCOMPAT_SLOTS)
        };
        let b = sb.encode();
        assert_eq!(u32_at(&b, 12), 4);
        assert_eq!(u64_at(&b, 112), 2, "incompat bit 1");
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        assert_eq!(sb.slot_share(SlotId(3)), 96..128);
        assert_eq!(sb.manifest_half(SlotId(3), 1), (97 * (8 << 20), 8 << 20));
        assert_eq!(sb.slot_segments(SlotId(0)), 2..32);
        assert_eq!(sb.slot_segments(SlotId(3)), 98..128);
    }

    #[test]
    fn timestamps_before_epoch_roundtrip() {
        let t = UNIX_EPOCH - Duration::new(5, 250);
        let ts: Timestamp = t.into();
        assert_eq!(SystemTime::from(ts), t);
    }
}
