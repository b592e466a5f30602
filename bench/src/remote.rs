//! `ckptfs-bench remote`: the object-store tier beside a plain S3 client on the same server.
//!
//! A checkpoint of `--size` bytes in `--procs` files (`--data`: random, a compressible
//! float64 field, or fp32 tensors), then a next revision with 5% of its 64 KiB blocks
//! changed. ckptfs side: a space formatted with `--remote s3://BUCKET/PREFIX`, the files
//! written into the mount, then `ckptfs remote --sync` timed (the upload: until the bucket
//! holds the revision), with the bytes sent (`ckptfs remote --json`) and the daemon's CPU
//! seconds over that time; then `ckptfs recover` of the bucket into an empty directory
//! (a cold restore: the whole newest checkpoint fetched, verified and written locally), and
//! `ckptfs mount s3://...` into an empty cache directory with every file read once (the
//! restore on demand: chunks fetched as they are read).
//! Plain side: the same files uploaded by boto3 (`upload_file`, multipart, its default 10
//! threads) to another prefix of the same server, the next revision uploaded whole, and
//! downloaded into an empty directory (`download_file`). Both sides' files are in the page
//! cache when uploaded, and the server is on this machine (loopback): the figures compare
//! the clients, not a network.
//!
//! Needs an S3 server (`--endpoint`, default SeaweedFS's `weed mini` port on loopback), the
//! bucket, credentials in `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, and python3 with
//! boto3 (`pip install boto3`).

use crate::ckptfs::Ckptfs;
use crate::data::RandomSpec;
use crate::sys::{self, Result};
use crate::util::{ckptfs_bin, fresh_dir};
use crate::Opts;
use clap::Args;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[derive(Args, Clone, Debug)]
pub struct RemoteOpts {
    #[command(flatten)]
    pub o: Opts,
    /// The S3 server
    #[arg(long, default_value = "http://127.0.0.1:8333")]
    pub endpoint: String,
    /// The bucket (must exist); each run uses fresh prefixes in it
    #[arg(long, default_value = "ckpt")]
    pub bucket: String,
}

const PLAIN_CLIENT: &str = r#"
import boto3, json, os, sys, time
from boto3.s3.transfer import TransferConfig
op, endpoint, bucket, prefix, d = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
cfg = TransferConfig()  # multipart above 8 MiB, 10 threads: the library's defaults
names = sorted(os.listdir(d)) if op == "up" else [
    o["Key"].split("/")[-1] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])]
t = time.time()
n = 0
for name in names:
    p = os.path.join(d, name)
    if op == "up":
        s3.upload_file(p, bucket, prefix + "/" + name, Config=cfg)
    else:
        s3.download_file(bucket, prefix + "/" + name, p, Config=cfg)
    n += os.path.getsize(p)
print(json.dumps({"seconds": time.time() - t, "bytes": n}))
"#;

/// Runs the plain client: `up` (files of `dir` to `prefix/`) or `down` (into `dir`).
fn plain(o: &RemoteOpts, script: &Path, op: &str, prefix: &str, dir: &Path) -> Result<(f64, u64)> {
    let out = Command::new("python3")
        .arg(script)
        .args([op, &o.endpoint, &o.bucket, prefix])
        .arg(dir)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the plain S3 client (boto3) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("plain client printed {e}"))?;
    Ok((
        v["seconds"].as_f64().unwrap_or(0.0),
        v["bytes"].as_u64().unwrap_or(0),
    ))
}

fn spec(o: &Opts, file: u64) -> RandomSpec {
    let seed = o.seed * 1000 + file;
    match o.data.as_str() {
        "field" => RandomSpec::field(seed),
        "tensor" => RandomSpec::tensor(seed),
        _ => RandomSpec::new(seed),
    }
}

/// Writes the checkpoint (`next`: its next revision) as `procs` files into `dir`.
fn write_step(o: &Opts, dir: &Path, next: bool) -> Result<()> {
    let per = o.size / o.procs as u64;
    for f in 0..o.procs as u64 {
        let mut s = spec(o, f);
        if next {
            s = s.next(o.seed + 77, 500);
        }
        let data = s.generate(per as usize);
        let p = dir.join(format!("rank{f:02}.bin"));
        fs::write(&p, &data).map_err(|e| format!("write {}: {e}", p.display()))?;
    }
    Ok(())
}

