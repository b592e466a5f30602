//! Byte-exact round trip of files of many sizes and write patterns through the mount, before and
//! after a remount.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use ckptfs_tests::{
    assert_file_eq, assert_file_matches, fill_pattern, first_difference, test_seed, TestMount,
};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// How a file's bytes reach the filesystem.
#[derive(Clone, Copy, Debug)]
enum Strategy {
    /// Front to back in pieces of the write size.
    Sequential,
    /// The same pieces, written with pwrite in shuffled order.
    OutOfOrder,
    /// Write a prefix, seek past a gap (a hole), write the rest.
    SeekHole,
    /// Write a prefix, ftruncate up to the full size, then write one piece inside the grown area.
    TruncateGrow,
    /// Write everything, close, reopen without O_TRUNC and overwrite a few ranges in place.
    Overwrite,
}

const STRATEGIES: [Strategy; 5] = [
    Strategy::Sequential,
    Strategy::OutOfOrder,
    Strategy::SeekHole,
    Strategy::TruncateGrow,
    Strategy::Overwrite,
];

/// Random bytes, or text-like compressible bytes, so both codec paths are exercised.
fn gen_bytes(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    if rng.random_bool(0.5) {
        rng.fill_bytes(&mut v);
    } else {
        const WORDS: [&[u8]; 6] = [
            b"tensor ", b"layer.", b"weight ", b"0.0000 ", b"bias\n", b"step ",
        ];
        let mut i = 0;
        while i < len {
            let w = WORDS[rng.random_range(0..WORDS.len())];
            let n = w.len().min(len - i);
            v[i..i + n].copy_from_slice(&w[..n]);
            i += n;
        }
    }
    v
}

fn pieces(len: usize, ws: usize) -> Vec<(usize, usize)> {
    (0..len)
        .step_by(ws.max(1))
        .map(|o| (o, ws.min(len - o)))
        .collect()
}

fn write_seq(f: &mut File, data: &[u8], ws: usize) {
    for (o, n) in pieces(data.len(), ws) {
        f.write_all(&data[o..o + n]).expect("write");
    }
}

/// Writes `path` by `strategy` and returns the bytes it must now hold.
fn write_file(
    path: &Path,
    size: usize,
    ws: usize,
    strategy: Strategy,
    rng: &mut SmallRng,
) -> Vec<u8> {
    let mut model = gen_bytes(rng, size);
    let mut f = File::create(path).expect("create");
    match strategy {
        Strategy::Sequential => write_seq(&mut f, &model, ws),
        Strategy::OutOfOrder => {
            let mut ps = pieces(size, ws);
            ps.shuffle(rng);
            for (o, n) in ps {
                f.write_all_at(&model[o..o + n], o as u64).expect("pwrite");
            }
        }
        Strategy::SeekHole => {
            if size > 0 {
                let a = rng.random_range(0..=size / 2);
                let b = rng.random_range(a..size);
                model[a..b].fill(0);
                write_seq(&mut f, &model[..a], ws);
                f.seek(SeekFrom::Start(b as u64)).expect("seek");
                write_seq(&mut f, &model[b..], ws);
            }
        }
        Strategy::TruncateGrow => {
            let a = rng.random_range(0..=size / 2);
            model[a..].fill(0);
            write_seq(&mut f, &model[..a], ws);
            f.set_len(size as u64).expect("ftruncate grow");
            if size > a + 1 {
                let c = rng.random_range(a..size);
                let d = rng.random_range(c..=size.min(c + 2 * ws));
                let fresh = gen_bytes(rng, d - c);
                model[c..d].copy_from_slice(&fresh);
                f.write_all_at(&fresh, c as u64)
                    .expect("pwrite into grown area");
            }
        }
        Strategy::Overwrite => {
            write_seq(&mut f, &model, ws);
            drop(f);
            f = OpenOptions::new().write(true).open(path).expect("reopen");
            for _ in 0..rng.random_range(1..6) {
                if size == 0 {
                    break;
                }
                let c = rng.random_range(0..size);
                let d = rng.random_range(c..=size.min(c + 3 * ws));
                let fresh = gen_bytes(rng, d - c);
                model[c..d].copy_from_slice(&fresh);
                f.write_all_at(&fresh, c as u64)
                    .expect("overwrite in place");
            }
        }
    }
    drop(f);
    model
}

