//! A full space, driven through `Fs` without a kernel: the automatic gc's ticks are called
//! directly, so what they do is counted tick by tick, with no clock in the test.
//!
//! - A space full of live data (free space below the automatic gc's watermark, nothing to
//!   reclaim but commit padding) is not copied over and over: issue 36 saw an idle daemon
//!   copy 10 GiB of a 1 GiB space to free a few KiB, for as long as it stayed mounted.
//! - Removed files make room for a writer at once, oldest removal first, before their
//!   `keep-unlinked` time is up; an explicit gc keeps them until then.

use ckptfs_engine::format::InodeId;
use ckptfs_engine::space::Config;
use ckptfs_engine::Space;
use ckptfs_fs::{Caller, Fs, HandleId};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use std::path::PathBuf;

const ROOT: InodeId = InodeId::ROOT;
const ME: Caller = Caller { uid: 0, gid: 0 };
const MIB: u64 = 1 << 20;

struct TempSpace(PathBuf);

impl TempSpace {
    fn new(tag: &str, size: u64, config: Config) -> TempSpace {
        let dir =
            std::env::temp_dir().join(format!("ckptfs-pressure-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Space::format(&dir, size, 65536, config, false).expect("format");
        TempSpace(dir)
    }
}

impl Drop for TempSpace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `len` random bytes as a new file `name` in 1 MiB requests and closes it.
fn write_file(fs: &Fs, dir: InodeId, name: &str, len: u64, rng: &mut SmallRng, fh: u64) {
    let h = HandleId(fh);
    let a = fs
        .create(dir, name.as_bytes(), 0o644, ME, h, true, false, false)
        .unwrap_or_else(|e| panic!("create {name}: {e:?}"));
    let mut buf = vec![0u8; MIB as usize];
    let mut off = 0;
    while off < len {
        rng.fill_bytes(&mut buf);
        let n = (len - off).min(MIB) as usize;
        fs.write(a.ino, h, 1, off, &buf[..n])
            .unwrap_or_else(|e| panic!("write {name} at {off}: {e:?}"));
        off += n as u64;
    }
    fs.flush(a.ino, h, 1)
        .unwrap_or_else(|e| panic!("close {name}: {e:?}"));
    fs.release(a.ino, h).expect("release");
}

/// 128 MiB, 86% of it live random data: below the 20% watermark, with nothing dead but the
/// padding each commit leaves. Ticks of the automatic gc may copy no more than they free
/// (`gc::AUTO_COPY_PER_FREED`), so next to nothing: before the bound, each tick compacted
/// every segment with a dead byte, pass after pass.
#[test]
fn an_idle_full_space_of_live_data_is_not_copied_over_and_over() {
    let t = TempSpace::new("idle", 128 * MIB, Config::default());
    let fs = Fs::new(Space::open(&t.0).expect("open"));
    let mut rng = SmallRng::seed_from_u64(36);
    for i in 0..11 {
        write_file(&fs, ROOT, &format!("ckpt-{i}"), 10 * MIB, &mut rng, 100 + i);
    }
    let store = fs.space().store();
    let free_before = store.free_bytes();
    assert!(
        free_before * 100 < store.capacity() * Config::default().auto_gc_free_percent,
        "the space must be below the automatic gc's watermark: {free_before} of {} free",
        store.capacity()
    );
    let copied_before = fs.stats().expect("stats").gc.bytes_copied;
    for tick in 0..8 {
        fs.auto_gc_tick();
        let s = fs.stats().expect("stats");
        println!(
            "tick {tick}: gc runs {}, copied {} bytes, free {} bytes",
            s.gc.runs, s.gc.bytes_copied, s.free_bytes
        );
    }
    let s = fs.stats().expect("stats");
    let copied = s.gc.bytes_copied - copied_before;
    let gained = s.free_bytes.saturating_sub(free_before);
    println!(
        "8 ticks: copied {copied} bytes, free space {free_before} -> {}",
        s.free_bytes
    );
    assert!(s.gc.runs >= 1, "the automatic gc must have run: {:?}", s.gc);
    assert!(
        copied <= gained * ckptfs_engine::maintenance::gc::AUTO_COPY_PER_FREED,
        "the automatic gc copied {copied} bytes of live data to gain {gained} bytes"
    );
}

/// Three steps of checkpoints fill a space sized for three; the oldest step is removed and
/// the next one written. The removed files' revisions are within `keep-unlinked` (7 days),
/// yet the writer gets their room, oldest removal first, without ENOSPC. An explicit gc
/// (no pressure) still keeps them.
#[test]
fn removed_files_make_room_for_a_writer_oldest_first() {
    let t = TempSpace::new("trash", 128 * MIB, Config::default());
    let fs = Fs::new(Space::open(&t.0).expect("open"));
    let mut rng = SmallRng::seed_from_u64(37);
    let step = 36 * MIB;
    let mut fh = 1;
    let mut dirs = Vec::new();
    for s in 0..3 {
        let d = fs
            .mkdir(ROOT, format!("step-{s}").as_bytes(), 0o755, ME)
            .expect("mkdir");
        for r in 0..3 {
            fh += 1;
            write_file(&fs, d.ino, &format!("rank-{r}"), step / 3, &mut rng, fh);
        }
        dirs.push(d.ino);
    }
    // Steps 0 and 1 removed, in that order.
    for dir in &dirs[..2] {
        for r in 0..3 {
            fs.unlink(*dir, format!("rank-{r}").as_bytes())
                .expect("unlink");
        }
    }
    // An explicit gc keeps what keep-unlinked protects.
    let r = fs.gc(false, None, &mut |_| {}).expect("gc");
    assert_eq!(r.revisions_dropped, 0, "{r:?}");
    let split = fs.stats().expect("stats").split;
    assert_eq!(split.trash_revisions, 6, "{split:?}");
    assert!(split.trash_bytes >= 2 * step, "{split:?}");
    // Writing fills the space: the trash gives the room, step 0's files first.
    for s in 3..5 {
        let d = fs
            .mkdir(ROOT, format!("step-{s}").as_bytes(), 0o755, ME)
            .expect("mkdir");
        for r in 0..3 {
            fh += 1;
            write_file(&fs, d.ino, &format!("rank-{r}"), step / 3, &mut rng, fh);
        }
        let split = fs.stats().expect("stats").split;
        println!("after step {s}: {split:?}");
        if s == 3 {
            // Only what was needed went, and step 0 (removed first) before step 1.
            assert!(split.trash_revisions > 0, "{split:?}");
            let left = fs.revisions_of(b"step-1/rank-2").map(|v| v.len());
            assert_eq!(
                left.ok(),
                Some(1),
                "step 1's last file is kept while there is room"
            );
            assert!(
                fs.revisions_of(b"step-0/rank-0").is_err(),
                "step 0's first file went first"
            );
        }
    }
}

/// `stats` says where the used space is: live (current files), kept older revisions of
/// present files, kept revisions of removed files (the trash), unreferenced; the four add up
/// to the stored bytes. With no current data there is no dedup ratio to show.
#[test]
fn stats_split_the_used_space_by_what_would_free_it() {
    let t = TempSpace::new("split", 64 * MIB, Config::default());
    let fs = Fs::new(Space::open(&t.0).expect("open"));
    let mut rng = SmallRng::seed_from_u64(38);
    let mut rand = |n: u64| {
        let mut v = vec![0u8; n as usize];
        rng.fill_bytes(&mut v);
        v
    };
    let save = |name: &str, data: &[u8], fh: u64| {
        let h = HandleId(fh);
        let ino = match fs.lookup(ROOT, name.as_bytes()) {
            Ok(a) => {
                fs.open(a.ino, h, true, true).expect("open");
                a.ino
            }
            Err(_) => {
                fs.create(ROOT, name.as_bytes(), 0o644, ME, h, true, false, false)
                    .expect("create")
                    .ino
            }
        };
        for (i, piece) in data.chunks(MIB as usize).enumerate() {
            fs.write(ino, h, 1, i as u64 * MIB, piece).expect("write");
        }
        fs.flush(ino, h, 1).expect("close");
        fs.release(ino, h).expect("release");
    };
    // "a": 4 MiB, then the same first MiB and 3 new ones (keep-revisions 2 keeps both).
    let a1 = rand(4 * MIB);
    let mut a2 = a1[..MIB as usize].to_vec();
    a2.extend(rand(3 * MIB));
    save("a", &a1, 1);
    save("a", &a2, 2);
    save("b", &rand(2 * MIB), 3);
    save("c", &rand(MIB), 4);
    fs.unlink(ROOT, b"b").expect("unlink");
    let s = fs.stats().expect("stats");
    let u = &s.split;
    println!("{u:?}, stored {}", s.stored_bytes);
    assert_eq!(
        u.live_bytes + u.kept_revision_bytes + u.trash_bytes + u.unreferenced_bytes,
        s.stored_bytes
    );
    // Random data: stored as is; chunk boundaries near the shared first MiB blur it by at
    // most a chunk or two (256 KiB each at most).
    let near = |got: u64, want: u64| got.abs_diff(want) <= 512 * 1024;
    assert!(near(u.live_bytes, 5 * MIB), "{u:?}");
    assert!(near(u.kept_revision_bytes, 3 * MIB), "{u:?}");
    assert!(near(u.trash_bytes, 2 * MIB), "{u:?}");
    assert_eq!(
        (u.kept_revisions, u.trash_revisions, u.trash_files),
        (1, 1, 1)
    );
    assert!(s.dedup_ratio().is_some() && s.compression_ratio().is_some());
    // Everything removed, the trash emptied by hand: nothing current, no ratio of nothing.
    fs.unlink(ROOT, b"a").expect("unlink");
    fs.unlink(ROOT, b"c").expect("unlink");
    let opts = ckptfs_engine::maintenance::gc::GcOptions {
        empty_trash: true,
        ..Default::default()
    };
    let r = fs.gc_with(opts, &mut |_| {}).expect("gc --empty-trash");
    assert_eq!(r.trash_revisions_dropped, 4, "{r:?}");
    let s = fs.stats().expect("stats");
    assert_eq!(
        (s.logical_bytes, s.stored_bytes, s.revisions),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!((s.dedup_ratio(), s.compression_ratio()), (None, None));
    assert_eq!(
        s.split,
        ckptfs_engine::usage::Split {
            passes: 1,
            ..Default::default()
        }
    );
}