/// Reads every file under `dir` once, one thread per file (as a restarting job's ranks
/// do); returns the bytes read.
fn read_all(dir: &Path) -> Result<u64> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
            let e = e.map_err(|e| format!("{e}"))?;
            let t = e.file_type().map_err(|e| format!("{e}"))?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                files.push(e.path());
            }
        }
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = files
            .iter()
            .map(|p| {
                s.spawn(move || -> Result<u64> {
                    use std::io::Read;
                    let mut f = fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
                    let mut buf = vec![0u8; 4 << 20];
                    let mut n = 0u64;
                    loop {
                        match f.read(&mut buf) {
                            Ok(0) => return Ok(n),
                            Ok(k) => n += k as u64,
                            Err(e) => return Err(format!("read {}: {e}", p.display())),
                        }
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| "a reader panicked".to_string())?)
            .sum()
    })
}

fn ckptfs_cmd(bin: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(bin)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`ckptfs {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn status(bin: &Path, mnt: &Path) -> Result<serde_json::Value> {
    let out = ckptfs_cmd(bin, &["remote", &mnt.to_string_lossy(), "--json"])?;
    serde_json::from_str(out.trim()).map_err(|e| format!("remote --json: {e}"))
}

/// Times `ckptfs remote --sync`: (seconds, bytes sent, daemon CPU seconds).
fn upload(bin: &Path, ck: &Ckptfs) -> Result<(f64, u64, f64)> {
    let pid = ck.daemon_pid()?;
    let sent0 = status(bin, ck.mnt())?["sent_bytes"].as_u64().unwrap_or(0);
    let cpu0 = sys::cpu_seconds(pid)?;
    let t = Instant::now();
    ckptfs_cmd(bin, &["remote", &ck.mnt().to_string_lossy(), "--sync"])?;
    let secs = t.elapsed().as_secs_f64();
    let cpu = sys::cpu_seconds(pid)? - cpu0;
    let sent = status(bin, ck.mnt())?["sent_bytes"].as_u64().unwrap_or(0) - sent0;
    Ok((secs, sent, cpu))
}

pub fn run(r: &RemoteOpts) -> Result<()> {
    let o = &r.o;
    let bin = ckptfs_bin(o)?;
    fresh_dir(&o.dir)?;
    let tag = format!(
        "bench-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    );
    let script = o.dir.join("plain_client.py");
    fs::write(&script, PLAIN_CLIENT).map_err(|e| format!("{}: {e}", script.display()))?;
    let url = format!("s3://{}/{tag}/ckptfs", r.bucket);
    // `ckptfs` (format, the daemon) and the plain client read the endpoint from their
    // environment; set before any thread starts.
    let space = o.space.unwrap_or((4 * o.size).max(1 << 30));
    std::env::set_var("AWS_ENDPOINT_URL", &r.endpoint);
    // The full checkpoint's upload alone: written into a space without a tier, which then
    // gets one (`ckptfs remote BACKING --remote URL`) and is mounted: the upload of what it
    // holds is timed from the mount to `ckptfs remote --sync` returning.
    let (mut ck, plain_dir, mnt) = Ckptfs::beside_plain(
        &bin,
        &o.dir,
        o.mount_args.clone(),
        space,
        &o.chunk_size,
        &[],
    )?;
    fs::create_dir_all(&plain_dir).map_err(|e| format!("{e}"))?;
    let gib = o.size as f64 / (1u64 << 30) as f64;
    let mut rows: Vec<(String, f64, f64, u64, Option<f64>)> = Vec::new();
    write_step(o, &plain_dir, false)?;
    write_step(o, &mnt, false)?;
    let stored0 = crate::ckptfs::stored_bytes(&ck.stats()?)?;
    ck.umount()?;
    let backing = o.dir.join("backing");
    ckptfs_cmd(
        &bin,
        &["remote", &backing.to_string_lossy(), "--remote", &url],
    )?;
    let (pt, pb) = plain(r, &script, "up", &format!("{tag}/plain-1"), &plain_dir)?;
    ck.mount()?;
    let (ct, cb, ccpu) = upload(&bin, &ck)?;
    rows.push(("full upload: plain client".into(), pt, gib / pt, pb, None));
    rows.push((
        "full upload: ckptfs".into(),
        ct,
        gib / ct,
        cb,
        Some(ccpu / gib),
    ));

    // The next revision (5% of blocks changed), from the start of the save until the bucket
    // holds it: ckptfs uploads while the job writes; the plain side writes to its disk,
    // then uploads the whole step.
    let t = Instant::now();
    write_step(o, &plain_dir, true)?;
    let pw = t.elapsed().as_secs_f64();
    let (pt2, pb2) = plain(r, &script, "up", &format!("{tag}/plain-2"), &plain_dir)?;
    let sent0 = status(&bin, ck.mnt())?["sent_bytes"].as_u64().unwrap_or(0);
    let cpu0 = sys::cpu_seconds(ck.daemon_pid()?)?;
    let t = Instant::now();
    write_step(o, &mnt, true)?;
    ckptfs_cmd(&bin, &["remote", &ck.mnt().to_string_lossy(), "--sync"])?;
    let ct2 = t.elapsed().as_secs_f64();
    let ccpu2 = sys::cpu_seconds(ck.daemon_pid()?)? - cpu0;
    let cb2 = status(&bin, ck.mnt())?["sent_bytes"].as_u64().unwrap_or(0) - sent0;
    let stored1 = crate::ckptfs::stored_bytes(&ck.stats()?)?;
    rows.push((
        "next 5%, save+upload: plain".into(),
        pw + pt2,
        gib / (pw + pt2),
        pb2,
        None,
    ));
    rows.push((
        "next 5%, save+upload: ckptfs".into(),
        ct2,
        gib / ct2,
        cb2,
        Some(ccpu2 / gib),
    ));
    let newly = stored1 - stored0;
    ck.umount()?;

    // Cold restore of the newest revision into empty directories.
    let down = o.dir.join("down");
    fresh_dir(&down)?;
    sys::drop_caches().ok();
    let (dt, db) = plain(r, &script, "down", &format!("{tag}/plain-2"), &down)?;
    let rec = o.dir.join("recovered");
    let _ = fs::remove_dir_all(&rec);
    sys::drop_caches().ok();
    let t = Instant::now();
    let out = ckptfs_cmd(
        &bin,
        &[
            "recover",
            &rec.to_string_lossy(),
            "--remote",
            &url,
            "--json",
        ],
    )?;
    let rt = t.elapsed().as_secs_f64();
    let rv: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
    rows.push(("restore: plain download".into(), dt, gib / dt, db, None));
    rows.push((
        "restore: ckptfs recover".into(),
        rt,
        gib / rt,
        rv["fetched_bytes"].as_u64().unwrap_or(0),
        None,
    ));

    // The same restore on demand: mounted from the bucket into an empty cache directory
    // (ready after one manifest read), then every file read once, all files at once.
    let cache = o.dir.join("cache");
    let lazy_mnt = o.dir.join("mnt-from-bucket");
    let _ = fs::remove_dir_all(&cache);
    fresh_dir(&lazy_mnt)?;
    sys::drop_caches().ok();
    let t = Instant::now();
    ckptfs_cmd(
        &bin,
        &[
            "mount",
            &url,
            &lazy_mnt.to_string_lossy(),
            "--cache",
            &cache.to_string_lossy(),
        ],
    )?;
    let ready = t.elapsed().as_secs_f64();
    let read = read_all(&lazy_mnt);
    let lt = t.elapsed().as_secs_f64();
    let lazy = status(&bin, &lazy_mnt);
    ckptfs_cmd(&bin, &["umount", &lazy_mnt.to_string_lossy()])?;
    let (read, lazy) = (read?, lazy?);
    if read != o.size {
        return Err(format!(
            "read {read} bytes back from the mount from the bucket, wrote {}",
            o.size
        ));
    }
    rows.push((
        "restore: mount from bucket+read".into(),
        lt,
        gib / lt,
        lazy["fetch"]["fetched_bytes"].as_u64().unwrap_or(0),
        None,
    ));

    println!(
        "remote: {} checkpoint of {} files ({} data), server {}",
        crate::util::size_label(o.size),
        o.procs,
        o.data,
        r.endpoint
    );
    println!(
        "{:32} {:>9} {:>10} {:>12} {:>14}",
        "", "seconds", "GiB/s", "bytes sent", "daemon CPU-s/GiB"
    );
    for (name, s, rate, bytes, cpu) in &rows {
        println!(
            "{name:32} {s:>9.2} {rate:>10.2} {:>12} {:>14}",
            crate::util::size_label(*bytes),
            cpu.map(|c| format!("{c:.2}")).unwrap_or_else(|| "-".into())
        );
    }
    println!(
        "ckptfs / plain: full upload {:.2}x the time ({:.0}% of its throughput); next revision \
         saved and uploaded in {:.2}x the time, sending {} for {} newly stored ({:.2}x); cold \
         restore {:.2}x the plain download's time; mounted from the bucket, ready in {:.2} s \
         and every file read in {:.2}x the plain download's time",
        ct / pt,
        100.0 * pt / ct,
        ct2 / pt2,
        crate::util::size_label(cb2),
        crate::util::size_label(newly),
        cb2 as f64 / newly.max(1) as f64,
        rt / dt,
        ready,
        lt / dt
    );
    if !o.keep {
        let _ = fs::remove_dir_all(&down);
        let _ = fs::remove_dir_all(&rec);
        let _ = fs::remove_dir_all(&cache);
        let _ = fs::remove_dir_all(&plain_dir);
    }
    Ok(())
}
