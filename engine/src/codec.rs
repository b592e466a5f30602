//! Chunk codecs: how a chunk's bytes are turned into stored bytes and back.
//!
//! LZ4 (lz4_flex block format) when it makes the chunk smaller, raw otherwise. For arrays of
//! floats, LZ4 finds few repeats in the interleaved bytes of neighbouring values, but a
//! byte-shuffle (all first bytes, then all second bytes, ...) puts the slowly changing sign,
//! exponent and high mantissa bytes next to each other, and those compress. With the
//! `shuffle` policy every chunk's first 8 KiB are compressed plain and shuffled as 4- and
//! 8-byte elements; the whole chunk is shuffled only where that clearly wins on the
//! sample (shuffle plus LZ4 costs about four times plain LZ4's CPU on compressible data).
//! The codec is recorded per chunk, so readers need no configuration.
//!
//! The default `lz4` policy shuffles too, but only chunks where LZ4 would crawl: arrays of
//! 8-byte elements whose low bytes are zero (float32 values held as float64, integers
//! held as int64, float64 rounded to fewer digits) give LZ4 a 4-byte match every 8 bytes,
//! and a match per 8 bytes costs it 10-50 times its usual time (0.25-0.37 GiB/s on one core
//! of the 2-core VM, against 4.5-19 GiB/s on float weights, fields and random bytes).
//! Shuffled, the zero bytes form runs: such chunks were stored 1.3-2x smaller and encoded
//! 1.9-3.1 times faster (`storm_shuffle_width`). In a store worker's batch, the chunks
//! after a shuffled storm chunk that are storms of the same kind skip the probes
//! (`Streak`, `encode_after`).
//!
//! The `float` policy goes further for floating-point tensors, whose mantissa bytes LZ4
//! cannot shrink at all: each chunk is rotated by one or three bits (the exponent, or its
//! low bits with the mantissa's top two, land in one byte) and split into byte planes, and
//! each plane is Huffman-coded on its own, written as one standard zstd frame
//! (`ckptfs_kernels::float`, FORMAT.md "Codecs") that the zstd library decodes here (blocks
//! with codes of one length are unpacked without it). It is chosen per chunk only where it
//! is smaller than LZ4 would be.

use crate::error::ChunkDamage;
use crate::format::Codec;
use ckptfs_kernels::float;

/// Bytes of a chunk compressed both ways to choose the element width.
const SAMPLE_BYTES: usize = 8 << 10;
/// A shuffled sample must be at least this much smaller than plain LZ4's to be chosen.
const SHUFFLE_MIN_GAIN: f64 = 0.95;

/// Which encodings the store may choose from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// LZ4 or raw; a chunk whose sampled LZ4 output is a storm of short matches is
    /// byte-shuffled first where that compresses its sample better (codecs 2 and 3: only
    /// on a space marked for them, `Space::set_codec_policy`).
    Lz4,
    /// LZ4 or raw, nothing else: what a store writes on a space not marked for the shuffle
    /// codecs (an engine-level open; the mount asks for `Lz4`).
    Lz4Plain,
    /// Also the byte-shuffle before LZ4 where it pays.
    Shuffle,
    /// The float codec where it is smaller than LZ4, else LZ4 or raw.
    Float,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "lz4" => Some(Policy::Lz4),
            "shuffle" => Some(Policy::Shuffle),
            "float" => Some(Policy::Float),
            _ => None,
        }
    }
}

/// Encodes a chunk. Returns the codec and the stored bytes (None: store `data` itself).
pub fn encode(data: &[u8], policy: Policy) -> (Codec, Option<Vec<u8>>) {
    if policy == Policy::Float {
        return encode_float(data);
    }
    if policy == Policy::Shuffle {
        if let Some(width) = shuffle_width(data) {
            return shuffled_or_raw(data, width);
        }
    }
    encode_lz4(data, policy, &probe(data))
}

/// LZ4 or raw under `policy` (`Lz4` also byte-shuffles a storm chunk first where that pays),
/// with the chunk's `probes` taken.
fn encode_lz4(data: &[u8], policy: Policy, probes: &Probes) -> (Codec, Option<Vec<u8>>) {
    if probes.incompressible {
        return (Codec::Raw, None);
    }
    let width = match policy != Policy::Lz4Plain && probes.storm {
        true => storm_shuffle_width(data, probes),
        false => None,
    };
    lz4_or_shuffled(data, width)
}

/// LZ4 of a chunk that LZ4's probes shrank, byte-shuffled by `width` first if given; raw
/// where that does not shrink it.
fn lz4_or_shuffled(data: &[u8], width: Option<usize>) -> (Codec, Option<Vec<u8>>) {
    if let Some(width) = width {
        return shuffled_or_raw(data, width);
    }
    let lz4 = lz4_flex::block::compress(data);
    if lz4.len() >= data.len() {
        return (Codec::Raw, None);
    }
    (Codec::Lz4, Some(lz4))
}

/// A storm chunk the default policy byte-shuffled (`storm_shuffle_width`), remembered for
/// the chunks after it in a store worker's batch (`encode_after`): the width of its shuffle
/// and the fraction of its bytes it stored.
///
/// Why: the storm rule decides from three LZ4 probes of 4 KiB and two shuffled ones, and LZ4
/// crawls through a storm's probes as through the chunk, so on a storm chunk the decision
/// cost about as much as the encoding itself (37 of about 80 us per 64 KiB chunk on one core
/// of the 2-core VM, AMD Zen 3). The chunks of a batch are mostly consecutive chunks of one
/// file, and an array spans many chunks, so the next one is most likely the same kind. One
/// small probe checks that it is still a storm (`still_a_storm`: LZ4 of 1 KiB, against the
/// decision's 12 KiB of plain probes); then it is shuffled and compressed at once, and kept
/// where it stores no more than `STREAK_SLACK` times the fraction the probed chunk did. Anything
/// else (random bytes, text, zeros, a field, an array that shuffles worse) fails one of the
/// two, takes the full decision and ends the streak or starts a new one.
///
/// The float policy keeps a streak too: the transform of the last chunk it stored with the
/// float codec and the fraction stored. A next chunk that LZ4's probes find nothing in (a
/// tensor's next chunk) is planned for that transform only (`float::choose_for`, a quarter
/// of the sample work) and kept where its estimate is within `FLOAT_STREAK_SLACK` of that
/// fraction; anything else takes the full choice. A chunk the float policy stored shuffled
/// by LZ4 (a storm the float codec does not pay on: integer indices) starts the storm streak
/// as under `lz4`, so the chunks after it skip the float codec's choice too.
#[derive(Clone, Copy, Debug, Default)]
pub struct Streak {
    storm: Option<(usize, f32)>,
    float: Option<(float::Transform, f32)>,
}

