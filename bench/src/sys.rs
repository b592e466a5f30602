//! Small Linux helpers: a clock shared between processes, /proc readings, the page cache,
//! signals and a description of the machine.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

pub type Error = String;
pub type Result<T> = std::result::Result<T, Error>;

/// CLOCK_MONOTONIC in nanoseconds. Unlike `Instant` it can be compared across processes, so a
/// worker's "closed at" and the parent's "go at" share one time line.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Flushes every dirty page on the machine, so one side's leftover writeback does not run
/// inside the other side's timed section.
pub fn sync_all() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches`: the next reads come from the disk (root only).
pub fn drop_caches() -> Result<()> {
    sync_all();
    fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("echo 3 > /proc/sys/vm/drop_caches: {e}"))
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a process (all its threads), in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("read /proc/{pid}/stat: {e}"))?;
    // The command name may contain spaces; the fields after it are fixed. After ")": state is
    // field 3 of proc(5), utime 14 and stime 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("/proc/{pid}/stat: unexpected format: {stat}"))
    };
    Ok((ticks(11)? + ticks(12)?) as f64 / clock_ticks())
}

/// CPU seconds of each live thread of a process: thread id -> (name with its digits
/// removed, so "ckptfs-worker-3" and "ckptfs-worker-11" are one group, seconds). Threads
/// that already exited are not listed; their time is in the process's total.
///
/// From each thread's `schedstat` (its run time in nanoseconds) where the kernel has it,
/// else utime+stime in clock ticks. The ticks are truncated per thread: with the daemon's
/// 18 threads, a cold 512 MiB read's threads summed 99-119 ticks against the process's
/// 112-131 and their exact run times' 110-130, and the benchmark showed the difference as
/// 0.24-0.26 CPU-s/GiB of "exited" threads that never exited.
pub fn thread_cpu(pid: u32) -> std::collections::BTreeMap<u32, (String, f64)> {
    let mut out = std::collections::BTreeMap::new();
    for (tid, base, name) in threads(pid) {
        let Ok(stat) = fs::read_to_string(base.join("stat")) else {
            continue;
        };
        let rest = stat.rsplit(')').next().unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let exact = fs::read_to_string(base.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        let secs = match exact {
            Some(ns) => ns as f64 / 1e9,
            None => (tick(11) + tick(12)) as f64 / clock_ticks(),
        };
        out.insert(tid, (name, secs));
    }
    out
}

/// The live threads of a process: thread id, its `/proc` directory, and its name with the
/// digits removed ("ckptfs-worker-3" and "ckptfs-worker-11" are one group).
fn threads(pid: u32) -> Vec<(u32, std::path::PathBuf, String)> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_str()?.parse::<u32>().ok()?;
            let base = t.path();
            let comm = fs::read_to_string(base.join("comm")).ok()?;
            let name = comm
                .trim()
                .trim_end_matches(|c: char| c.is_ascii_digit() || c == '-' || c == '_')
                .to_string();
            Some((tid, base, name))
        })
        .collect()
}

/// How each live thread of a process was scheduled so far, from its `schedstat`: thread id
/// -> (name with its digits removed, as `thread_cpu`; times it was put on a CPU; seconds it
/// was runnable but waited for one). Threads that already exited are not listed. Empty
/// where the kernel keeps no schedstats.
///
/// What CPU per GiB alone cannot tell: whether a data path that costs more CPU with more
/// writers spends it switching threads (more runs per GiB, each waking costs) or waiting
/// for cores (runnable time: more threads than cores), rather than in its work.
pub fn thread_sched(pid: u32) -> std::collections::BTreeMap<u32, (String, f64, f64)> {
    let mut out = std::collections::BTreeMap::new();
    for (tid, base, name) in threads(pid) {
        let Ok(sched) = fs::read_to_string(base.join("schedstat")) else {
            continue;
        };
        // "run ns, runnable-wait ns, times run" (Documentation/scheduler/sched-stats.rst).
        let f: Vec<u64> = sched
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        let [_, wait_ns, runs] = f[..] else {
            continue;
        };
        out.insert(tid, (name, runs as f64, wait_ns as f64 / 1e9));
    }
    out
}

/// Minor page faults of a process so far (all its threads, exited ones included): pages
/// first touched, or given back and touched again.
pub fn minor_faults(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After ")": state is field 3 of proc(5), minflt field 10.
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(7)?
        .parse()
        .ok()
}

/// Resets the peak RSS (VmHWM) of a process to its current RSS.
pub fn reset_peak_rss(pid: u32) -> bool {
    fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// VmHWM (peak RSS) of a process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_field(&format!("/proc/{pid}/status"), "VmHWM:")
}

fn status_field(path: &str, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
    })
}

/// Free bytes on the filesystem holding `p` (for an unprivileged user).
pub fn free_bytes(p: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: path contains NUL", p.display()))?;
    // SAFETY: zeroed statvfs is a valid value for statvfs to overwrite.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and s a valid statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(format!(
            "statvfs {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns SIGINT/SIGTERM into an error at the next step, so the run unwinds through its cleanup
/// (unmount) instead of dying with the space mounted.
pub fn catch_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| first_line(&String::from_utf8_lossy(&out.stdout)))
}

/// The filesystem holding `p`: (mount point, source device, type), from /proc/self/mountinfo.
fn filesystem_of(p: &Path) -> Option<(String, String, String)> {
    let p = fs::canonicalize(p).ok()?;
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(String, String, String)> = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        let (Some(mp), Some(fstype), Some(src)) = (f.get(4), f.get(dash + 1), f.get(dash + 2))
        else {
            continue;
        };
        if p.starts_with(mp) && best.as_ref().is_none_or(|b| mp.len() >= b.0.len()) {
            best = Some((mp.to_string(), src.to_string(), fstype.to_string()));
        }
    }
    best
}

/// The CPU features that set this machine's floor of a daemon's CPU per GiB: blake3 and
/// the cutter's many-lane search use AVX-512 where it is there (blake3 ran at 2.1 GiB/s per
/// core on an AVX2-only host and 3.8 on an AVX-512 one of the same VM class: runs of two
/// sessions are comparable only where this line is the same).
fn simd_flags(cpuinfo: &str) -> String {
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split(':').nth(1))
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default();
    let have: Vec<&str> = ["avx2", "avx512f", "avx512vbmi", "sha_ni"]
        .into_iter()
        .filter(|f| flags.contains(f))
        .collect();
    match (flags.is_empty(), have.is_empty()) {
        (true, _) => "? (no flags in /proc/cpuinfo)".into(),
        (false, true) => "none of avx2, avx512f, avx512vbmi, sha_ni".into(),
        (false, false) => have.join(" "),
    }
}

/// The kernel's cap on one FUSE request (`fs.fuse.max_pages_limit`, 256 pages by default):
/// under the 4 MiB the daemon asks for, a 1 MiB write from a buffer that is not page-aligned
/// (most applications') spans 257 pages and reaches the daemon as two requests, which costs
/// a next step about 0.1 CPU-s/GiB on 2 cores (README, "Write path and memory bounds").
fn fuse_request_cap() -> String {
    let want = u64::from(MAX_WRITE_BYTES) / 4096;
    match fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit") {
        Ok(s) => match s.trim().parse::<u64>() {
            Ok(p) => format!(
                "{p} pages ({} KiB; fs.fuse.max_pages_limit{})",
                p * 4,
                if p < want {
                    format!(", under the {want} the daemon asks for")
                } else {
                    String::new()
                }
            ),
            Err(_) => format!("? (fs.fuse.max_pages_limit reads {:?})", s.trim()),
        },
        Err(_) => "256 pages (this kernel has no fs.fuse.max_pages_limit)".into(),
    }
}

/// (key, value) lines describing the machine and the binaries under test.
pub fn environment(dir: &Path, ckptfs: &Path) -> Vec<(String, String)> {
    let mut env = Vec::new();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
        .unwrap_or("?");
    env.push((
        "cpus".into(),
        format!("{} ({model})", crate::data::threads()),
    ));
    if let Some(kib) = status_field("/proc/meminfo", "MemTotal:") {
        env.push((
            "memory".into(),
            format!("{:.1} GiB", kib as f64 / 1048576.0),
        ));
    }
    env.push(("cpu simd".into(), simd_flags(&cpuinfo)));
    env.push((
        "kernel".into(),
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
    ));
    env.push(("fuse requests".into(), fuse_request_cap()));
    let disk = match filesystem_of(dir) {
        Some((mp, src, ty)) => format!("{src} ({ty}, mounted at {mp})"),
        None => "?".into(),
    };
    env.push(("work dir".into(), format!("{} on {disk}", dir.display())));
    let version = command_line(&ckptfs.to_string_lossy(), &["--version"]).unwrap_or_default();
    let mtime = fs::metadata(ckptfs)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map(|d| format!(", built {:.0} min ago", d.as_secs_f64() / 60.0))
        .unwrap_or_default();
    env.push((
        "ckptfs".into(),
        format!("{} ({version}{mtime})", ckptfs.display()),
    ));
    let src = env!("CARGO_MANIFEST_DIR");
    let commit = command_line("git", &["-C", src, "describe", "--always", "--dirty"])
        .unwrap_or_else(|| "?".into());
    env.push(("bench source".into(), format!("{src} at git {commit}")));
    env.push((
        "root".into(),
        if is_root() {
            "yes".into()
        } else {
            "NO: cold reads are warm, peak RSS may not reset".into()
        },
    ));
    env
}

/// Fails with a clear message unless the filesystem holding `dir` has `need` bytes free;
/// `what` says what they are for (appended in parentheses).
pub fn ensure_free(dir: &Path, need: u64, what: &str) -> Result<()> {
    const GIB: f64 = (1u64 << 30) as f64;
    let free = free_bytes(dir)?;
    if free < need {
        return Err(format!(
            "not enough free disk space in {}: {:.1} GiB free, need {:.1} GiB ({what}); use a smaller --size or another --dir",
            dir.display(),
            free as f64 / GIB,
            need as f64 / GIB,
        ));
    }
    Ok(())
}

/// ckptfs's `MAX_WRITE_BYTES`: the largest write request, and the readahead.
pub const MAX_WRITE_BYTES: u32 = 4 << 20;

/// Unmounts `mnt` (`lazy`: detached) with `fusermount3`, or with `umount` where there is no
/// `fusermount3` (a root-only machine without Debian's fuse3, such as the GPU nodes: there the
/// sink never saw its unmount and was killed, failing `limits`).
pub fn fusermount_u(mnt: &Path, lazy: bool) -> bool {
    use std::process::{Command, Stdio};
    let run = |prog: &str, flags: &[&str]| {
        Command::new(prog)
            .args(flags)
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
    };
    let fm = run("fusermount3", if lazy { &["-u", "-z"] } else { &["-u"] });
    match fm {
        Ok(s) => s.success(),
        Err(_) => run("umount", if lazy { &["-l"] } else { &[] }).is_ok_and(|s| s.success()),
    }
}

/// Whether something is mounted at `p`: its device differs from its parent's, or it cannot be
/// stat'ed at all (a FUSE mount whose daemon died answers ENOTCONN).
pub fn is_mountpoint(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = p.parent().unwrap_or(Path::new("/"));
    match (fs::metadata(p), fs::metadata(parent)) {
        (Ok(a), Ok(b)) => a.dev() != b.dev(),
        (Err(e), _) => e.kind() != std::io::ErrorKind::NotFound,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::simd_flags;

    #[test]
    fn simd_flags_name_what_the_cpu_lists_and_say_when_nothing_is_listed() {
        let zen4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 sha_ni avx512f avx512vbmi\n";
        assert_eq!(simd_flags(zen4), "avx2 avx512f avx512vbmi sha_ni");
        // A word that only starts like a flag is not that flag.
        let old = "flags\t\t: fpu sse2 avx avx512fx\n";
        assert_eq!(simd_flags(old), "none of avx2, avx512f, avx512vbmi, sha_ni");
        assert_eq!(
            simd_flags("model name\t: ?\n"),
            "? (no flags in /proc/cpuinfo)"
        );
    }
}
