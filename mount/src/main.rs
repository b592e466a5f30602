//! `ckptfs`: format, mount, unmount and inspect checkpoint filesystems.

mod fuse;

use ckptfs_engine::space::{free_disk_bytes, lock_holder, read_superblock, MIN_SPACE_BYTES};
use ckptfs_engine::{Space, Stats};
use clap::{Parser, Subcommand};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Default chunk size: 64 KiB catches sparse updates while keeping metadata at ~40 bytes per
/// 64 KiB of data and giving LZ4 enough context to compress.
const DEFAULT_CHUNK: &str = "64K";
/// Size of the default backing space, formatted on first `ckptfs mount MOUNTPOINT`.
const DEFAULT_SPACE_BYTES: u64 = 8 << 30;
/// How long `mount` waits for the daemon to report the mount ready.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `umount` waits for the daemon to finish committing and exit.
const UMOUNT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Parser)]
#[command(
    name = "ckptfs",
    version,
    about = "A deduplicating, compressing checkpoint filesystem"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Reserve a backing space: a preallocated data file plus its metadata table.
    Format {
        dir: PathBuf,
        /// Size of the reserved data file, e.g. 64G, 512M.
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Average content-defined chunk size (a power of two, 4K to 4M).
        #[arg(long, value_parser = parse_size, default_value = DEFAULT_CHUNK)]
        chunk_size: u64,
        /// Erase an existing (unmounted) ckptfs space in DIR.
        #[arg(long)]
        force: bool,
    },
    /// Mount a backing space: `ckptfs mount [BACKING_DIR] MOUNTPOINT`. With only a mountpoint,
    /// the default space is used (formatted on first use).
    Mount {
        #[arg(num_args = 1..=2, required = true, value_name = "[BACKING_DIR] MOUNTPOINT")]
        paths: Vec<PathBuf>,
        /// Stay attached and log to stderr instead of returning once mounted.
        #[arg(long)]
        foreground: bool,
        /// Let users other than the one mounting access the mount (modes still apply).
        #[arg(long)]
        allow_other: bool,
        /// Threads serving FUSE requests.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
        threads: u32,
        #[arg(long, hide = true)]
        notify_ready: bool,
    },
    /// Unmount, waiting until every closed file is committed and the daemon has exited.
    Umount { mountpoint: PathBuf },
    /// Show logical and stored bytes, dedup and compression ratios, and free space.
    Stats {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix in {s:?} (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size too large: {s:?}"))
}

/// Where `ckptfs mount MOUNTPOINT` keeps its space: $CKPTFS_DEFAULT_SPACE, else
/// /var/lib/ckptfs/default for root, else $XDG_DATA_HOME (or ~/.local/share)/ckptfs/default.
fn default_space_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("CKPTFS_DEFAULT_SPACE") {
        return PathBuf::from(p);
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/ckptfs/default");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("ckptfs/default")
}

fn ensure_default_space(dir: &Path) -> Result<(), String> {
    if dir.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // 8 GiB, or half the free space of that disk if that is less.
    let free = free_disk_bytes(dir).map_err(|e| e.to_string())?;
    let size = DEFAULT_SPACE_BYTES.min(free / 2) & !0xfffff;
    if size < MIN_SPACE_BYTES {
        return Err(format!(
            "not enough free disk at {} for a default space",
            dir.display()
        ));
    }
    let chunk = parse_size(DEFAULT_CHUNK)? as u32;
    Space::format(dir, size, chunk, false).map_err(|e| e.to_string())?;
    eprintln!(
        "ckptfs: formatted the default backing space at {} ({} MiB)",
        dir.display(),
        size >> 20
    );
    Ok(())
}

fn check_mountpoint(m: &Path) -> Result<(), String> {
    match std::fs::metadata(m) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(format!("mountpoint {} is not a directory", m.display())),
        Err(e) => Err(format!("mountpoint {}: {e}", m.display())),
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn mount(
    paths: Vec<PathBuf>,
    foreground: bool,
    allow_other: bool,
    threads: u32,
    notify: bool,
) -> Result<(), String> {
    let (backing, mnt) = match paths.as_slice() {
        [m] => {
            let d = default_space_dir();
            ensure_default_space(&d)?;
            (d, m.clone())
        }
        [b, m] => (b.clone(), m.clone()),
        _ => return Err("usage: ckptfs mount [BACKING_DIR] MOUNTPOINT".into()),
    };
    let (backing, mnt) = (absolute(&backing), absolute(&mnt));
    check_mountpoint(&mnt)?;
    if !foreground {
        return spawn_daemon(&backing, &mnt, allow_other, threads);
    }
    let mut space = Space::open(&backing).map_err(|e| e.to_string())?;
    space
        .set_lock_note(&format!(
            "pid {} mounted at {}",
            std::process::id(),
            mnt.display()
        ))
        .map_err(|e| e.to_string())?;
    let fs = fuse::CkptFs::new(ckptfs_fs::Fs::new(space));
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("ckptfs:{}", backing.display())),
        fuser::MountOption::Subtype("ckptfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::RW,
    ];
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(threads as usize);
    let mut session = fuser::Session::new(fs, &mnt, &config)
        .map_err(|e| format!("cannot mount at {}: {e}", mnt.display()))?;
    log::info!("mounted {} at {}", backing.display(), mnt.display());
    let mut unmounter = session.unmount_callable();
    std::thread::spawn(move || {
        wait_for_termination();
        log::info!("signal received; unmounting");
        if let Err(e) = unmounter.unmount() {
            log::error!("unmount failed: {e}");
        }
    });
    if notify {
        println!("ready");
        let _ = std::io::stdout().flush();
        // SAFETY: replacing our stdout with /dev/null so the waiting parent sees EOF.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
            if null >= 0 {
                libc::dup2(null, 1);
                libc::close(null);
            }
        }
    }
    session
        .run()
        .map_err(|e| format!("FUSE session ended with an error: {e}"))
}

