//! The journal's records (`journal`, FORMAT.md "Journal"): each metadata transaction a
//! single-slot space commits, as the table rows it wrote and removed, with the stored bytes
//! of the small chunks it added. A close is durable once its record is (one sync of the
//! journal); the table itself is made durable now and then (a checkpoint), and a mount
//! applies the records after the table's last checkpoint.
//!
//! Layout: records back to back from offset 0. Each write of the journal (a flush of the
//! records queued since the last) starts at a `JOURNAL_BLOCK` boundary and is padded with
//! zeros to the next, so a write never rewrites a block holding an earlier, acknowledged
//! record. A record:
//!
//! ```text
//!  0      4      8        16                 32
//!  +------+------+--------+------------------+---------------------+
//!  |magic | len  | seq    | blake3[..16]     | payload (len bytes) |
//!  +------+------+--------+------------------+---------------------+
//! ```
//!
//! `blake3` covers the journal's id (`u64`, kept in the metadata table's counter
//! `journal_id`, new at every read-write open), bytes 0..16 and the payload: a record left
//! by an earlier open fails the check, whatever its number. The payload: `u32` row count, each row
//! `u8` table, `u8` op (1 insert, 2 remove), `u32` key length, the key, and for an insert
//! `u32` value length and the value (redb's own byte encoding of the table's key and value
//! types); then `u32` chunk count, each `u64` data offset, `u32` length, the stored bytes.

use super::cursor::Cur;
use crate::error::Result;

pub const JOURNAL_MAGIC: [u8; 4] = *b"CKJ1";
pub const JOURNAL_HEADER: usize = 32;
/// Every write of the journal starts at a multiple of this and is padded to one.
pub const JOURNAL_BLOCK: u64 = 4096;

pub const OP_INSERT: u8 = 1;
pub const OP_REMOVE: u8 = 2;

/// One row change: table number (`catalog::journal` names them), insert or remove, key,
/// value (empty for a remove).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub table: u8,
    pub op: u8,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// The stored bytes of a chunk the record's transaction added, and where the data file
/// has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InlineChunk {
    pub offset: u64,
    pub bytes: Vec<u8>,
}

/// A record's payload, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    pub rows: Vec<Row>,
    pub chunks: Vec<InlineChunk>,
}