fn check_random_reads(path: &Path, model: &[u8], rng: &mut SmallRng) {
    let f = File::open(path).expect("open for pread");
    for _ in 0..8 {
        let off = rng.random_range(0..=model.len());
        let len = rng.random_range(0..=(model.len() - off).min(300 * KIB));
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, off as u64)
            .unwrap_or_else(|e| panic!("{}: pread {len} at {off}: {e}", path.display()));
        if let Some(d) = first_difference(&buf, &model[off..off + len]) {
            panic!("{}: pread {len} at {off} differs: {d}", path.display());
        }
    }
}

/// The 256 MiB file: incompressible pattern, with a hole made by seeking over
/// [BIG_HOLE.0, BIG_HOLE.1).
const BIG_SIZE: u64 = 256 * MIB as u64;
const BIG_HOLE: (u64, u64) = (100 * MIB as u64 + 7, 101 * MIB as u64 + 4099);

fn big_expected(seed: u64, off: u64, buf: &mut [u8]) {
    fill_pattern(seed, off, buf);
    let end = off + buf.len() as u64;
    let (a, b) = (BIG_HOLE.0.max(off), BIG_HOLE.1.min(end));
    if a < b {
        buf[(a - off) as usize..(b - off) as usize].fill(0);
    }
}

fn write_big(path: &Path, seed: u64) {
    let mut f = File::create(path).expect("create big");
    let mut buf = vec![0u8; MIB];
    let mut off = 0u64;
    while off < BIG_SIZE {
        // Piece boundaries fall on the hole's edges so the hole is skipped, not written.
        let end = if off < BIG_HOLE.0 {
            (off + MIB as u64).min(BIG_HOLE.0)
        } else {
            (off + MIB as u64).min(BIG_SIZE)
        };
        let n = (end - off) as usize;
        fill_pattern(seed, off, &mut buf[..n]);
        f.write_all(&buf[..n]).expect("write big");
        off = end;
        if off == BIG_HOLE.0 {
            f.seek(SeekFrom::Start(BIG_HOLE.1)).expect("seek over hole");
            off = BIG_HOLE.1;
        }
    }
    drop(f);
}

#[test]
fn roundtrip_files_of_many_sizes_and_write_patterns() {
    let seed = test_seed("roundtrip", 0x5eed_0001);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = TestMount::new();

    let mut sizes = vec![
        0,
        1,
        4095,
        4096,
        4097,
        65535,
        65536,
        65537,
        MIB - 1,
        MIB + 3,
    ];
    for _ in 0..4 {
        sizes.push(rng.random_range(1..16 * MIB));
    }
    let write_sizes = [4 * KIB, 128 * KIB, MIB, 4099, 1_000_003, 1];

    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let strategy = STRATEGIES[i % STRATEGIES.len()];
        let mut ws = write_sizes[rng.random_range(0..write_sizes.len())];
        if ws == 1 && size > 4097 {
            ws = 4099;
        }
        let name = format!("f{i:02}-{size}-{strategy:?}-ws{ws}");
        println!("writing {name}");
        let model = write_file(&m.path(&name), size, ws, strategy, &mut rng);
        files.push((name, model));
    }
    let big_seed = seed ^ 0xb16;
    println!("writing big (256 MiB, hole at {BIG_HOLE:?})");
    write_big(&m.path("big"), big_seed);

    let verify = |m: &TestMount, rng: &mut SmallRng, when: &str| {
        println!("verifying {when}");
        let mut names: Vec<String> = fs::read_dir(m.mnt())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
            .collect();
        names.sort();
        let mut want: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        want.push("big".into());
        want.sort();
        assert_eq!(names, want, "directory listing {when}");
        for (name, model) in &files {
            let p = m.path(name);
            assert_eq!(
                fs::metadata(&p).expect("stat").len(),
                model.len() as u64,
                "{name}: size {when}"
            );
            assert_file_eq(&p, model);
            check_random_reads(&p, model, rng);
        }
        assert_file_matches(&m.path("big"), BIG_SIZE, |off, buf| {
            big_expected(big_seed, off, buf)
        });
    };
    verify(&m, &mut rng, "before remount");
    m.remount();
    verify(&m, &mut rng, "after remount");
    let stats = m.stats();
    println!("stats: {stats}");
    let logical: u64 = files.iter().map(|(_, d)| d.len() as u64).sum::<u64>() + BIG_SIZE;
    assert_eq!(
        stats.stats.logical_bytes, logical,
        "logical_bytes after writing all files"
    );
    assert_eq!(stats.stats.files, files.len() as u64 + 1, "files");
}
