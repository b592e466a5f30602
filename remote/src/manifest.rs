//! What the bucket holds under a space's prefix (FORMAT.md "Object-store tier"):
//!
//! - `packs/<blake3>.pack`: chunks as the space stored them (encoded), back to back;
//!   immutable and named by their content's blake3, so a repeated upload writes the same;
//! - `manifests/<seq, 20 digits>-<writer's token>.json.zst`: the whole tree at one moment
//!   (every node's path and attributes, each file's extents, and where each chunk they name
//!   lies: pack, offset, lengths, codec); written after every pack it names; two writers
//!   never name the same object, and only the head says which is real;
//! - `head`: the newest manifest's sequence number and blake3, replaced only with
//!   `If-Match` on the ETag the owner last wrote, after that manifest;
//! - `lease`: which node owns the prefix and until when (`If-None-Match` to take it, `If-Match`
//!   to renew or take over a lapsed one).
//!
//! A reader trusts nothing it fetches: a manifest must hash to what the head says, each
//! chunk must decode to the blake3 that names it.

use crate::{Error, Result};
use ckptfs_engine::format::{ChunkHash, Codec, NodeKind};
use serde::{Deserialize, Serialize};

pub const HEAD: &str = "head";
pub const LEASE: &str = "lease";
pub const PACKS: &str = "packs/";
pub const MANIFESTS: &str = "manifests/";
/// The manifest format this build writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

pub fn manifest_key(seq: u64, token: u64) -> String {
    format!("{MANIFESTS}{seq:020}-{token:016x}.json.zst")
}

/// The sequence number of a manifest key, if it is one.
pub fn manifest_seq(rel: &str) -> Option<u64> {
    rel.strip_prefix(MANIFESTS)?
        .strip_suffix(".json.zst")?
        .split('-')
        .next()?
        .parse()
        .ok()
}

pub fn pack_key(hash: &blake3::Hash) -> String {
    format!("{PACKS}{}.pack", hash.to_hex())
}

pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

pub fn unhex(s: &str) -> Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return Err(Error::Damaged(format!("`{s}` is not hex")));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&s[i..i + 2], 16)
                .map_err(|_| Error::Damaged(format!("`{s}` is not hex")))
        })
        .collect()
}

/// Bytes that are usually text (paths, names) as a string: itself when UTF-8 without a
/// `%` escape, else `%` followed by hex.
pub fn name_to_str(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if !s.starts_with('%') => s.to_string(),
        _ => format!("%{}", hex(b)),
    }
}

pub fn name_from_str(s: &str) -> Result<Vec<u8>> {
    match s.strip_prefix('%') {
        Some(h) => unhex(h),
        None => Ok(s.as_bytes().to_vec()),
    }
}

/// Where one chunk lies in the bucket.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChunkAt {
    /// blake3 of the raw bytes, hex.
    pub hash: String,
    /// Index into `Manifest::packs`.
    pub pack: u32,
    pub off: u64,
    pub stored: u32,
    pub raw: u32,
    pub codec: u8,
}

impl ChunkAt {
    pub fn chunk_hash(&self) -> Result<ChunkHash> {
        let b = unhex(&self.hash)?;
        let a: [u8; 32] = b
            .try_into()
            .map_err(|_| Error::Damaged(format!("chunk hash `{}`", self.hash)))?;
        Ok(ChunkHash(a))
    }

    pub fn codec(&self) -> Result<Codec> {
        Codec::from_u8(self.codec)
            .ok_or_else(|| Error::Damaged(format!("chunk codec {}", self.codec)))
    }
}

/// One node of the tree.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Node {
    /// Path from the root, `/`-separated, no leading slash (`name_to_str`).
    pub path: String,
    /// `file`, `dir`, `symlink`, `fifo`, `socket`, `char`, `block`.
    pub kind: String,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    #[serde(default)]
    pub size: u64,
    pub mtime: i64,
    #[serde(default)]
    pub mtime_ns: u32,
    #[serde(default)]
    pub rdev: u32,
    /// A symlink's target (`name_to_str`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `[name, value]`, both hex.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<[String; 2]>,
    /// `[file offset, length, chunk index (into Manifest::chunks), offset in the chunk]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extents: Vec<[u64; 4]>,
}