/// How much worse than the probed chunk of a streak a later chunk may compress shuffled and
/// still be taken as the same kind of array (`Streak`). Chunks of one array vary by a few
/// percent; a different kind of data by far more (text or random bytes shuffled store about
/// as much as unshuffled, several times a storm array's fraction).
const STREAK_SLACK: f32 = 1.25;

/// `encode` of the next chunk of a batch, `streak` saying what the chunk before it was and
/// updated for the one after (see `Streak`). Stores the same codecs as `encode`; under the
/// default policy, a chunk that continues a storm skips the probes.
pub fn encode_after(data: &[u8], policy: Policy, streak: &mut Streak) -> (Codec, Option<Vec<u8>>) {
    if policy == Policy::Float {
        return encode_float_after(data, streak);
    }
    if policy != Policy::Lz4 || data.len() < 4 * PROBE_BYTES {
        *streak = Streak::default();
        return encode(data, policy);
    }
    if let Some(kept) = continue_storm(data, streak) {
        return kept;
    }
    let (codec, out) = encode(data, policy);
    streak.storm = storm_of(codec, &out, data.len());
    (codec, out)
}

/// A chunk of at least `4 * PROBE_BYTES` after a storm chunk the `lz4` policy shuffled
/// (`Streak`), shuffled and compressed as that one was, if it is still a storm and stores
/// within `STREAK_SLACK` of its fraction. None: it takes the full decision.
fn continue_storm(data: &[u8], streak: &Streak) -> Option<(Codec, Option<Vec<u8>>)> {
    let (width, fraction) = streak.storm.filter(|_| still_a_storm(data))?;
    let shuffled = lz4_flex::block::compress(&shuffle(data, width));
    let bound = (fraction * STREAK_SLACK * data.len() as f32).min(data.len() as f32 - 1.0);
    (shuffled.len() as f32 <= bound).then(|| (shuffle_codec(width), Some(shuffled)))
}

/// The storm streak a chunk stored as `codec` starts (`Streak`).
fn storm_of(codec: Codec, out: &Option<Vec<u8>>, len: usize) -> Option<(usize, f32)> {
    match (codec, out) {
        (Codec::Shuffle4Lz4, Some(o)) => Some((4, o.len() as f32 / len as f32)),
        (Codec::Shuffle8Lz4, Some(o)) => Some((8, o.len() as f32 / len as f32)),
        _ => None,
    }
}

/// How much above the fraction the float codec stored of the chunk before a chunk's
/// estimate under the same transform may be and still continue the streak (`Streak`):
/// chunks of one tensor differ by a point or two; another dtype or layout by far more.
const FLOAT_STREAK_SLACK: f32 = 1.05;

/// `encode_after` under the float policy (see `Streak`).
fn encode_float_after(data: &[u8], streak: &mut Streak) -> (Codec, Option<Vec<u8>>) {
    let mut probes = None;
    if let Some((t, fraction)) = streak.float.filter(|_| data.len() >= 4 * PROBE_BYTES) {
        // Only where LZ4 would store the chunk raw: then a frame smaller than the chunk is
        // smaller than what `lz4` stores, as `encode_float` promises.
        let p = probes.insert(probe(data));
        if p.incompressible {
            let (plan, est) = float::choose_for(data, t);
            if est <= fraction * FLOAT_STREAK_SLACK + 0.01 && est < FLOAT_MIN_GAIN {
                let frame = float::encode_plan(data, plan);
                if frame.len() < data.len() {
                    streak.float = Some((t, frame.len() as f32 / data.len() as f32));
                    return (Codec::Float(t), Some(frame));
                }
            }
        }
    }
    // A storm the float codec did not pay on (integers LZ4 stores shuffled) goes on as the
    // `lz4` policy's storm streak does, without the float codec's choice.
    if data.len() >= 4 * PROBE_BYTES {
        if let Some(kept) = continue_storm(data, streak) {
            return kept;
        }
    }
    // The probes once: a chunk that left the streak takes the full choice with them.
    let (codec, out) = match probes {
        Some(p) => encode_float_probed(data, &p),
        None => encode_float(data),
    };
    streak.float = match (codec, &out) {
        (Codec::Float(t), Some(o)) => Some((t, o.len() as f32 / data.len() as f32)),
        _ => None,
    };
    streak.storm = storm_of(codec, &out, data.len());
    (codec, out)
}

/// Bytes of the one probe that checks a chunk after a storm streak is a storm too.
const STREAK_PROBE_BYTES: usize = 1 << 10;

/// Whether LZ4 takes a short match every few bytes in the middle `STREAK_PROBE_BYTES` of
/// `data` (as `Probes::storm` over one small probe): what a chunk must be to continue a
/// storm streak. Text, zeros and fields over zeros give LZ4 long matches, random bytes none,
/// so they leave the streak here, before a shuffled LZ4 run of the whole chunk is spent on
/// them.
fn still_a_storm(data: &[u8]) -> bool {
    let o = data.len() / 2 - STREAK_PROBE_BYTES / 2;
    let probe = &data[o..o + STREAK_PROBE_BYTES];
    let c = lz4_flex::block::compress(probe);
    c.len() < probe.len() && lz4_sequences(&c) * STORM_BYTES > STREAK_PROBE_BYTES
}

/// Chunks shorter than this skip the float codec: its frame and tables cost more than an
/// entropy coder could save on so few bytes.
const FLOAT_MIN_BYTES: usize = 1024;
/// The float codec is run only where its estimate is at least this much below LZ4's size:
/// a near tie is not worth encoding twice (the estimate is within a few percent).
const FLOAT_MIN_GAIN: f32 = 0.98;
/// Where LZ4's probes compress the chunk (it is not a tensor of floats with nothing LZ4 can
/// find: integers, fp64 fields over zeros, text, logs), the float codec is run only where
/// its estimate is at most this fraction of what LZ4 is expected to store. On such data it
/// saved 2-3% (int64 indices 0.246 against LZ4's 0.254, an fp64 field 0.501 against 0.514)
/// for 1.2-1.3 CPU-s/GiB more than LZ4's encoding and a slower read; where it does pay on
/// them it pays far more (fp32 values stored as fp64: 0.43 against 0.56). Tensors LZ4
/// finds nothing in are held to `FLOAT_MIN_GAIN` only.
const FLOAT_MIN_GAIN_OVER_LZ4: f32 = 0.85;
/// How far `float::quick_floor` of a chunk may sit below its true floor by sampling noise:
/// on random bytes it ranged 0.970-0.999 (200 chunks), so a floor above `lz4 * 0.98 - 0.02`
/// sends random chunks past the float codec without a full choice; what it also sends
/// past is data the float codec could shrink by 2-4% at most.
const QUICK_FLOOR_NOISE: f32 = 0.02;