/// The signals that ask the daemon to unmount and exit.
fn termination_signals() -> libc::sigset_t {
    // SAFETY: plain sigset manipulation on a local, zero-initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks until a termination signal arrives. The signals are blocked in every thread (the
/// mask is set before the session's threads start), so only this wait receives them.
fn wait_for_termination() {
    let set = termination_signals();
    let mut sig = 0;
    // SAFETY: sigwait reads the set and writes the signal number into `sig`.
    unsafe { libc::sigwait(&set, &mut sig) };
}

/// Applies to this thread and the threads it spawns later.
fn block_termination_signals() {
    let set = termination_signals();
    // SAFETY: pthread_sigmask reads the set; the old mask is not requested.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Starts the daemon in its own session, logging to the space's log file, and waits until
/// it reports the mount ready (or fails, in which case its log is shown).
fn spawn_daemon(backing: &Path, mnt: &Path, allow_other: bool, threads: u32) -> Result<(), String> {
    read_superblock(backing).map_err(|e| e.to_string())?;
    let log_path = backing.join(ckptfs_engine::format::LOG_FILE);
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("--foreground").arg("--notify-ready");
    cmd.arg("--threads").arg(threads.to_string());
    if allow_other {
        cmd.arg("--allow-other");
    }
    cmd.arg(backing).arg(mnt);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "ckptfs=info,ckptfs_fs=info,ckptfs_engine=info");
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    // SAFETY: setsid in the child between fork and exec only detaches it from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(MOUNT_TIMEOUT).unwrap_or_default();
    if line.trim() == "ready" {
        println!("ckptfs: mounted {} at {}", backing.display(), mnt.display());
        return Ok(());
    }
    let _ = child.kill();
    let _ = child.wait();
    let log_text = std::fs::read(&log_path).unwrap_or_default();
    let tail = String::from_utf8_lossy(&log_text[(log_start as usize).min(log_text.len())..]);
    Err(format!("mount failed:\n{}", tail.trim_end()))
}

fn mounted_at(mnt: &Path) -> bool {
    backing_of(mnt).is_some()
}

fn umount(mnt: &Path) -> Result<(), String> {
    let mnt = absolute(mnt);
    if !mounted_at(&mnt) {
        return Err(format!("{} is not a ckptfs mount", mnt.display()));
    }
    // The daemon's pid is in the space's lock file; find it through the mount's fsname.
    let pid = daemon_pid(&mnt);
    let status = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .or_else(|_| Command::new("umount").arg(&mnt).status())
        .map_err(|e| format!("cannot run fusermount3 or umount: {e}"))?;
    if !status.success() {
        return Err(format!(
            "unmounting {} failed (files still open?)",
            mnt.display()
        ));
    }
    if let Some(pid) = pid {
        let start = Instant::now();
        // SAFETY: kill with signal 0 only checks whether the process exists.
        while unsafe { libc::kill(pid, 0) } == 0 {
            if start.elapsed() > UMOUNT_TIMEOUT {
                return Err(format!("daemon {pid} did not exit after unmount"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

fn backing_of(mnt: &Path) -> Option<PathBuf> {
    let s = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mnt.to_string_lossy();
    for l in s.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() > 4 && f[4] == want {
            let sep = f.iter().position(|x| *x == "-")?;
            let src = f.get(sep + 2)?;
            return src.strip_prefix("ckptfs:").map(PathBuf::from);
        }
    }
    None
}

fn daemon_pid(mnt: &Path) -> Option<i32> {
    let holder = lock_holder(&backing_of(mnt)?)?;
    holder.split_whitespace().nth(1)?.parse().ok()
}

pub(crate) fn stats_json(s: &Stats) -> serde_json::Value {
    serde_json::json!({
        "logical_bytes": s.logical_bytes,
        "referenced_bytes": s.referenced_bytes,
        "stored_bytes": s.stored_bytes,
        "raw_chunk_bytes": s.raw_chunk_bytes,
        "dedup_ratio": s.dedup_ratio(),
        "compression_ratio": s.compression_ratio(),
        "chunks": s.chunks,
        "files": s.files,
        "dirs": s.dirs,
        "symlinks": s.symlinks,
        "special": s.special,
        "revisions": s.revisions,
        "reserved_bytes": s.reserved_bytes,
        "used_bytes": s.used_bytes,
        "free_bytes": s.free_bytes,
        "chunk_avg_bytes": s.chunk_avg_bytes,
        "failed": s.failed,
    })
}

fn stats_from_json(v: &serde_json::Value) -> Option<Stats> {
    let u = |k: &str| v.get(k).and_then(|x| x.as_u64());
    Some(Stats {
        logical_bytes: u("logical_bytes")?,
        referenced_bytes: u("referenced_bytes")?,
        stored_bytes: u("stored_bytes")?,
        raw_chunk_bytes: u("raw_chunk_bytes")?,
        chunks: u("chunks")?,
        files: u("files")?,
        dirs: u("dirs")?,
        symlinks: u("symlinks")?,
        special: u("special")?,
        revisions: u("revisions")?,
        reserved_bytes: u("reserved_bytes")?,
        used_bytes: u("used_bytes")?,
        free_bytes: u("free_bytes")?,
        chunk_avg_bytes: u("chunk_avg_bytes")? as u32,
        failed: v.get("failed")?.as_bool()?,
    })
}

/// Stats from a mount (through an xattr the daemon answers) or a backing directory (read
/// directly when unmounted; through its mount when mounted).
fn read_stats(path: &Path) -> Result<Stats, String> {
    let path = absolute(path);
    let from_mount = |mnt: &Path| -> Result<Stats, String> {
        let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes())
            .map_err(|e| e.to_string())?;
        let name = c"user.ckptfs.stats";
        let mut buf = vec![0u8; 4096];
        // SAFETY: getxattr writes at most buf.len() bytes into buf.
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(format!(
                "{} is not a ckptfs mount: {}",
                mnt.display(),
                std::io::Error::last_os_error()
            ));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&buf[..n as usize]).map_err(|e| e.to_string())?;
        stats_from_json(&v).ok_or_else(|| "malformed stats from the daemon".to_string())
    };
    if path.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return match Space::open(&path) {
            Ok(space) => space.stats().map_err(|e| e.to_string()),
            Err(ckptfs_engine::Error::Locked(m)) => {
                let holder = lock_holder(&path).unwrap_or_default();
                match holder.split(" mounted at ").nth(1) {
                    Some(mnt) => from_mount(Path::new(mnt.trim())),
                    None => Err(m),
                }
            }
            Err(e) => Err(e.to_string()),
        };
    }
    from_mount(&path)
}

fn human(b: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

fn print_stats(s: &Stats) {
    println!("logical bytes      {}", human(s.logical_bytes));
    println!("stored bytes       {}", human(s.stored_bytes));
    println!("dedup ratio        {:.2}x", s.dedup_ratio());
    println!("compression ratio  {:.2}x", s.compression_ratio());
    println!("chunks             {}", s.chunks);
    println!("files              {}", s.files);
    println!("directories        {}", s.dirs);
    println!("revisions          {}", s.revisions);
    println!("reserved space     {}", human(s.reserved_bytes));
    println!("free space         {}", human(s.free_bytes));
    if s.failed {
        println!("STATE              FAILED: a backing write or sync failed; writes are refused");
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Format {
            dir,
            size,
            chunk_size,
            force,
        } => {
            let chunk =
                u32::try_from(chunk_size).map_err(|_| "chunk size too large".to_string())?;
            Space::format(&dir, size, chunk, force).map_err(|e| e.to_string())?;
            println!("ckptfs: formatted {} ({})", dir.display(), human(size));
            Ok(())
        }
        Cmd::Mount {
            paths,
            foreground,
            allow_other,
            threads,
            notify_ready,
        } => {
            if foreground {
                block_termination_signals();
            }
            mount(paths, foreground, allow_other, threads, notify_ready)
        }
        Cmd::Umount { mountpoint } => umount(&mountpoint),
        Cmd::Stats { path, json } => {
            let s = read_stats(&path)?;
            if json {
                println!("{}", stats_json(&s));
            } else {
                print_stats(&s);
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("ckptfs=warn"))
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ckptfs: {e}");
            ExitCode::FAILURE
        }
    }
}