pub fn kind_name(k: NodeKind) -> &'static str {
    match k {
        NodeKind::File => "file",
        NodeKind::Dir => "dir",
        NodeKind::Symlink => "symlink",
        NodeKind::Fifo => "fifo",
        NodeKind::Socket => "socket",
        NodeKind::CharDevice => "char",
        NodeKind::BlockDevice => "block",
    }
}

/// The tree at one moment (see the module doc).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub format: u32,
    pub seq: u64,
    /// Unix seconds when the snapshot it describes was taken.
    pub taken_unix: i64,
    /// The node that wrote it (`host pid N`).
    pub owner: String,
    /// Bytes of file content it describes, and stored (encoded) bytes of its chunks.
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    pub packs: Vec<String>,
    pub chunks: Vec<ChunkAt>,
    pub nodes: Vec<Node>,
    /// The root directory's mode, owner, times and attributes (its `path` empty). Absent
    /// from manifests of builds before it: the root is then left as a new space makes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<Node>,
}

impl Manifest {
    /// The object's bytes: zstd-compressed JSON.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("serializable");
        zstd::bulk::compress(&json, 3).expect("zstd compresses in memory")
    }

    /// Reads a manifest object, checked against the blake3 the head gave for it.
    pub fn decode(bytes: &[u8], want: &str) -> Result<Manifest> {
        let got = blake3::hash(bytes).to_hex().to_string();
        if got != want {
            return Err(Error::Damaged(format!(
                "a manifest's blake3 is {got}, the head says {want}: the object was changed \
                 or damaged in the bucket"
            )));
        }
        Self::decode_unchecked(bytes)
    }

    /// Reads a manifest object no head names with its blake3 (gc of older ones).
    pub fn decode_unchecked(bytes: &[u8]) -> Result<Manifest> {
        let json = zstd::stream::decode_all(bytes)
            .map_err(|e| Error::Damaged(format!("a manifest does not decompress: {e}")))?;
        let m: Manifest = serde_json::from_slice(&json)
            .map_err(|e| Error::Damaged(format!("a manifest does not parse: {e}")))?;
        if m.format != MANIFEST_FORMAT {
            return Err(Error::Config(format!(
                "the bucket's manifest has format {}; this build reads {MANIFEST_FORMAT}",
                m.format
            )));
        }
        Ok(m)
    }
}

/// The `head` object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub manifest: String,
    /// blake3 of the manifest object, hex.
    pub blake3: String,
    pub owner: String,
    pub written_unix: i64,
}

/// The `lease` object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Who holds it: `host pid N token`, unique per mount.
    pub owner: String,
    /// Unix seconds after which another node may take it over.
    pub expires_unix: i64,
}

pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys_round_trip() {
        for b in [&b"a/b.txt"[..], b"%odd", b"\xff\xfe"] {
            assert_eq!(name_from_str(&name_to_str(b)).unwrap(), b);
        }
        assert_eq!(manifest_seq(&manifest_key(42, 7)), Some(42));
        assert_eq!(manifest_seq("packs/x"), None);
    }

    #[test]
    fn a_manifest_that_changed_is_refused() {
        let m = Manifest {
            format: MANIFEST_FORMAT,
            seq: 1,
            taken_unix: 0,
            owner: "t".into(),
            logical_bytes: 0,
            stored_bytes: 0,
            packs: vec![],
            chunks: vec![],
            nodes: vec![],
            root: None,
        };
        let b = m.encode();
        let h = blake3::hash(&b).to_hex().to_string();
        assert_eq!(Manifest::decode(&b, &h).unwrap(), m);
        let mut bad = b.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(matches!(Manifest::decode(&bad, &h), Err(Error::Damaged(_))));
    }
}