/// The `float` policy: the float codec where it is smaller than what the `lz4` policy
/// stores (by `FLOAT_MIN_GAIN`, or by `FLOAT_MIN_GAIN_OVER_LZ4` on data LZ4 compresses),
/// else that, so no chunk is stored larger than under `lz4`.
///
/// CPU per chunk: the LZ4 probes `lz4` takes anyway; a floor under the float codec's
/// fraction from a 1 KiB sample (`float::quick_floor`, about 4 us on a 2-core VM): where
/// it is not below what LZ4 stores of the probes by the gain (random bytes, text, logs),
/// the chunk is stored as `lz4` stores it and nothing else is spent. Otherwise a plan and
/// estimate from a 4 KiB sample (`float::choose`), and again `lz4`'s storage where the
/// estimate does not beat what it should store by the gain; the `lz4` encoding, unless its
/// probes found nothing to compress (float weights); then the float frame only where the
/// estimate beats it.
///
/// In a storm (`Probes::storm`: LZ4 would take a short match every few bytes, at 0.25-0.37
/// GiB/s, the slowest step by far) whose estimate is below what `lz4` would store of the
/// probes (shuffled, where it shuffles) by the gain, the frame is encoded first and kept,
/// without LZ4 of the whole chunk, where it is that much smaller. Such chunks are
/// homogeneous arrays, so the probes' ratio stands for the chunk's; the comparison is with
/// it, not with the chunk's own LZ4.
fn encode_float(data: &[u8]) -> (Codec, Option<Vec<u8>>) {
    if data.len() < FLOAT_MIN_BYTES {
        return encode(data, Policy::Lz4);
    }
    encode_float_probed(data, &probe(data))
}

/// `encode_float` of a chunk of at least `FLOAT_MIN_BYTES` whose LZ4 `probes` are taken.
fn encode_float_probed(data: &[u8], probes: &Probes) -> (Codec, Option<Vec<u8>>) {
    // What `lz4` should store: raw, or the probes' ratio, or in a storm that `lz4` shuffles
    // the shuffled probe's.
    let shuffle = match probes.storm {
        true => storm_shuffle(data, probes),
        false => None,
    };
    let lz4 = |data| match probes.incompressible {
        true => (Codec::Raw, None),
        false => lz4_or_shuffled(data, shuffle.map(|s| s.0)),
    };
    let (lz4_guess, gain) = match (probes.incompressible, shuffle) {
        (true, _) => (1.0, FLOAT_MIN_GAIN),
        (false, None) => (probes.ratio, FLOAT_MIN_GAIN_OVER_LZ4),
        (false, Some((_, r))) => (probes.ratio.min(r), FLOAT_MIN_GAIN_OVER_LZ4),
    };
    if float::quick_floor(data).is_some_and(|floor| floor + QUICK_FLOOR_NOISE >= lz4_guess * gain) {
        return lz4(data);
    }
    let (plan, est) = float::choose(data);
    if est >= lz4_guess * gain {
        // Not enough below what LZ4 should store to be worth a frame.
        return lz4(data);
    }
    let mut frame = None;
    if probes.storm {
        let f = float::encode_plan(data, plan);
        if (f.len() as f32) < lz4_guess * data.len() as f32 * gain {
            return (Codec::Float(plan.transform), Some(f));
        }
        frame = Some(f);
    }
    let (codec, stored) = lz4(data);
    let lz4_len = stored.as_ref().map_or(data.len(), Vec::len);
    if est * (data.len() as f32) < lz4_len as f32 * gain {
        let frame = frame.unwrap_or_else(|| float::encode_plan(data, plan));
        if frame.len() < lz4_len {
            return (Codec::Float(plan.transform), Some(frame));
        }
    }
    (codec, stored)
}