/// Appends a row to a payload being built (`rows` counts them; the count is written by
/// `finish_payload`).
pub fn push_row(out: &mut Vec<u8>, table: u8, op: u8, key: &[u8], value: &[u8]) {
    out.push(table);
    out.push(op);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    if op == OP_INSERT {
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
}

/// The whole record: header, then `rows` (row count and the bytes `push_row` built), then
/// the chunks.
pub fn encode_record(
    id: u64,
    seq: u64,
    rows: u32,
    row_bytes: &[u8],
    chunks: &[InlineChunk],
) -> Vec<u8> {
    let chunk_bytes: usize = chunks.iter().map(|c| 12 + c.bytes.len()).sum();
    let len = 4 + row_bytes.len() + 4 + chunk_bytes;
    let mut out = Vec::with_capacity(JOURNAL_HEADER + len);
    out.extend_from_slice(&JOURNAL_MAGIC);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(&rows.to_le_bytes());
    out.extend_from_slice(row_bytes);
    out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    for c in chunks {
        out.extend_from_slice(&c.offset.to_le_bytes());
        out.extend_from_slice(&(c.bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&c.bytes);
    }
    let sum = checksum(id, &out[..16], &out[JOURNAL_HEADER..]);
    out[16..32].copy_from_slice(&sum);
    out
}

fn checksum(id: u64, head: &[u8], payload: &[u8]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    h.update(&id.to_le_bytes());
    h.update(head);
    h.update(payload);
    h.finalize().as_bytes()[..16].try_into().expect("16 bytes")
}

/// What a record header at some offset says.
#[derive(Debug, PartialEq, Eq)]
pub enum Header {
    /// Zeros: padding, or the journal's unwritten end.
    Zero,
    /// A record of `len` payload bytes with sequence number `seq`, and its checksum.
    Record { len: u32, seq: u64, sum: [u8; 16] },
    /// Anything else: the end of what was written since the journal last started over.
    Other,
}

pub fn decode_header(b: &[u8; JOURNAL_HEADER]) -> Header {
    if b.iter().all(|x| *x == 0) {
        return Header::Zero;
    }
    if b[..4] != JOURNAL_MAGIC {
        return Header::Other;
    }
    Header::Record {
        len: u32::from_le_bytes(b[4..8].try_into().expect("4")),
        seq: u64::from_le_bytes(b[8..16].try_into().expect("8")),
        sum: b[16..32].try_into().expect("16"),
    }
}

/// Whether `payload` is the one journal `id`'s header `head` (its first 16 bytes) and `sum` describe:
/// a record torn by a crash, or stale bytes of an earlier pass, fail this.
pub fn verify(id: u64, head: &[u8; JOURNAL_HEADER], payload: &[u8], sum: &[u8; 16]) -> bool {
    checksum(id, &head[..16], payload) == *sum
}

/// Decodes a verified payload.
pub fn decode_payload(b: &[u8]) -> Result<Payload> {
    let mut c = Cur::new(b, 0, "journal record");
    let n = c.u32()?;
    let mut rows = Vec::with_capacity((n as usize).min(1 << 16));
    for _ in 0..n {
        let table = c.u8()?;
        let op = c.u8()?;
        let kl = c.u32()? as usize;
        let key = c.take(kl)?.to_vec();
        let value = match op {
            OP_INSERT => {
                let vl = c.u32()? as usize;
                c.take(vl)?.to_vec()
            }
            OP_REMOVE => Vec::new(),
            _ => return Err(c.bad(&format!("unknown row operation {op}"))),
        };
        rows.push(Row {
            table,
            op,
            key,
            value,
        });
    }
    let n = c.u32()?;
    let mut chunks = Vec::with_capacity((n as usize).min(1 << 16));
    for _ in 0..n {
        let offset = c.u64()?;
        let len = c.u32()? as usize;
        chunks.push(InlineChunk {
            offset,
            bytes: c.take(len)?.to_vec(),
        });
    }
    if c.left() != 0 {
        return Err(c.bad("bytes after the last chunk"));
    }
    Ok(Payload { rows, chunks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_changed_byte_or_another_journal_fails_its_check() {
        let mut rows = Vec::new();
        push_row(&mut rows, 3, OP_INSERT, b"key", b"value");
        push_row(&mut rows, 4, OP_REMOVE, b"gone", b"");
        let chunks = vec![InlineChunk {
            offset: 8192,
            bytes: vec![7; 100],
        }];
        let rec = encode_record(5, 42, 2, &rows, &chunks);
        let head: [u8; JOURNAL_HEADER] = rec[..JOURNAL_HEADER].try_into().unwrap();
        let Header::Record { len, seq, sum } = decode_header(&head) else {
            panic!("not a record header");
        };
        assert_eq!((len as usize, seq), (rec.len() - JOURNAL_HEADER, 42));
        assert!(verify(5, &head, &rec[JOURNAL_HEADER..], &sum));
        assert!(!verify(6, &head, &rec[JOURNAL_HEADER..], &sum));
        let p = decode_payload(&rec[JOURNAL_HEADER..]).unwrap();
        assert_eq!(p.rows.len(), 2);
        assert_eq!(p.rows[0].value, b"value");
        assert_eq!(p.rows[1].key, b"gone");
        assert_eq!(p.chunks, chunks);
        let mut bad = rec.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(!verify(5, &head, &bad[JOURNAL_HEADER..], &sum));
        assert_eq!(decode_header(&[0; JOURNAL_HEADER]), Header::Zero);
        assert_eq!(decode_header(&[9; JOURNAL_HEADER]), Header::Other);
    }
}
