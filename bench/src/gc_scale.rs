//! `gc-scale`: gc's time and peak memory on a large space.
//!
//! build: formats DIR and writes N files of 64 MiB of random data (4 KiB chunks by default,
//! so 16,384 chunks a file), then a second revision of each with its first half rewritten.
//! run (in a fresh process, so its peak RSS is gc's own plus the metadata cache): sets
//! keep-revisions to 1 and runs gc, which drops every first revision, frees their chunks and
//! compacts the segments they leave half empty.

use ckptfs_engine::format::*;
use ckptfs_engine::maintenance::gc::GcOptions;
use ckptfs_engine::space::Config;
use ckptfs_engine::space::Seal;
use ckptfs_engine::Space;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use std::path::Path;
use std::time::Instant;

const FILE_BYTES: usize = 64 << 20;

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn record(history: HistoryId) -> InodeRecord {
    InodeRecord {
        history,
        ..InodeRecord::new(NodeKind::File, 0o644, 0, 0)
    }
}

pub fn build(dir: &Path, files: u64, chunk: u32) -> Result<(), Box<dyn std::error::Error>> {
    let size = (files * FILE_BYTES as u64 * 3 / 2) + (512 << 20);
    let _ = std::fs::remove_dir_all(dir);
    Space::format(dir, size, chunk, Config::default(), false)?;
    let space = Space::open(dir)?;
    let mut rng = SmallRng::seed_from_u64(500_000);
    let mut data = vec![0u8; FILE_BYTES];
    let t = Instant::now();
    for f in 0..files {
        let ino = InodeId(1000 + f);
        let hid = space.ns_write(false, |t| t.new_history(ino))?;
        let mut rec = record(hid);
        rng.fill_bytes(&mut data);
        for half_only in [false, true] {
            if half_only {
                rng.fill_bytes(&mut data[..FILE_BYTES / 2]);
            }
            let mut st = space.files().load_file(&rec)?;
            st.truncate(0);
            for piece in data.chunks(1 << 20) {
                let off = st.size();
                st.write(space.data().chunks(), off, piece)?;
            }
            st.finish(space.data().chunks())?;
            space.commit_file(ino, &mut st, &mut rec, Seal::Complete)?;
        }
        eprint!("\rfile {}/{files}", f + 1);
    }
    let s = space.report().stats()?;
    eprintln!();
    println!(
        "built: {} chunks, {} revisions, {} MiB stored, {} MiB free, in {:.1}s",
        s.chunks,
        s.revisions,
        s.stored_bytes >> 20,
        s.free_bytes >> 20,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn run(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let before_open = vm_hwm_kib();
    let space = Space::open(dir)?;
    let mut c = space.settings().config()?;
    c.keep_revisions = 1;
    space.settings().set_config(&c)?;
    let s = space.report().stats()?;
    let hwm_before = vm_hwm_kib();
    let t = Instant::now();
    let r = space.gc(&GcOptions::default(), &mut |_| {})?;
    let secs = t.elapsed().as_secs_f64();
    let hwm_after = vm_hwm_kib();
    let s2 = space.report().stats()?;
    println!(
        "gc on {} chunks / {} revisions: {:.2}s; dropped {} revisions, freed {} chunks ({} MiB), copied {} MiB, freed {} segments; free {} -> {} MiB",
        s.chunks,
        s.revisions,
        secs,
        r.revisions_dropped,
        r.chunks_freed,
        r.bytes_freed >> 20,
        r.bytes_copied >> 20,
        r.segments_freed,
        r.free_bytes_before >> 20,
        r.free_bytes_after >> 20
    );
    println!(
        "peak RSS (VmHWM): {} MiB at start, {} MiB after opening and stats, {} MiB after gc; chunks left {}",
        before_open >> 10,
        hwm_before >> 10,
        hwm_after >> 10,
        s2.chunks
    );
    Ok(())
}