/// Decodes a float-codec chunk into the chunk's bytes. A frame of the subset this encoder
/// writes (`float::frame::blocks`) is read block by block: planes stored as one raw block
/// each are joined from where they lie in `stored`, and only the other blocks are decoded
/// into the thread's planes buffer (compressed ones by the zstd library, as one-block
/// frames). Any other frame is decoded whole by the zstd library into that buffer. The
/// buffer holds at most `raw_len` bytes, so a damaged frame cannot make it allocate more;
/// `float::inverse_rows` undoes the transform.
fn decode_float(
    t: float::Transform,
    stored: &[u8],
    raw_len: usize,
) -> std::result::Result<Vec<u8>, ChunkDamage> {
    thread_local! {
        /// One decompression context per thread (creating one costs more than decoding a
        /// small chunk), its planes buffer (at most the largest chunk decoded here) and the
        /// buffer of one-block frames (at most a block and its header).
        static ZSTD: std::cell::RefCell<(Option<zstd::bulk::Decompressor<'static>>, Vec<u8>, Vec<u8>)> =
            const { std::cell::RefCell::new((None, Vec::new(), Vec::new())) };
    }
    let invalid = |e: std::io::Error| ChunkDamage::Decode(format!("not a valid zstd frame: {e}"));
    ZSTD.with(|z| {
        let (z, planes, frame) = &mut *z.borrow_mut();
        if z.is_none() {
            *z = Some(zstd::bulk::Decompressor::new().map_err(invalid)?);
        }
        let z = z.as_mut().expect("made above");
        let w = usize::from(t.width);
        let n = raw_len / w;
        let mut direct: [Option<&[u8]>; 8] = [None; 8];
        if let Some(blocks) = float::frame::blocks(stored, raw_len) {
            // Every byte is written by a block (they cover the content): no clearing.
            if planes.len() < raw_len {
                planes.resize(raw_len, 0);
            }
            for b in blocks {
                let dst = &mut planes[b.at..b.at + b.len];
                match b.kind {
                    float::frame::BlockKind::Raw(bytes)
                        if n > 0 && b.len == n && b.at % n == 0 && b.at / n < w =>
                    {
                        direct[b.at / n] = Some(bytes);
                    }
                    float::frame::BlockKind::Raw(bytes) => dst.copy_from_slice(bytes),
                    float::frame::BlockKind::Rle(v) => dst.fill(v),
                    float::frame::BlockKind::Literals(content)
                        if float::frame::decode_fixed(content, dst) => {}
                    float::frame::BlockKind::Literals(content) => {
                        float::frame::one_block_frame(content, b.len, frame);
                        let got = z.decompress_to_buffer(&frame[..], dst).map_err(invalid)?;
                        if got != b.len {
                            return Err(ChunkDamage::Decode(format!(
                                "a block decodes to {got} bytes, its header says {}",
                                b.len
                            )));
                        }
                    }
                }
            }
        } else {
            planes.clear();
            planes.reserve_exact(raw_len);
            let decoded = z
                .decompress_to_buffer(stored, &mut *planes)
                .map_err(invalid)?;
            if decoded != raw_len {
                return Err(ChunkDamage::Decode(format!(
                    "it decodes to {decoded} bytes, its record says {raw_len}"
                )));
            }
        }
        let planes = &planes[..raw_len];
        let rows: [&[u8]; 8] = std::array::from_fn(|j| {
            direct[j].unwrap_or_else(|| &planes[(j * n).min(raw_len)..((j + 1) * n).min(raw_len)])
        });
        Ok(float::inverse_rows(&rows[..w], &planes[n * w..], t))
    })
}

/// Bytes of each of the three probes `probe` compresses.
const PROBE_BYTES: usize = 4 << 10;

/// What LZ4 made of three probes (start, middle, end) of a chunk at least 4 probes long.
struct Probes {
    /// LZ4 shrank none of them: random or encrypted bytes and float weights, which LZ4
    /// would spend about 0.2 CPU-seconds per GiB on to store raw anyway. The probes cost a
    /// fifth of that on a 64 KiB chunk. What this can miss: a chunk that compresses only
    /// through matches longer apart than a probe (its probes all look random); it is then
    /// stored raw, as correct as ever, only larger.
    incompressible: bool,
    /// LZ4 emitted a sequence (literals and a match) per fewer than `STORM_BYTES` bytes of
    /// the probes: whole-chunk LZ4 would run at a fraction of its usual speed.
    storm: bool,
    /// What LZ4 stored of the probes, over their size (1 where the chunk is too short to
    /// probe).
    ratio: f32,
    /// LZ4's size of the middle probe and its sequences: what `storm_shuffle_width`
    /// compares the shuffled probe with.
    middle: (usize, usize),
}

/// Bytes per LZ4 sequence below which a chunk is a storm of short matches. On one core of
/// the 2-core VM (AMD Zen 3): float32 values held as float64, int64 indices and float64
/// rounded to 34 bits came out at 8.0-8.2 bytes per sequence and 0.29-0.37 GiB/s; the
/// bench's field data, text and zero-padded data at over 100 and 1.2-13 GiB/s.
const STORM_BYTES: usize = 16;

#[cfg(test)]
thread_local! {
    /// `probe` calls on this thread, for the tests of `encode_after`.
    static PROBES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn probe(data: &[u8]) -> Probes {
    #[cfg(test)]
    PROBES.with(|c| c.set(c.get() + 1));
    if data.len() < 4 * PROBE_BYTES {
        return Probes {
            incompressible: false,
            storm: false,
            ratio: 1.0,
            middle: (0, 0),
        };
    }
    let (mut shrank, mut sequences, mut stored, mut middle) = (false, 0, 0, (0, 0));
    for (i, o) in [
        0,
        data.len() / 2 - PROBE_BYTES / 2,
        data.len() - PROBE_BYTES,
    ]
    .into_iter()
    .enumerate()
    {
        let probe = &data[o..o + PROBE_BYTES];
        let c = lz4_flex::block::compress(probe);
        let n = lz4_sequences(&c);
        shrank |= c.len() < probe.len();
        sequences += n;
        stored += c.len().min(probe.len());
        if i == 1 {
            middle = (c.len(), n);
        }
    }
    Probes {
        incompressible: !shrank,
        storm: shrank && sequences * STORM_BYTES > 3 * PROBE_BYTES,
        ratio: stored as f32 / (3 * PROBE_BYTES) as f32,
        middle,
    }
}

/// The number of sequences in an LZ4 block (each a token, its literals and, but for the
/// last, a match): how many matches the compressor took, which sets its speed. Stops at
/// the end of `block` if it is cut short (the count is then of what is there).
fn lz4_sequences(block: &[u8]) -> usize {
    // A length field continues while its bytes are 255 (LZ4 block format).
    fn extra(block: &[u8], i: &mut usize) -> usize {
        let mut n = 0;
        while let Some(&b) = block.get(*i) {
            *i += 1;
            n += b as usize;
            if b != 255 {
                break;
            }
        }
        n
    }
    let (mut i, mut n) = (0, 0);
    while let Some(&token) = block.get(i) {
        i += 1;
        n += 1;
        let mut literals = (token >> 4) as usize;
        if literals == 15 {
            literals += extra(block, &mut i);
        }
        i += literals + 2; // the literals, then the match's 2-byte offset
        if i > block.len() {
            break; // the last sequence has no match
        }
        if token & 15 == 15 {
            extra(block, &mut i);
        }
    }
    n
}

/// `data` shuffled as `width`-byte elements then LZ4'd, or raw where that is no smaller.
fn shuffled_or_raw(data: &[u8], width: usize) -> (Codec, Option<Vec<u8>>) {
    let shuffled = lz4_flex::block::compress(&shuffle(data, width));
    if shuffled.len() >= data.len() {
        return (Codec::Raw, None);
    }
    (shuffle_codec(width), Some(shuffled))
}

/// The codec of a byte-shuffle of `width`-byte elements (4 or 8) before LZ4.
fn shuffle_codec(width: usize) -> Codec {
    match width {
        4 => Codec::Shuffle4Lz4,
        _ => Codec::Shuffle8Lz4,
    }
}

/// The middle one of `probe`'s three probes.
fn middle_probe(data: &[u8]) -> &[u8] {
    let o = data.len() / 2 - PROBE_BYTES / 2;
    &data[o..o + PROBE_BYTES]
}

/// For a storm chunk (`Probes::storm`): the element width whose shuffle of the middle
/// probe LZ4 shrinks clearly more than plain (`Probes::middle`, already compressed), with
/// fewer sequences (so the whole chunk encodes faster too), if any. Two shuffles and LZ4
/// runs of one probe: a few percent of what plain LZ4 of a storm chunk costs.
fn storm_shuffle_width(data: &[u8], probes: &Probes) -> Option<usize> {
    storm_shuffle(data, probes).map(|(w, _)| w)
}

/// `storm_shuffle_width`, and the fraction LZ4 stored of the middle probe shuffled so.
fn storm_shuffle(data: &[u8], probes: &Probes) -> Option<(usize, f32)> {
    let probe = middle_probe(data);
    let (plain_len, plain_seq) = probes.middle;
    [8, 4]
        .into_iter()
        .map(|w| (w, lz4_flex::block::compress(&shuffle(probe, w))))
        .filter(|(_, c)| {
            (c.len() as f64) < plain_len as f64 * SHUFFLE_MIN_GAIN && lz4_sequences(c) < plain_seq
        })
        .min_by_key(|(_, c)| c.len())
        .map(|(w, c)| (w, c.len() as f32 / probe.len() as f32))
}

/// The element width whose shuffle compresses a sample of the chunk clearly better than
/// plain LZ4 does, if any. Smooth float fields often do not compress at all without the
/// shuffle, so every chunk is sampled (three LZ4 runs and two shuffles of `SAMPLE_BYTES`).
fn shuffle_width(data: &[u8]) -> Option<usize> {
    let sample = &data[..data.len().min(SAMPLE_BYTES)];
    let plain = lz4_flex::block::compress(sample).len().min(sample.len());
    let s4 = lz4_flex::block::compress(&shuffle(sample, 4)).len();
    let s8 = lz4_flex::block::compress(&shuffle(sample, 8)).len();
    let (best, len) = if s8 <= s4 { (8, s8) } else { (4, s4) };
    ((len as f64) < plain as f64 * SHUFFLE_MIN_GAIN).then_some(best)
}

/// `decode` of borrowed stored bytes: raw chunks are not copied.
pub fn decode_slice(
    codec: Codec,
    stored: &[u8],
    raw_len: usize,
) -> std::result::Result<std::borrow::Cow<'_, [u8]>, ChunkDamage> {
    if codec == Codec::Raw && stored.len() == raw_len {
        return Ok(std::borrow::Cow::Borrowed(stored));
    }
    // Decoded straight from the borrowed bytes (no copy of them first).
    checked_len(decode_from(codec, stored, raw_len)?, raw_len).map(std::borrow::Cow::Owned)
}

/// The decoding of borrowed `stored` bytes into a new buffer (a copy for `Raw`).
fn decode_from(
    codec: Codec,
    stored: &[u8],
    raw_len: usize,
) -> std::result::Result<Vec<u8>, ChunkDamage> {
    let lz4 = |s: &[u8]| {
        lz4_flex::block::decompress(s, raw_len).map_err(|e| ChunkDamage::Decode(e.to_string()))
    };
    Ok(match codec {
        Codec::Raw => stored.to_vec(),
        Codec::Lz4 => lz4(stored)?,
        Codec::Shuffle4Lz4 => unshuffle(&lz4(stored)?, 4),
        Codec::Shuffle8Lz4 => unshuffle(&lz4(stored)?, 8),
        Codec::Float(t) => decode_float(t, stored, raw_len)?,
    })
}

/// `raw`, if it has the length the chunk's record gives.
fn checked_len(raw: Vec<u8>, raw_len: usize) -> std::result::Result<Vec<u8>, ChunkDamage> {
    if raw.len() != raw_len {
        return Err(ChunkDamage::Decode(format!(
            "it decodes to {} bytes, its record says {raw_len}",
            raw.len()
        )));
    }
    Ok(raw)
}

/// Decodes stored bytes into the chunk's `raw_len` bytes. Knows nothing of which chunk
/// it decodes: the caller names it in the error (`chunk::Stored::verify`).
pub fn decode(
    codec: Codec,
    stored: Vec<u8>,
    raw_len: usize,
) -> std::result::Result<Vec<u8>, ChunkDamage> {
    let raw = match codec {
        Codec::Raw => stored,
        _ => decode_from(codec, &stored, raw_len)?,
    };
    checked_len(raw, raw_len)
}

/// Byte-transposes `data` as `data.len() / width` elements of `width` bytes: output byte
/// `b * n + e` is byte `b` of element `e`; trailing bytes that make no whole element are
/// copied last. The float codec's planes are the same transposition (one implementation,
/// SIMD where the processor has it).
pub use ckptfs_kernels::float::{shuffle, unshuffle};

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    /// Random bytes skip LZ4; data with a compressible part anywhere a probe looks, or short
    /// chunks, are compressed as before.
    #[test]
    fn probes_skip_random_chunks_only() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let mut random = vec![0u8; 64 << 10];
        rng.fill_bytes(&mut random);
        assert!(probe(&random).incompressible);
        assert_eq!(encode(&random, Policy::Lz4).0, Codec::Raw);
        // A compressible tail (a header then zero padding, say) is found by the last probe.
        let mut tail = random.clone();
        tail[40 << 10..].fill(0);
        assert!(!probe(&tail).incompressible);
        assert_eq!(encode(&tail, Policy::Lz4).0, Codec::Lz4);
        let text: Vec<u8> = b"step 1000 loss 0.1234 lr 3e-4\n"
            .iter()
            .cycle()
            .take(64 << 10)
            .copied()
            .collect();
        assert!(!probe(&text).incompressible);
        assert!(
            !probe(&random[..12 << 10]).incompressible,
            "too short to probe"
        );
    }

    /// Float32 values held as float64 (their low 29 bits zero) and int64 indices: LZ4
    /// finds a 4-byte match about every 8 bytes (a storm); bench-like field data (a bump
    /// over zeros), text and zero runs do not.
    fn storm_and_calm_data() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
        let f32_as_f64: Vec<u8> = (0..8192)
            .flat_map(|_| f64::from(rng.random::<f32>() * 2.0 - 1.0).to_le_bytes())
            .collect();
        let indices: Vec<u8> = (0..8192)
            .flat_map(|_| rng.random_range(0i64..50_000).to_le_bytes())
            .collect();
        let bump: Vec<u8> = (0..8192)
            .flat_map(|i| {
                let x = (i as f64 - 4000.0) / 600.0;
                let v = 250.0 * (-x * x).exp();
                (if v < f64::MIN_POSITIVE { 0.0 } else { v }).to_le_bytes()
            })
            .collect();
        let text: Vec<u8> = (0..3000)
            .flat_map(|i| {
                format!("step {i} loss {:.4} lr 3e-4\n", 1.0 / (1.0 + i as f64)).into_bytes()
            })
            .take(64 << 10)
            .collect();
        (
            vec![f32_as_f64, indices],
            vec![bump, text, vec![0u8; 64 << 10]],
        )
    }

    /// The default policy byte-shuffles storm chunks, which then store smaller than plain
    /// LZ4 and decode to their input; `Lz4Plain` never does; calm data is LZ4 as before.
    #[test]
    fn storm_chunks_are_shuffled_under_lz4_only() {
        let (storms, calm) = storm_and_calm_data();
        for d in &storms {
            assert!(probe(d).storm, "a storm");
            let (codec, stored) = encode(d, Policy::Lz4);
            assert_eq!(codec, Codec::Shuffle8Lz4);
            let stored = stored.expect("compressed");
            let (plain_codec, plain) = encode(d, Policy::Lz4Plain);
            assert_eq!(plain_codec, Codec::Lz4);
            let plain = plain.expect("compressed");
            assert!(
                stored.len() * 10 < plain.len() * 9,
                "shuffled {} vs plain {} bytes",
                stored.len(),
                plain.len()
            );
            assert_eq!(&decode(codec, stored, d.len()).unwrap(), d);
        }
        for d in &calm {
            assert!(!probe(d).storm, "not a storm");
            assert_eq!(encode(d, Policy::Lz4).0, Codec::Lz4);
        }
    }

    /// Consecutive chunks of one storm array, as a store worker's batch holds them: the first
    /// is probed and byte-shuffled, the rest continue its streak without a probe and store
    /// exactly what `encode` stores.
    #[test]
    fn a_storm_streak_skips_the_probes_and_stores_what_encode_stores() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(12);
        let array: Vec<Vec<u8>> = (0..6)
            .map(|_| {
                (0..8192)
                    .flat_map(|_| f64::from(rng.random::<f32>() * 2.0 - 1.0).to_le_bytes())
                    .collect()
            })
            .collect();
        let mut streak = Streak::default();
        let probes = PROBES.with(|c| c.get());
        let got: Vec<_> = array
            .iter()
            .map(|d| encode_after(d, Policy::Lz4, &mut streak))
            .collect();
        assert_eq!(
            PROBES.with(|c| c.get()) - probes,
            1,
            "only the first chunk of the streak is probed"
        );
        for (d, got) in array.iter().zip(got) {
            assert_eq!(got, encode(d, Policy::Lz4));
            assert_eq!(got.0, Codec::Shuffle8Lz4);
        }
        // Under the other policies there is no storm streak: every chunk as `encode`.
        for policy in [Policy::Lz4Plain, Policy::Shuffle] {
            let mut streak = Streak::default();
            for d in &array {
                assert_eq!(encode_after(d, policy, &mut streak), encode(d, policy));
            }
        }
    }

    /// Consecutive chunks of fp32 and bf16 tensors under the float policy, as a store
    /// worker's batch holds them, cut at odd offsets: the chunks after the first continue
    /// the first one's transform, decode to their bytes and store within half a percent of
    /// what a full choice stores; a chunk of text after them leaves the streak and is
    /// stored as `encode` stores it.
    #[test]
    fn a_float_streak_keeps_the_transform_and_stores_what_a_full_choice_stores() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(21);
        let normal = |rng: &mut rand::rngs::SmallRng| -> f32 {
            let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-9), rng.random());
            0.02 * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        };
        let fp32: Vec<u8> = (0..200_000)
            .flat_map(|_| normal(&mut rng).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = fp32.chunks(4).flat_map(|c| [c[2], c[3]]).collect();
        for tensor in [&fp32, &bf16] {
            let mut streak = Streak::default();
            let mut at = 3;
            while at + 70_001 <= tensor.len() {
                let d = &tensor[at..at + 60_001 + at % 10_000];
                at += d.len();
                let (codec, stored) = encode_after(d, Policy::Float, &mut streak);
                assert!(matches!(codec, Codec::Float(_)), "{codec:?}");
                let stored = stored.expect("encoded");
                let full = encode(d, Policy::Float).1.expect("encoded").len();
                assert!(
                    stored.len() as f64 <= full as f64 * 1.005,
                    "streak {} vs full choice {full} bytes",
                    stored.len()
                );
                assert_eq!(decode(codec, stored, d.len()).unwrap(), d);
            }
            assert!(streak.float.is_some(), "tensor chunks keep the streak");
            let text: Vec<u8> = (0..4000)
                .flat_map(|i| format!("step {i} loss {:.4}\n", 1.0 / (i + 1) as f64).into_bytes())
                .take(60_000)
                .collect();
            assert_eq!(
                encode_after(&text, Policy::Float, &mut streak),
                encode(&text, Policy::Float)
            );
            assert!(streak.float.is_none(), "text ends the streak");
        }
    }

    /// A chunk of another kind after a storm streak: random bytes, text, a field over zeros
    /// and zeros are not storms, so they are stored as `encode` stores them (raw, plain LZ4)
    /// and the streak ends; another storm array continues it, stored within its bound, and
    /// decodes to its bytes.
    #[test]
    fn a_chunk_of_another_kind_ends_a_storm_streak() {
        let (storms, calm) = storm_and_calm_data();
        let mut random = vec![0u8; 64 << 10];
        rand::rngs::SmallRng::seed_from_u64(13).fill_bytes(&mut random);
        let started = || {
            let mut streak = Streak::default();
            let first = encode_after(&storms[0], Policy::Lz4, &mut streak);
            assert_eq!(first.0, Codec::Shuffle8Lz4);
            assert!(streak.storm.is_some(), "a storm starts a streak");
            let fraction = first.1.expect("compressed").len() as f32 / storms[0].len() as f32;
            (streak, fraction)
        };
        for d in [&random, &calm[0], &calm[1], &calm[2]] {
            let (mut streak, _) = started();
            let got = encode_after(d, Policy::Lz4, &mut streak);
            assert_eq!(got, encode(d, Policy::Lz4));
            assert!(matches!(got.0, Codec::Raw | Codec::Lz4), "{:?}", got.0);
            assert!(streak.storm.is_none(), "the streak ended");
        }
        let (mut streak, fraction) = started();
        let probes = PROBES.with(|c| c.get());
        let (codec, stored) = encode_after(&storms[1], Policy::Lz4, &mut streak);
        assert_eq!(PROBES.with(|c| c.get()), probes, "continued without probes");
        let stored = stored.expect("compressed");
        assert!(stored.len() as f32 <= fraction * STREAK_SLACK * storms[1].len() as f32);
        assert_eq!(decode(codec, stored, storms[1].len()).unwrap(), storms[1]);
    }

    /// Under the float policy a storm chunk takes the float codec without LZ4 of the whole
    /// chunk (`encode_float`) where the frame is `FLOAT_MIN_GAIN_OVER_LZ4` below what `lz4`
    /// stores; a storm it saves only a few percent on is stored exactly as `lz4` stores it.
    #[test]
    fn float_policy_takes_storm_chunks_where_it_pays_and_stays_below_lz4() {
        let (storms, _) = storm_and_calm_data();
        let [f32_as_f64, indices] = &storms[..] else {
            panic!("two storms")
        };
        // fp32 values stored as fp64: the float codec stores far less than shuffled LZ4.
        let (codec, stored) = encode(f32_as_f64, Policy::Float);
        assert!(matches!(codec, Codec::Float(_)), "{codec:?}");
        let stored = stored.expect("encoded");
        let lz4 = encode(f32_as_f64, Policy::Lz4).1.expect("compressed");
        assert!(
            (stored.len() as f32) < lz4.len() as f32 * FLOAT_MIN_GAIN_OVER_LZ4,
            "float {} vs LZ4 {} bytes",
            stored.len(),
            lz4.len()
        );
        assert_eq!(
            &decode(codec, stored, f32_as_f64.len()).unwrap(),
            f32_as_f64
        );
        // Integer indices: a frame would save a few percent over shuffled LZ4, not worth
        // its encoding; they are stored as `lz4` stores them.
        assert_eq!(encode(indices, Policy::Float), encode(indices, Policy::Lz4));
        assert!(matches!(
            encode(indices, Policy::Lz4).0,
            Codec::Shuffle4Lz4 | Codec::Shuffle8Lz4
        ));
    }

    /// `lz4_sequences` counts what the compressor emitted: one all-literal sequence for
    /// random bytes, a handful for zeros, one per few bytes of a storm; and a block cut
    /// short ends the count without reading past it.
    #[test]
    fn lz4_sequences_counts_the_blocks_sequences() {
        let mut random = vec![0u8; 4096];
        rand::rngs::SmallRng::seed_from_u64(3).fill_bytes(&mut random);
        assert_eq!(lz4_sequences(&lz4_flex::block::compress(&random)), 1);
        let zeros = lz4_sequences(&lz4_flex::block::compress(&[0u8; 4096]));
        assert!((1..=3).contains(&zeros), "{zeros} sequences");
        let (storms, _) = storm_and_calm_data();
        let c = lz4_flex::block::compress(&storms[0][..4096]);
        let n = lz4_sequences(&c);
        assert!((4096 / 16..4096 / 4).contains(&n), "{n} sequences");
        for cut in [1, c.len() / 2, c.len() - 1] {
            assert!(lz4_sequences(&c[..cut]) <= n);
        }
    }

    /// The vendored lz4_flex copies long overlapping matches by doubling (vendor/lz4_flex/
    /// PATCH.md): runs of every short period and many lengths, in the middle of a block and
    /// at its end, decode to what was compressed.
    #[test]
    fn lz4_decodes_runs_of_every_short_period() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(13);
        for period in 1..=70usize {
            for len in [31, 32, 33, 47, 100, 1000, 4099, 65_536] {
                let mut unit = vec![0u8; period];
                rng.fill_bytes(&mut unit);
                let run: Vec<u8> = unit.iter().copied().cycle().take(len).collect();
                let mut head = vec![0u8; 37];
                rng.fill_bytes(&mut head);
                let mut tail = vec![0u8; 29];
                rng.fill_bytes(&mut tail);
                for data in [
                    [&head[..], &run, &tail].concat(),
                    [&head[..], &run].concat(),
                    run.clone(),
                ] {
                    let c = lz4_flex::block::compress(&data);
                    let d = lz4_flex::block::decompress(&c, data.len()).expect("decodes");
                    assert!(d == data, "period {period} length {len}");
                }
            }
        }
    }

    #[test]
    fn shuffle_round_trips_every_length_and_width() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for len in (0..200).chain([4095, 4096, 65_537]) {
            let mut d = vec![0u8; len];
            rng.fill_bytes(&mut d);
            for w in [4, 8] {
                assert_eq!(unshuffle(&shuffle(&d, w), w), d, "len {len} width {w}");
            }
        }
    }

    /// Every policy's output decodes to the input; a smooth float64 field picks the
    /// 8-byte shuffle and stores fewer bytes than plain LZ4; random data stays raw.
    #[test]
    fn encodings_decode_and_shuffle_wins_on_smooth_floats() {
        let field: Vec<u8> = (0..8192)
            .flat_map(|i| (1.0 + (i as f64 * 0.001).sin() * 1e-3).to_le_bytes())
            .collect();
        let mut random = vec![0u8; 65_536];
        rand::rngs::SmallRng::seed_from_u64(1).fill_bytes(&mut random);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(2);
        let zeros_and_noise: Vec<u8> = (0..65_536)
            .map(|i| if i % 1000 < 900 { 0 } else { rng.random() })
            .collect();
        for d in [&field, &random, &zeros_and_noise] {
            for p in [Policy::Lz4, Policy::Shuffle] {
                let (codec, stored) = encode(d, p);
                let stored = stored.unwrap_or_else(|| d.to_vec());
                assert_eq!(&decode(codec, stored, d.len()).unwrap(), d);
            }
        }
        let (c, s) = encode(&field, Policy::Shuffle);
        let (_, plain) = encode(&field, Policy::Lz4);
        assert_eq!(c, Codec::Shuffle8Lz4);
        let plain_len = plain.map_or(field.len(), |p| p.len());
        let s = s.unwrap().len();
        assert!(
            s * 10 < plain_len * 8,
            "shuffled {s} vs plain {plain_len} bytes"
        );
        assert_eq!(encode(&random, Policy::Shuffle).0, Codec::Raw);
    }

    /// The float policy stores float arrays smaller than LZ4 and never stores anything more
    /// than 0.5% larger than LZ4 would (text, zeros, random, short chunks), and every
    /// encoding decodes to its input.
    #[test]
    fn float_policy_wins_on_floats_and_never_loses_to_lz4() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let normal = |rng: &mut rand::rngs::SmallRng| -> f32 {
            // Box-Muller: a true normal, as initialised weights are.
            let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-9), rng.random());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        };
        let fp32: Vec<u8> = (0..16384)
            .flat_map(|_| (0.02 * normal(&mut rng)).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = fp32.chunks(4).flat_map(|c| [c[2], c[3]]).collect();
        let mut random = vec![0u8; 65_536];
        rng.fill_bytes(&mut random);
        let text: Vec<u8> = (0..6000)
            .flat_map(|i| {
                format!("step {i} loss {:.4} lr 3e-4\n", 1.0 / (i + 1) as f64).into_bytes()
            })
            .take(65_536)
            .collect();
        let zeros = vec![0u8; 65_536];
        let lz4_len = |d: &[u8]| encode(d, Policy::Lz4).1.map_or(d.len(), |s| s.len());
        for (name, d, most) in [
            ("fp32", &fp32, Some(0.88)),
            ("bf16", &bf16, Some(0.70)),
            ("random", &random, None),
            ("text", &text, None),
            ("zeros", &zeros, None),
            ("short", &fp32[..700].to_vec(), None),
        ] {
            let (codec, stored) = encode(d, Policy::Float);
            let stored = stored.unwrap_or_else(|| d.to_vec());
            let (len, lz) = (stored.len(), lz4_len(d));
            assert_eq!(&decode(codec, stored, d.len()).unwrap(), d, "{name}");
            assert!(len as f64 <= lz as f64 * 1.005, "{name}: {len} vs LZ4 {lz}");
            if let Some(most) = most {
                assert!(matches!(codec, Codec::Float(_)), "{name}: {codec:?}");
                let r = len as f64 / d.len() as f64;
                assert!(r <= most, "{name}: stored {r:.3} of raw, want <= {most}");
            }
        }
    }

    /// Frames are read block by block (raw planes in place) and give what the zstd library's
    /// reading gives, for this encoder's frames of every transform and plane mask, for
    /// damaged ones (the same error or the same bytes), and for frames of another encoder
    /// (decoded whole).
    #[test]
    fn float_frames_decode_block_by_block_as_the_zstd_library_decodes_them() {
        use ckptfs_kernels::float::{self, Plan, Transform};
        // The zstd library's reading of a frame, then the inverse transform.
        let whole = |t: Transform, stored: &[u8], len: usize| -> Option<Vec<u8>> {
            let planes = zstd::bulk::Decompressor::new()
                .unwrap()
                .decompress(stored, len)
                .ok()?;
            (planes.len() == len).then(|| float::inverse(&planes, t))
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(77);
        let fp32: Vec<u8> = (0..40_000)
            .flat_map(|_| {
                let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-9), rng.random());
                (0.02 * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()).to_le_bytes()
            })
            .collect();
        let text: Vec<u8> = (0..9000u32)
            .flat_map(|i| format!("{i} ").into_bytes())
            .take(30_001)
            .collect();
        for data in [&fp32[..], &fp32[3..150_003], &fp32[1..70_000], &text[..]] {
            for t in Transform::all() {
                // Plane 0 with codes of one length, for the bits it varies in (rotated by three
                // bits, fp32's sign and low mantissa bits: `decode_fixed` reads those blocks).
                let n = data.len() / usize::from(t.width);
                let (and, or) = float::forward(data, t)[..n]
                    .iter()
                    .fold((0xFFu8, 0u8), |(a, o), &b| (a & b, o | b));
                let fixed = (or & !and != 0xFF).then_some(float::Fixed {
                    plane: 0,
                    mask: or & !and,
                });
                for (coded, fixed) in [
                    (0u16, None),
                    (0xFF, None),
                    (0x08, None),
                    (0x05, None),
                    (0xFF, fixed),
                    (0x05, fixed),
                ] {
                    let plan = Plan {
                        transform: t,
                        coded,
                        fixed,
                    };
                    let stored = float::encode_plan(data, plan);
                    assert!(float::frame::blocks(&stored, data.len()).is_some());
                    let got = decode(Codec::Float(t), stored.clone(), data.len()).unwrap();
                    assert_eq!(got, data, "{plan:?} len {}", data.len());
                    // Damaged frames: this decoder says what the zstd library says, an
                    // error where it errs (never a panic), the same bytes where it does not.
                    for at in (0..stored.len())
                        .step_by(stored.len() / 40 + 1)
                        .chain([4, 9, 11])
                    {
                        let mut bad = stored.clone();
                        bad[at] ^= 0x24;
                        assert_eq!(
                            decode(Codec::Float(t), bad.clone(), data.len()).ok(),
                            whole(t, &bad, data.len()),
                            "{plan:?} byte {at}"
                        );
                    }
                }
                // A frame of another encoder (matches, sequences, a checksum): the zstd
                // library decodes it whole.
                let planes = float::forward(data, t);
                let mut c = zstd::bulk::Compressor::new(3).unwrap();
                c.include_checksum(true).unwrap();
                let foreign = c.compress(&planes).unwrap();
                assert!(float::frame::blocks(&foreign, data.len()).is_none());
                assert_eq!(
                    decode(Codec::Float(t), foreign, data.len()).unwrap(),
                    data,
                    "{t:?}"
                );
            }
        }
    }

    /// A damaged frame is reported as damage, never decoded to wrong bytes or a panic.
    #[test]
    fn damaged_float_frames_are_errors() {
        let d: Vec<u8> = (0..20_000u32)
            .flat_map(|i| ((i as f32).sin() * 0.01).to_le_bytes())
            .collect();
        let (codec, stored) = encode(&d, Policy::Float);
        let stored = stored.unwrap();
        assert!(matches!(codec, Codec::Float(_)));
        assert!(decode(codec, stored[..stored.len() - 9].to_vec(), d.len()).is_err());
        assert!(decode(codec, stored.clone(), d.len() - 1).is_err());
        assert!(decode(codec, stored.clone(), d.len() + 1).is_err());
        let mut bad = stored.clone();
        bad[0] ^= 1;
        assert!(decode(codec, bad, d.len()).is_err());
    }
}
