//! `ckptfs`: format, mount, unmount and inspect checkpoint filesystems.

mod advise;
mod check;
mod error;
mod fuse;
use error::CliError;
mod metrics;
mod report;
mod slots;
mod targets;
mod when;

use ckptfs_engine::format::SlotId;
use ckptfs_engine::layout::Mode;
use ckptfs_engine::maintenance::gc::{GcOptions, GcProgress, GcReport};
use ckptfs_engine::slots::SlotRequest;
use ckptfs_engine::space::StatsReport;
use ckptfs_engine::space::{
    free_disk_bytes, lock_holder, read_backing_dir, Config, MIN_SPACE_BYTES,
};
use ckptfs_engine::{parse_size, Space, Stats};
use ckptfs_fs::{Caller, Fs, RevisionListing};
use clap::{Parser, Subcommand};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
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
        /// Nodes that may mount the space at once: each mount claims a slot, its own share
        /// of the data file and its own metadata table (made at the slot's first claim).
        #[arg(long, default_value_t = 1)]
        slots: u32,
        /// A storage target (repeatable): a directory on its own disk, node-local device or
        /// pool that holds one preallocated file of erasure-coded shards. `DIR:domain=LABEL`
        /// names its failure domain (default: each target its own). DIR then holds only the
        /// superblock, metadata table and placement records.
        #[arg(long = "target", value_name = "DIR[:domain=LABEL]", value_parser = parse_target)]
        targets: Vec<ckptfs_engine::targets::TargetSpec>,
        /// With --target: M+K, each segment as M data and K parity shards on M+K targets in
        /// distinct failure domains, readable after any K are lost [default: 1+0 per target
        /// count; e.g. 3+2 for 5 targets].
        #[arg(long, value_name = "M+K", value_parser = parse_redundancy, requires = "targets")]
        redundancy: Option<ckptfs_engine::targets::Redundancy>,
        /// The codec new chunks get by default: `lz4`, or `float` (floating-point tensors as
        /// byte planes entropy-coded into zstd frames where that beats LZ4, LZ4 or raw
        /// elsewhere). `float` marks the space with its feature flag, so builds without the
        /// codec refuse it, and mounts use it unless their `--codec` says otherwise.
        #[arg(long, default_value = "lz4", value_parser = ["lz4", "float"])]
        codec: String,
        #[command(flatten)]
        retention: RetentionArgs,
    },
    /// Show the slots of a multi-slot space: who holds each (host, pid, mountpoint), its
    /// lease epoch and age, and the bytes it uses. Reads only the slot headers.
    Slots {
        /// A backing directory.
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Restore full redundancy of a space formatted with --target, online through its
    /// mount (or on an unmounted backing directory): the shards that failed targets held are
    /// rebuilt from the others onto healthy targets in failure domains each segment does not
    /// use yet, from data verified by blake3 first; damage found on other targets on the way
    /// is rewritten, and chunks that verify no way are reported lost (exit status 1). With
    /// --replace OLD=NEW, NEW becomes a target first (in OLD's failure domain unless NEW
    /// ends in :domain=LABEL) and OLD is retired, so its shards move to NEW.
    Rebuild {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        /// OLD: a target's index or directory; NEW: a new or empty directory.
        #[arg(long, value_name = "OLD=NEW")]
        replace: Option<String>,
        /// Write at most this many MiB/s of rebuilt shards (so jobs keep their bandwidth).
        #[arg(long, value_name = "MIB_S")]
        throttle: Option<f64>,
        #[arg(long)]
        json: bool,
    },
    /// Verify and repair a space formatted with --target, online through its mount (or on
    /// an unmounted backing directory): every segment is read, every committed chunk
    /// checked against its blake3 (rebuilt from the other shards where its stored bytes are
    /// damaged), and only then are shards encoded from it: damaged, stale or unreadable
    /// blocks on healthy targets are rewritten in place, shards on failed targets rebuilt
    /// onto others. Chunks no combination of readable shards verifies are reported lost.
    /// Exit status 1 when anything is lost or short.
    Scrub {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        /// Write at most this many MiB/s of repaired shards.
        #[arg(long, value_name = "MIB_S")]
        throttle: Option<f64>,
        #[arg(long)]
        json: bool,
    },
    /// Rebuild the lost backing directory of a space formatted with --target from the
    /// metadata mirror its targets hold (K+1 of them, `ckptfs targets` says which). Then
    /// mount BACKING_DIR as before.
    Recover {
        /// The backing directory to rebuild (new or empty; --force replaces a damaged one).
        backing: PathBuf,
        /// A target directory of the space: where to find the newest mirror.
        #[arg(long, value_name = "TARGET_DIR")]
        from: PathBuf,
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// When should the job checkpoint next? Daly's interval from the measured commit time
    /// of recent checkpoints and the failure model (--node-mtbf, --nodes, --restart: kept
    /// in the space's config once given), updated with failures seen on its targets. The
    /// first line is `checkpoint-now: yes` or `no`; a mount shows the same text in
    /// /.ckptfs/advice.
    Advise {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        /// Mean time between failures of one node (5y, 200d, 3000h; kept).
        #[arg(long, value_name = "DURATION")]
        node_mtbf: Option<String>,
        /// Nodes the job runs on; any one failing stops it (kept).
        #[arg(long)]
        nodes: Option<u64>,
        /// Time from a failure until the job computes again (kept; default: the commit time).
        #[arg(long, value_name = "DURATION")]
        restart: Option<String>,
        /// Use this commit time instead of the measured one (this question only).
        #[arg(long, value_name = "DURATION")]
        commit: Option<String>,
        /// A predicted availability drop in this long (with --mtbf-after): one-step
        /// look-ahead, whether to checkpoint before it.
        #[arg(long, value_name = "DURATION", requires = "mtbf_after")]
        drop_in: Option<String>,
        /// The system MTBF after the predicted drop.
        #[arg(long, value_name = "DURATION", requires = "drop_in")]
        mtbf_after: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show the storage targets of a space formatted with --target: per target its state,
    /// failure domain, errors, shards, free shard slots, bytes moved and write bandwidth,
    /// and what redundancy the data has right now (degraded after a target failed).
    Targets {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Show or change the retention policy and automatic gc of a space (mounted or not).
    Config {
        /// A backing directory or a mountpoint.
        path: PathBuf,
        #[command(flatten)]
        retention: RetentionArgs,
        #[arg(long)]
        json: bool,
    },
    /// Drop revisions outside the retention policy and reclaim their space (removed files'
    /// revisions are kept for keep-unlinked while there is room; --empty-trash drops them).
    Gc {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        /// Show the plan without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Also empty the trash now: drop the kept revisions of removed files, whatever
        /// keep-unlinked says (those open files still read stay).
        #[arg(long)]
        empty_trash: bool,
        #[arg(long)]
        json: bool,
    },
    /// List the revisions of a file: `ckptfs revisions PATH` (a path inside a mount), or
    /// `ckptfs revisions --space BACKING_DIR REL_PATH`.
    Revisions {
        path: PathBuf,
        #[arg(long, value_name = "BACKING_DIR")]
        space: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Draw what checkpoints cost as an SVG: for a file, logical and newly stored bytes of
    /// each revision; for a directory in a mount, of each entry (a checkpoint step), by
    /// commit time; and their ratio per checkpoint and cumulatively.
    Report {
        /// A file or a directory inside a mount (or a file's path in the space with --space).
        path: PathBuf,
        #[arg(long, value_name = "BACKING_DIR")]
        space: Option<PathBuf>,
        /// Where to write the SVG.
        #[arg(long, value_name = "FILE")]
        svg: PathBuf,
    },
    /// Make revision N current again (as a new revision), or copy it out with --to.
    Restore {
        path: PathBuf,
        #[arg(long, value_name = "BACKING_DIR")]
        space: Option<PathBuf>,
        #[arg(long, value_name = "N")]
        revision: u64,
        /// Copy the revision's bytes to FILE instead of restoring it in place.
        #[arg(long, value_name = "FILE")]
        to: Option<PathBuf>,
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
        /// Threads that hash, compress and store chunks (default: one per core). 0 does
        /// that work on the FUSE threads, inside each write request.
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=64))]
        workers: Option<u32>,
        /// Encodings for new chunks: `lz4` (LZ4 where it pays, else raw; chunks LZ4 would
        /// take a match every few bytes of, such as float32 values held as float64, are
        /// byte-shuffled first where that compresses better), `shuffle` (also
        /// a byte-shuffle before LZ4 for float arrays where that compresses better, at
        /// about four times the CPU cost on compressible data) or `float` (byte planes
        /// entropy-coded into standard zstd frames where that is smaller than LZ4: floating-
        /// point tensors). Readers decode all of them. Default: `float` on a space formatted
        /// or mounted with it before, else `lz4`.
        #[arg(long, value_parser = ["lz4", "shuffle", "float"])]
        codec: Option<String>,
        /// Compress new chunks on a GPU, in batches gathered from every file being written:
        /// `auto` uses one when libcuda, NVRTC and a device are there and logs which path it
        /// took; `on` refuses to mount without one; `off` (the default) keeps to the CPU,
        /// which on the GPU nodes measured costs less CPU per GiB than the GPU stage's
        /// copies do (README, GPU compression). The GPU writes standard LZ4 blocks, so a
        /// space written with it reads anywhere. `emulate` runs the GPU kernels in a slow CPU
        /// emulation (for tests).
        #[arg(long, default_value = "off", value_parser = ["auto", "on", "off", "emulate"])]
        gpu: String,
        /// How a chunk predicted from the previous revision (the same bytes as before) is
        /// confirmed: `fingerprint` (the default) by an xxh3-128 fingerprint of its bytes
        /// where this mount hashed that chunk before, else by blake3; `blake3` always by
        /// blake3, which costs about 0.15-0.2 CPU-s more per GiB of unchanged data (README,
        /// "Confirming predicted chunks").
        #[arg(long, default_value = "fingerprint", value_parser = ["fingerprint", "blake3"])]
        confirm: String,
        /// Where bytes a next revision changed in place are cut: `follow` (the default) at the
        /// previous revision's chunk boundaries, so only the old chunks the change touched are
        /// stored again (about a fifth fewer bytes than `content` on a next step with 5% of
        /// its 64 KiB blocks changed); `content` always by content (FastCDC), so the chunks of
        /// any bytes are the same whatever this mount wrote before: the same bytes written
        /// later by a writer that did not read this revision deduplicate with it everywhere,
        /// not only outside the changed regions (README, "Changes in place").
        #[arg(long, default_value = "follow", value_parser = ["follow", "content"])]
        cuts: String,
        /// Directory holding libcuda.so.1 / libnvrtc.so.13 when they are not on the loader's
        /// path (also CKPTFS_CUDA_LIB_DIR).
        #[arg(long, value_name = "DIR")]
        cuda_lib_dir: Option<PathBuf>,
        /// Mount read-only: nothing is written to the backing directory (not even the
        /// metadata table's bookkeeping, the lock file's note or the log, which goes to
        /// the temporary directory), writes fail with EROFS, automatic gc is off. Other
        /// read-only mounts of the same space may run at the same time; a read-write one
        /// may not.
        #[arg(long)]
        read_only: bool,
        /// Mount options, comma-separated, as mount(8) and fstab pass them: `ro` (as
        /// --read-only), `rw`, `allow_other`, `threads=N`, `workers=N`, `codec=C`, `gpu=G`, `confirm=C`, `cuts=C`,
        /// `cuda_lib_dir=DIR` (as the flags), `suid` (ckptfs mounts nosuid unless told),
        /// `nosuid`, `noexec`, `exec`; the ones
        /// mount(8) and the kernel handle themselves (`defaults`, `auto`, `noauto`, `user`,
        /// `nofail`, `_netdev`, `dev`, `nodev`, the atime ones, `x-*`, `comment=`) are
        /// accepted and ignored. Any other is refused.
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Option<String>,
        /// Of a multi-slot space: claim slot N (refused while another live mount holds
        /// it; taken over once its holder's lease has run out). Default: the first free
        /// slot, else the first whose lease ran out.
        #[arg(long, value_name = "N")]
        slot: Option<u32>,
        /// Of a multi-slot space: the lease this mount renews (every quarter of it). A dead
        /// node's slot can be taken over after this long; a mount that could not renew for
        /// 3/4 of it (frozen, or its storage stalled) stops writing for good.
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_lease)]
        lease: Duration,
        /// With --slot: claim it even while its holder's lease runs. Only when that holder
        /// is known to be dead (its node powered off): a live holder writes on until its
        /// next renewal and could damage what this mount writes.
        #[arg(long, requires = "slot")]
        take_over: bool,
        /// Of a multi-slot space: skip the coherence probe (at mount, another live node
        /// must echo a nonce this node writes, within 5 s; see "Several nodes" in the
        /// README). Only when the other holders are known to be stopped.
        #[arg(long)]
        no_probe: bool,
        #[arg(long, hide = true)]
        notify_ready: bool,
    },
    /// Unmount, waiting until every closed file is committed and the daemon has exited.
    Umount { mountpoint: PathBuf },
    /// Read back and verify every stored chunk and check the metadata; name every damaged
    /// file and revision. Exit status 0 clean, 1 damage found (on a space over targets, also
    /// data with less redundancy than its M+K), 2 could not check.
    Check {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Write the man pages or a shell's completions, generated from this command line's
    /// definition (what `scripts/install.sh` installs).
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: Generate,
    },
    /// Show logical and stored bytes, dedup and compression ratios, free space and where
    /// the used space is (live, kept revisions, removed files' revisions, reclaimable); on a
    /// space over several targets, each target's errors since the mount.
    Stats {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Print the Prometheus text format (for node_exporter's textfile collector).
        #[arg(long)]
        prometheus: bool,
    },
}

#[derive(Subcommand)]
enum Generate {
    /// Man pages (ckptfs.1 and one per command, ckptfs-mount.1, ...) into DIR.
    Man { dir: PathBuf },
    /// Completions for SHELL (bash, zsh, fish, elvish, powershell) on stdout.
    Completions { shell: clap_complete::Shell },
}

/// Retention options shared by `format` and `config`.
#[derive(clap::Args, Default)]
struct RetentionArgs {
    /// Newest complete revisions kept per path (default 2).
    #[arg(long)]
    keep_revisions: Option<u64>,
    /// Also keep revisions younger than this (e.g. 6h, 7d; `off` to disable).
    #[arg(long, value_parser = parse_duration)]
    keep_age: Option<u64>,
    /// Keep the revisions of an unlinked path this long (default 7d).
    #[arg(long, value_parser = parse_duration)]
    keep_unlinked: Option<u64>,
    /// Run gc automatically when free space falls below this percentage (default 20; 0 = off).
    #[arg(long)]
    auto_gc_free_percent: Option<u64>,
}

impl RetentionArgs {
    fn is_empty(&self) -> bool {
        self.keep_revisions.is_none()
            && self.keep_age.is_none()
            && self.keep_unlinked.is_none()
            && self.auto_gc_free_percent.is_none()
    }

    fn apply(&self, c: &mut Config) {
        if let Some(v) = self.keep_revisions {
            c.keep_revisions = v;
        }
        if let Some(v) = self.keep_age {
            c.keep_age_secs = v;
        }
        if let Some(v) = self.keep_unlinked {
            c.keep_unlinked_secs = v;
        }
        if let Some(v) = self.auto_gc_free_percent {
            c.auto_gc_free_percent = v;
        }
    }

    /// The same settings as `key=value,...`, the form the daemon's config xattr takes.
    fn to_pairs(&self) -> String {
        let mut c = Vec::new();
        let mut push = |k: &str, v: Option<u64>| {
            if let Some(v) = v {
                c.push(format!("{k}={v}"));
            }
        };
        push("keep_revisions", self.keep_revisions);
        push("keep_age_secs", self.keep_age);
        push("keep_unlinked_secs", self.keep_unlinked);
        push("auto_gc_free_percent", self.auto_gc_free_percent);
        c.join(",")
    }
}

/// `30s`, `10m`, `2h`, `7d`, a plain number of seconds, or `off` (0).
fn parse_duration(s: &str) -> Result<u64, CliError> {
    let t = s.trim();
    if t == "off" {
        return Ok(0);
    }
    let (num, mult) = match t.chars().last() {
        Some('s') => (&t[..t.len() - 1], 1),
        Some('m') => (&t[..t.len() - 1], 60),
        Some('h') => (&t[..t.len() - 1], 3600),
        Some('d') => (&t[..t.len() - 1], 86400),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (use 30s, 10m, 2h, 7d)"))?;
    Ok(n.checked_mul(mult)
        .ok_or_else(|| format!("duration too large: {s:?}"))?)
}

/// A lease: a duration as `parse_duration` reads it, or milliseconds (`500ms`).
fn parse_lease(s: &str) -> Result<Duration, CliError> {
    let d = match s.trim().strip_suffix("ms") {
        Some(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("not a duration: {s:?} (use 30s, 2m, 500ms)"))?,
        ),
        None => Duration::from_secs(parse_duration(s)?),
    };
    if d < ckptfs_engine::slots::MIN_LEASE {
        return Err(format!(
            "a lease of {d:?} is below the minimum of {:?}",
            ckptfs_engine::slots::MIN_LEASE
        )
        .into());
    }
    Ok(d)
}

/// Applies `key=value,...` to a config (the daemon's side of `ckptfs config`).
pub(crate) fn apply_config(c: &mut Config, pairs: &str) -> Result<(), CliError> {
    for kv in pairs.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or("expected key=value")?;
        let v: u64 = v.parse().map_err(|_| format!("bad value for {k}"))?;
        match k {
            "keep_revisions" => c.keep_revisions = v,
            "keep_age_secs" => c.keep_age_secs = v,
            "keep_unlinked_secs" => c.keep_unlinked_secs = v,
            "auto_gc_free_percent" => c.auto_gc_free_percent = v,
            _ => return Err(format!("unknown setting {k}").into()),
        }
    }
    c.validate().map_err(CliError::from)
}

pub(crate) fn config_json(c: &Config) -> serde_json::Value {
    serde_json::json!({
        "keep_revisions": c.keep_revisions,
        "keep_age_secs": c.keep_age_secs,
        "keep_unlinked_secs": c.keep_unlinked_secs,
        "auto_gc_free_percent": c.auto_gc_free_percent,
    })
}

pub(crate) fn gc_json(r: &GcReport) -> serde_json::Value {
    serde_json::to_value(r).expect("gc report serializes")
}

pub(crate) fn revisions_json(l: &[RevisionListing]) -> serde_json::Value {
    serde_json::Value::Array(
        l.iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.id,
                    "committed_unix": r.committed_unix,
                    "size": r.size,
                    "new_bytes": r.new_bytes,
                    "current": r.current,
                })
            })
            .collect(),
    )
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

fn ensure_default_space(dir: &Path) -> Result<(), CliError> {
    if dir.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // 8 GiB, or half the free space of that disk if that is less.
    let free = free_disk_bytes(dir).map_err(CliError::from)?;
    let size = DEFAULT_SPACE_BYTES.min(free / 2) & !0xfffff;
    if size < MIN_SPACE_BYTES {
        return Err(format!(
            "not enough free disk at {} for a default space",
            dir.display()
        )
        .into());
    }
    let chunk = parse_size(DEFAULT_CHUNK)? as u32;
    Space::format(dir, size, chunk, Config::default(), false).map_err(CliError::from)?;
    eprintln!(
        "ckptfs: formatted the default backing space at {} ({} MiB)",
        dir.display(),
        size >> 20
    );
    Ok(())
}

fn check_mountpoint(m: &Path) -> Result<(), CliError> {
    match std::fs::metadata(m) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(format!("mountpoint {} is not a directory", m.display()).into()),
        Err(e) => Err(format!("mountpoint {}: {e}", m.display()).into()),
    }
}

/// A backing directory that is missing or not a directory is named as such, before anything
/// looks for a superblock in it.
fn check_backing_dir(b: &Path) -> Result<(), CliError> {
    // Not a space, for the exit status (`error::exit::NOT_A_SPACE`), as an unformatted one.
    let not_a_space = |m: String| CliError::Engine(ckptfs_engine::Error::NotASpace(m));
    match std::fs::metadata(b) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(not_a_space(format!(
            "backing directory {} is not a directory",
            b.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_a_space(format!(
            "backing directory {} does not exist (create a space with `ckptfs format {} \
             --size SIZE`)",
            b.display(),
            b.display()
        ))),
        Err(e) => Err(format!("backing directory {}: {e}", b.display()).into()),
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Daemon settings that do not change what is stored, only how fast.
struct Tuning {
    threads: u32,
    workers: Option<u32>,
    /// `--codec`; `None`: the space's default (see the flag).
    codec: Option<String>,
    gpu: String,
    /// `--confirm`: predicted chunks confirmed by fingerprint (`true`) or by blake3.
    confirm_by_fingerprint: bool,
    /// `--cuts`: changes in place cut at the old boundaries (`true`) or by content.
    follow_changes: bool,
    cuda_lib_dir: Option<PathBuf>,
    /// Not tuning, but carried to the daemon alike: `--read-only`.
    read_only: bool,
    /// Kernel mount flags from `-o`: `suid` (ckptfs mounts nosuid unless told), `noexec`.
    /// ckptfs always mounts `nodev`.
    suid: bool,
    noexec: bool,
    /// Of a multi-slot space: `--slot`, `--lease`, `--take-over`.
    slot: Option<u32>,
    lease: Duration,
    take_over: bool,
    no_probe: bool,
}

/// The batch codec `--gpu` asks for, if any (see the flag's help).
fn choose_gpu(
    tuning: &Tuning,
    codec: &str,
) -> Result<Option<Arc<dyn ckptfs_engine::kernels::BatchCodec>>, String> {
    use ckptfs_engine::kernels::{gpu, BatchCodec, Emu};
    let mode = tuning.gpu.as_str();
    if codec != "lz4" && mode != "off" {
        if mode == "on" || mode == "emulate" {
            return Err(format!(
                "--gpu on and --gpu emulate compress with plain LZ4; codec {codec} runs on the CPU (choose \
                 one: --codec lz4 or --gpu off)"
            ));
        }
        log::info!("GPU: not used: codec {codec} runs on the CPU");
        return Ok(None);
    }
    match mode {
        "off" => {
            log::info!("GPU: not used (--gpu off, the default); compressing on the CPU");
            return Ok(None);
        }
        "emulate" => {
            log::warn!("--gpu emulate: the GPU kernels run in a slow CPU emulation (for tests)");
            return Ok(Some(Arc::new(Emu)));
        }
        _ => {}
    }
    if tuning.workers == Some(0) {
        if mode == "on" {
            return Err(
                "--gpu on needs store workers; --workers 0 compresses inline on the \
                        FUSE threads"
                    .into(),
            );
        }
        log::info!("GPU: not used: --workers 0 compresses inline on the FUSE threads");
        return Ok(None);
    }
    let opts = gpu::GpuOptions {
        lib_dir: tuning.cuda_lib_dir.clone(),
        sub_batch_bytes: Some(ckptfs_engine::store::GPU_SUB_BATCH_BYTES),
        ..Default::default()
    };
    match gpu::Gpu::open(&opts) {
        Ok(g) => {
            log::info!("GPU: compressing new chunks on {}", g.describe());
            Ok(Some(Arc::new(g)))
        }
        Err(e) if mode == "auto" => {
            log::info!("GPU: not used, compressing on the CPU: {e}");
            Ok(None)
        }
        Err(e) => Err(format!("--gpu on: {e}")),
    }
}

fn mount(
    paths: Vec<PathBuf>,
    foreground: bool,
    allow_other: bool,
    tuning: Tuning,
    notify: bool,
) -> Result<(), CliError> {
    let (backing, mnt) = match paths.as_slice() {
        [m] => {
            let d = default_space_dir();
            // A read-only mount formats nothing: no space there is an error below.
            if !tuning.read_only {
                ensure_default_space(&d)?;
            }
            (d, m.clone())
        }
        [b, m] => (b.clone(), m.clone()),
        _ => return Err("usage: ckptfs mount [BACKING_DIR] MOUNTPOINT".into()),
    };
    let (backing, mnt) = (absolute(&backing), absolute(&mnt));
    check_backing_dir(&backing)?;
    check_mountpoint(&mnt)?;
    check_apart(&backing, &mnt)?;
    if let Some(other) = backing_of(&mnt) {
        // A second mount on top of a live one would hide it (its files still open) and
        // leave two daemons the kernel routes requests to by whichever is on top.
        let holder = control_get(&mnt, "pid", true)
            .ok()
            .and_then(|v| v.as_i64())
            .map(|p| format!(" (daemon pid {p})"))
            .unwrap_or_default();
        return Err(format!(
            "{} already holds a ckptfs mount of {}{holder}; unmount it first (`ckptfs umount {}`)",
            mnt.display(),
            other.display(),
            mnt.display()
        )
        .into());
    }
    if !foreground {
        return spawn_daemon(&backing, &mnt, allow_other, &tuning);
    }
    // Before any thread starts: see `limit_heap_arenas`.
    limit_heap_arenas();
    let (mut space, slots) = open_for_mount(&backing, &mnt, &tuning)?;
    configure_space(&mut space, &tuning)?;
    if let Some(hint) = fuse::request_cap_hint(fuse::request_cap_pages()) {
        log::info!("{hint}");
    }
    if !tuning.read_only {
        if slots == 1 {
            space
                .set_lock_note(&format!(
                    "pid {} mounted at {}",
                    std::process::id(),
                    mnt.display()
                ))
                .map_err(CliError::from)?;
        }
    } else {
        log::info!(
            "read-only: nothing will be written to {}",
            backing.display()
        );
    }
    let fs = Arc::new(Fs::new(space));
    // A slot of a multi-slot space: publish the slot's namespace for the other nodes (a
    // new manifest generation: a takeover publishes what the dead owner committed) and
    // read theirs before the mount is ready.
    match fs.publish_all() {
        Ok(()) => {}
        // More targets lost than the redundancy allows: what survived is still read here,
        // as on a space of one slot; the other nodes see this slot's files as of its last
        // publication until the targets are back (every later publication retries).
        Err(ckptfs_fs::Error::Engine(ckptfs_engine::Error::Targets(t))) => log::error!(
            "this slot's manifest cannot be published now ({t}): the other nodes see its \
             files as they were at its last publication until enough targets are back"
        ),
        Err(e) => return Err(format!("cannot publish this slot's manifest: {e}").into()),
    }
    fs.refresh_union()
        .map_err(|e| format!("cannot read the other slots' manifests: {e}"))?;
    let fs_for_names = fs.clone();
    let mut adapter = fuse::CkptFs::new(fs.clone());
    adapter.allow_idmap = allow_other;
    let stop = adapter.stop.clone();
    let notifier = adapter.notifier.clone();
    let invalidator = adapter.invalidator.clone();
    let auto_gc = start_maintenance(fs, stop);
    let config = fuse_config(&backing, &tuning, allow_other);
    let mut session = fuser::Session::new(adapter, &mnt, &config)
        .map_err(|e| format!("cannot mount at {}: {e}", mnt.display()))?;
    let _ = invalidator.set(fuse::Invalidator::start(session.notifier()));
    let _ = notifier.set(session.notifier());
    fs_for_names.set_entry_invalidator(fuse::entry_dropper(session.notifier()));
    log::info!("mounted {} at {}", backing.display(), mnt.display());
    let mut unmounter = session.unmount_callable();
    std::thread::spawn(move || {
        wait_for_termination();
        log::info!("signal received; unmounting");
        if let Err(e) = unmounter.unmount() {
            log::error!("unmount failed: {e}");
        }
    });
    let mnt_ra = mnt.clone();
    std::thread::spawn(move || set_readahead(&mnt_ra));
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
    let result = session
        .run()
        .map_err(|e| format!("FUSE session ended with an error: {e}"));
    // destroy() set the stop flag; the space closes when this last holder of it ends.
    let _ = auto_gc.join();
    Ok(result?)
}

/// Opens the space a foreground mount serves, as `tuning` says: a single-slot space once
/// no other process holds it (waiting for an exiting daemon), a slot by claiming it and
/// probing that the other nodes see its writes. Returns it and the space's slot count.
fn open_for_mount(backing: &Path, mnt: &Path, tuning: &Tuning) -> Result<(Space, u32), CliError> {
    // A foreground mount started by hand (or by a service manager) right after an unmount
    // waits for the exiting daemon too; started by `spawn_daemon`, this returns at once.
    let slots = read_backing_dir(backing, !tuning.read_only)
        .map_err(CliError::from)?
        .slots;
    if slots == 1 {
        check_not_locked(backing, tuning.read_only)?;
    } else if !tuning.read_only {
        slots::wait_for_own_exiting_daemon(backing, mnt)?;
    }
    let mode = match tuning.read_only {
        true => Mode::ReadOnly,
        false => Mode::Mount(SlotRequest {
            slot: tuning.slot.map(SlotId),
            lease: tuning.lease,
            mountpoint: mnt.display().to_string(),
            take_over: tuning.take_over,
        }),
    };
    let space = Space::open_as(backing, &mode).map_err(CliError::from)?;
    if let Some(l) = space.lease() {
        log::info!(
            "claimed slot {} of {slots} (epoch {}, lease {:?})",
            l.slot(),
            l.epoch(),
            tuning.lease
        );
        if !tuning.read_only {
            answer_probes_while_held(l);
        }
        if !tuning.no_probe {
            match l.probe_coherence(PROBE_WAIT) {
                Ok(None) => log::info!("coherence probe: no other node is live"),
                Ok(Some((s, t))) => log::info!(
                    "coherence probe: slot {s} saw this node's write, and this node its \
                     answer, in {} ms",
                    t.as_millis()
                ),
                Err(e) => return Err(format!("{e}").into()),
            }
        }
    }
    Ok((space, slots))
}

/// The daemon's periodic work, on one thread until `stop`. Automatic gc checks free space
/// four times a second (see `Fs::auto_gc_tick`; a check is one metadata read), so a fast
/// writer does not outrun it. The same thread publishes this slot's pending namespace
/// changes and reads the other slots' manifests once a second (a multi-slot space; nothing
/// otherwise), and gives idle request buffers and heap back.
fn start_maintenance(
    fs: Arc<Fs>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut tick = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // A writer of a full space asks to learn other nodes' removals at once.
            if fs.maintenance_pause(Duration::from_millis(250)) {
                fs.learn_removals();
            }
            fs.auto_gc_tick();
            // Repeated target warnings come out as one line per target per interval.
            if let Some(e) = fs.space().erasure() {
                e.flush_warnings();
            }
            tick += 1;
            if tick.is_multiple_of(4) {
                // Request buffers that waited in fuser's pool for a whole second (up to
                // 64 MiB after a burst of large writes) give their pages back.
                fuser::trim_idle_request_buffers();
                trim_heap();
                if let Err(e) = fs.publish_pending() {
                    log::warn!("publishing this slot's changes: {e}");
                }
                fs.learn_removals();
            }
        }
    })
}

/// The FUSE session's options for a mount of `backing` as `tuning` says.
fn fuse_config(backing: &Path, tuning: &Tuning, allow_other: bool) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("ckptfs:{}", backing.display())),
        fuser::MountOption::Subtype("ckptfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        // fuser mounts nosuid unless it sees Suid: set-user-ID files written by any user
        // of a checkpoint space do not gain privileges by exec unless the admin says so.
        if tuning.suid {
            fuser::MountOption::Suid
        } else {
            fuser::MountOption::NoSuid
        },
        if tuning.noexec {
            fuser::MountOption::NoExec
        } else {
            fuser::MountOption::Exec
        },
        if tuning.read_only {
            fuser::MountOption::RO
        } else {
            fuser::MountOption::RW
        },
    ];
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(tuning.threads as usize);
    config
}

/// Applies the mount's tuning to `space`: workers, the codec (recorded in the superblock),
/// the GPU stage, the cutter's confirmations; logs what the mount runs with.
fn configure_space(space: &mut Space, tuning: &Tuning) -> Result<(), CliError> {
    if let Some(w) = tuning.workers {
        space.set_workers(w as usize);
    }
    let codec = match &tuning.codec {
        Some(c) => c.clone(),
        // The GPU kernels the mount runs compress LZ4: asked for a GPU, a space whose
        // default is the float codec gets LZ4 (mixing codecs is fine: each chunk records
        // its own).
        None if matches!(tuning.gpu.as_str(), "on" | "emulate") => {
            log::info!(
                "--gpu {}: codec lz4 (the GPU stage compresses LZ4)",
                tuning.gpu
            );
            "lz4".to_string()
        }
        None if space
            .superblock()
            .features
            .contains(ckptfs_engine::format::Features::INCOMPAT_FLOAT_CODEC) =>
        {
            "float".to_string()
        }
        None => "lz4".to_string(),
    };
    let policy = ckptfs_engine::codec::Policy::parse(&codec)
        .ok_or_else(|| format!("unknown codec {codec:?}"))?;
    space
        .set_codec_policy(policy)
        .map_err(|e| format!("cannot record the codec in the superblock: {e}"))?;
    let gpu = choose_gpu(tuning, &codec)?;
    let compressor = gpu.as_ref().map_or("the CPU".to_string(), |g| g.describe());
    space.set_batch_codec(gpu);
    // A read-only mount writes no revision to predict, so it keeps no fingerprints.
    space.confirm_by_fingerprint(tuning.confirm_by_fingerprint && !tuning.read_only);
    space.follow_changes(tuning.follow_changes);
    // The cutter's search is chosen by measuring the candidates once (a few ms): here, at
    // mount, rather than inside the first write, and said, since it differs by CPU.
    let search = ckptfs_engine::write::gear_search();
    log::info!(
        "{} FUSE threads, {} store workers, codec {}, new chunks compressed on {compressor}, \
         cutter search {} ({})",
        tuning.threads,
        space.workers(),
        codec,
        search.name,
        search.measured
    );
    Ok(())
}

/// Raises the kernel's readahead for this mount to the request size we negotiated. The
/// kernel caps a FUSE mount's readahead at its block-device default (128 KiB), so without
/// this a sequential reader (a restart) gets its data in 128 KiB requests, each a round
/// trip through the daemon. The setting lives in sysfs (root only) and only sticks once the
/// kernel has processed the mount's INIT reply; a stat of the mountpoint waits for that.
fn set_readahead(mnt: &Path) {
    use std::os::unix::fs::MetadataExt;
    let dev = match std::fs::metadata(mnt) {
        Ok(m) => m.dev(),
        Err(e) => {
            log::warn!("cannot stat {} to set readahead: {e}", mnt.display());
            return;
        }
    };
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    let kb = fuse::MAX_WRITE_BYTES / 1024;
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => log::info!("readahead set to {kb} KiB ({path})"),
        Err(e) => log::info!("readahead left at the kernel default: cannot write {path}: {e}"),
    }
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
fn spawn_daemon(
    backing: &Path,
    mnt: &Path,
    allow_other: bool,
    tuning: &Tuning,
) -> Result<(), CliError> {
    // Refused here, before the daemon appends to the space's log.
    let sb = read_backing_dir(backing, !tuning.read_only).map_err(CliError::from)?;
    if sb.slots == 1 {
        check_not_locked(backing, tuning.read_only)?;
    } else if !tuning.read_only {
        slots::wait_for_own_exiting_daemon(backing, mnt)?;
    }
    // A read-only mount logs to the temporary directory, one file per space, so that
    // nothing in the backing directory changes.
    let log_path = if tuning.read_only {
        let uuid: String = sb.uuid[..8].iter().map(|b| format!("{b:02x}")).collect();
        std::env::temp_dir().join(format!("ckptfs-{uuid}-read-only.log"))
    } else {
        backing.join(ckptfs_engine::format::LOG_FILE)
    };
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(tuning.read_only)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().map_err(CliError::from)?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("--foreground").arg("--notify-ready");
    cmd.arg("--threads").arg(tuning.threads.to_string());
    if let Some(w) = tuning.workers {
        cmd.arg("--workers").arg(w.to_string());
    }
    if let Some(c) = &tuning.codec {
        cmd.arg("--codec").arg(c);
    }
    cmd.arg("--gpu").arg(&tuning.gpu);
    if !tuning.confirm_by_fingerprint {
        cmd.arg("--confirm").arg("blake3");
    }
    if !tuning.follow_changes {
        cmd.arg("--cuts").arg("content");
    }
    if let Some(d) = &tuning.cuda_lib_dir {
        cmd.arg("--cuda-lib-dir").arg(d);
    }
    if allow_other {
        cmd.arg("--allow-other");
    }
    if tuning.read_only {
        cmd.arg("--read-only");
    }
    if let Some(n) = tuning.slot {
        cmd.arg("--slot").arg(n.to_string());
    }
    if tuning.take_over {
        cmd.arg("--take-over");
    }
    if tuning.no_probe {
        cmd.arg("--no-probe");
    }
    cmd.arg("--lease")
        .arg(format!("{}ms", tuning.lease.as_millis()));
    let kernel: Vec<&str> = [(tuning.suid, "suid"), (tuning.noexec, "noexec")]
        .into_iter()
        .filter_map(|(on, o)| on.then_some(o))
        .collect();
    if !kernel.is_empty() {
        cmd.arg("-o").arg(kernel.join(","));
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
        if tuning.read_only {
            println!(
                "ckptfs: mounted {} at {} read-only (log: {})",
                backing.display(),
                mnt.display(),
                log_path.display()
            );
        } else {
            println!("ckptfs: mounted {} at {}", backing.display(), mnt.display());
        }
        return Ok(());
    }
    let _ = child.kill();
    let _ = child.wait();
    let log_text = std::fs::read(&log_path).unwrap_or_default();
    let tail = String::from_utf8_lossy(&log_text[(log_start as usize).min(log_text.len())..]);
    Err(format!("mount failed:\n{}", tail.trim_end()).into())
}

/// How long a mount waits for a daemon that was unmounted but is still exiting (committing
/// what was open, closing the metadata table) to let go of the space.
pub(crate) const EXITING_HOLDER_WAIT: Duration = Duration::from_secs(30);

/// How long a mount waits for an exiting daemon before it says so.
pub(crate) const EXITING_HOLDER_NOTICE: Duration = Duration::from_secs(2);

/// Refuses a space another process holds before a daemon is started for it, so the refusal
/// leaves even the space's log untouched. The daemon's own lock is what really excludes a
/// second mount; this only makes the common case quiet and clear. A holder that is a
/// daemon whose mount is already gone (an unmount just returned, or `umount -l`) is exiting:
/// waited for, up to `EXITING_HOLDER_WAIT`, saying so, instead of refused.
fn check_not_locked(backing: &Path, read_only: bool) -> Result<(), CliError> {
    use std::os::unix::io::AsRawFd;
    // A read-only mount shares the space with other read-only ones: it probes for a
    // read-write holder only. A read-write mount probes for any holder.
    let want = if read_only {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
    let path = backing.join(ckptfs_engine::format::LOCK_FILE);
    let started = Instant::now();
    let deadline = started + EXITING_HOLDER_WAIT;
    let mut said = false;
    loop {
        let f = std::fs::File::open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: flock on an open descriptor; the probe's lock is released when `f` closes.
        if unsafe { libc::flock(f.as_raw_fd(), want | libc::LOCK_NB) } == 0 {
            if said {
                eprintln!("ckptfs: the previous daemon has exited");
            }
            return Ok(());
        }
        // SAFETY: as above.
        if !read_only && unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return Err(CliError::Engine(ckptfs_engine::Error::Locked(format!(
                "backing space {} is mounted read-only by another ckptfs process; unmount \
                 that first",
                backing.display()
            ))));
        }
        let holder = lock_holder(backing).unwrap_or_default();
        let holder = holder.trim();
        // "pid N mounted at MOUNTPOINT": exiting when MOUNTPOINT no longer mounts this space.
        let exiting = holder
            .split_once(" mounted at ")
            .is_some_and(|(_, m)| !mounts_space(Path::new(m), backing));
        if !exiting || Instant::now() >= deadline {
            return Err(CliError::Engine(ckptfs_engine::Error::Locked(format!(
                "backing space {} is in use by another ckptfs process ({holder}){}",
                backing.display(),
                if exiting {
                    format!("; it was unmounted but has not exited after {EXITING_HOLDER_WAIT:?}")
                } else {
                    String::new()
                }
            ))));
        }
        // A mount right after an unmount usually waits a few milliseconds: said only when
        // the wait is long enough to notice (a successful mount is otherwise quiet).
        if !said && started.elapsed() >= EXITING_HOLDER_NOTICE {
            eprintln!(
                "ckptfs: waiting for the daemon that held {} to exit ({holder}, unmounted)",
                backing.display()
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A space an offline command opened itself, or the mountpoint of the live daemon that holds
/// it (the command then goes through that daemon).
pub(crate) enum Opened<T> {
    Here(T),
    Through(PathBuf),
}

/// Opens the space in `dir` with `open` for an offline command (`check`, `gc`, `stats`, ...).
/// When another process holds it: a daemon still mounted there is answered as `Through` its
/// mountpoint; a daemon whose mount is already gone (`fusermount3 -u` returns before the
/// daemon has committed and exited) is waited for as a mount waits (`check_not_locked`), then
/// the space is opened here. Before, such a command went "through" a mountpoint that was no
/// longer a ckptfs mount and failed with the mountpoint's ENODATA. Any other holder (an
/// offline command) is the engine's message.
pub(crate) fn open_or_through<T>(
    dir: &Path,
    read_only: bool,
    open: impl Fn() -> Result<T, ckptfs_engine::Error>,
) -> Result<Opened<T>, CliError> {
    let mut waited = false;
    loop {
        match open() {
            Ok(s) => return Ok(Opened::Here(s)),
            Err(ckptfs_engine::Error::Locked(m)) => {
                let holder = lock_holder(dir).unwrap_or_default();
                let Some(mnt) = holder.split(" mounted at ").nth(1).map(str::trim) else {
                    return Err(CliError::from(m));
                };
                let mnt = PathBuf::from(mnt);
                if mounts_space(&mnt, dir) {
                    return Ok(Opened::Through(mnt));
                }
                if waited {
                    return Err(CliError::from(m));
                }
                check_not_locked(dir, read_only)?;
                waited = true;
            }
            Err(e) => return Err(CliError::from(e.to_string())),
        }
    }
}

/// Whether `mnt` is a ckptfs mount of the space in backing directory `dir` (see
/// `same_space`).
pub(crate) fn mounts_space(mnt: &Path, dir: &Path) -> bool {
    backing_of(mnt).is_some_and(|b| same_space(&b, dir))
}

/// Whether backing directories `a` and `b` are one space: the same path, or the same
/// superblock uuid (one space reached by two paths: a symlink, two clients of a shared
/// filesystem), so that a daemon mounted through one path is not taken for an exiting one
/// by a command given the other.
pub(crate) fn same_space(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (read_backing_dir(a, false), read_backing_dir(b, false)),
            (Ok(x), Ok(y)) if x.uuid == y.uuid
        )
}

/// How long a mount waits for another live node to echo its coherence probe (each node
/// answers within `PROBE_ANSWER_INTERVAL` of the probe's write, for each probe in turn).
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// How often a node reads the other slots' hints to echo their coherence probes: from its
/// claim on, so nodes that mount at the same moment answer each other while they set up
/// (before, answering began only once the mount was ready, and nodes started within a
/// second or so of each other all failed their probes). One 128-byte read a slot.
const PROBE_ANSWER_INTERVAL: Duration = Duration::from_millis(100);

/// Echoes the other nodes' coherence probes for as long as this mount holds `lease` (the
/// thread ends when the space drops it, or the lease is released or lost).
fn answer_probes_while_held(lease: &Arc<ckptfs_engine::slots::Lease>) {
    let held = Arc::downgrade(lease);
    std::thread::spawn(move || {
        while let Some(l) = held.upgrade() {
            let r = l
                .table()
                .hints()
                .and_then(|h| l.answer_probes(&h).map_err(Into::into));
            if let Err(e) = r {
                if l.fenced().is_some() {
                    return;
                }
                log::debug!("answering the other nodes' coherence probes: {e}");
            }
            drop(l);
            std::thread::sleep(PROBE_ANSWER_INTERVAL);
        }
    });
}

/// Refuses a mountpoint that is the backing directory, inside it or above it: the daemon
/// reads and writes its backing files by path, and with the mount over them each such call
/// would come back into the daemon itself (the first create hung for good while the kernel
/// held the directory's lock), or hide them from the daemon.
fn check_apart(backing: &Path, mnt: &Path) -> Result<(), CliError> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (b, m) = (real(backing), real(mnt));
    let why = if b == m {
        "is the backing directory itself"
    } else if m.starts_with(&b) {
        "is inside the backing directory"
    } else if b.starts_with(&m) {
        "is above the backing directory (the mount would hide it from the daemon)"
    } else {
        return Ok(());
    };
    Err(format!(
        "the mountpoint {} {why} ({}): mount the space somewhere outside it, e.g. \
         `ckptfs mount {} /ckpt`",
        mnt.display(),
        backing.display(),
        backing.display()
    )
    .into())
}

/// What a new space reserved for chunks, as `df`, `stats` and `ckptfs slots` will report it:
/// whole segments (a size that is not a multiple of one is rounded down), and of a
/// multi-slot space each slot's share less its manifest area.
fn reserved_words(dir: &Path, asked: u64) -> Result<String, CliError> {
    use ckptfs_engine::format::SlotId;
    let sb = read_backing_dir(dir, false).map_err(CliError::from)?;
    let seg = sb.segment_bytes as u64;
    let rounded = match sb.segments() * seg == asked {
        true => String::new(),
        false => format!(
            "; {} asked, rounded down to whole {} segments",
            human(asked),
            human(seg)
        ),
    };
    if sb.slots <= 1 {
        return Ok(format!("{} reserved{rounded}", human(sb.segments() * seg)));
    }
    let shares: Vec<u64> = (0..sb.slots)
        .map(|i| {
            let r = sb.slot_segments(SlotId(i));
            (r.end - r.start) * seg
        })
        .collect();
    let (lo, hi) = (
        *shares.iter().min().expect("slots"),
        *shares.iter().max().expect("slots"),
    );
    let each = match lo == hi {
        true => human(lo),
        false => format!("{} to {}", human(lo), human(hi)),
    };
    Ok(format!(
        "{} slots of {each} each for chunks, {} in all with their manifest areas{rounded}",
        sb.slots,
        human(sb.segments() * seg)
    ))
}

/// Whether process `pid` still runs: it exists and has not exited. An exited daemon stays a
/// zombie until its parent reaps it, and a daemon `mount` started in the background has
/// init (or a container's first process) for a parent, which may reap it seconds later: an
/// idle unmount took 2 s waiting for that.
fn process_runs(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks whether the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    // /proc/PID/stat: "pid (comm) state ...", comm may hold spaces and parentheses.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(st) => st
            .rfind(')')
            .and_then(|i| st[i + 1..].split_whitespace().next())
            .is_none_or(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn mounted_at(mnt: &Path) -> bool {
    backing_of(mnt).is_some()
}

fn umount(mnt: &Path) -> Result<(), CliError> {
    let mnt = absolute(mnt);
    if !mounted_at(&mnt) {
        return Err(format!("{} is not a ckptfs mount", mnt.display()).into());
    }
    // Asked of the daemon itself; else from the space's lock file, found through the
    // mount's fsname (a daemon from before the "pid" control request).
    let pid = control_get(&mnt, "pid", true)
        .ok()
        .and_then(|v| v.as_i64())
        .map(|p| p as i32)
        .or_else(|| daemon_pid(&mnt));
    // Everything committed, durable and published before the unmount, or said why not
    // (the daemon's own exit status does not reach this process). A daemon from before
    // this request answers nothing: its unmount logs what it could not do.
    let not_durable = match control_get(&mnt, "sync", true) {
        Ok(v) if v["ok"] == false => Some(v["error"].as_str().unwrap_or("unknown").to_string()),
        _ => None,
    };
    let status = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .or_else(|_| Command::new("umount").arg(&mnt).status())
        .map_err(|e| format!("cannot run fusermount3 or umount: {e}"))?;
    if !status.success() {
        return Err(format!("unmounting {} failed (files still open?)", mnt.display()).into());
    }
    if let Some(pid) = pid {
        let start = Instant::now();
        while process_runs(pid) {
            if start.elapsed() > UMOUNT_TIMEOUT {
                return Err(format!("daemon {pid} did not exit after unmount").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    match not_durable {
        Some(why) => Err(format!(
            "unmounted {}, but not everything is durable: {why}; what was closed before \
             the failure is (`ckptfs check` tells what the space holds)",
            mnt.display()
        )
        .into()),
        None => Ok(()),
    }
}

pub(crate) fn backing_of(mnt: &Path) -> Option<PathBuf> {
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

/// Whether the mount at `mnt` is read-only (its `ro` mount flag, from mountinfo).
fn is_read_only_mount(mnt: &Path) -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.to_string_lossy();
    s.lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 5 && f[4] == want)
        .is_some_and(|f| f[5].split(',').any(|o| o == "ro"))
}

fn daemon_pid(mnt: &Path) -> Option<i32> {
    let holder = lock_holder(&backing_of(mnt)?)?;
    holder.split_whitespace().nth(1)?.parse().ok()
}

pub(crate) fn stats_json(s: &Stats) -> serde_json::Value {
    serde_json::to_value(StatsReport::from(s.clone())).expect("stats serialize")
}

fn stats_from_json(v: &serde_json::Value) -> Option<Stats> {
    serde_json::from_value::<StatsReport>(v.clone())
        .ok()
        .map(|r| r.stats)
}

/// Stats from a mount (through an xattr the daemon answers) or a backing directory (read
/// directly when unmounted; through its mount when mounted).
fn read_stats(path: &Path) -> Result<Stats, CliError> {
    let path = absolute(path);
    let from_mount = |mnt: &Path| -> Result<Stats, CliError> {
        let c =
            std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).map_err(CliError::from)?;
        let name = c"user.ckptfs.stats";
        let mut buf = vec![0u8; 16384];
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
            )
            .into());
        }
        let v: serde_json::Value =
            serde_json::from_slice(&buf[..n as usize]).map_err(CliError::from)?;
        Ok(stats_from_json(&v).ok_or_else(|| "malformed stats from the daemon".to_string())?)
    };
    if path.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        // Read-only: stats of an unmounted (or read-only mounted) space change nothing.
        return match open_or_through(&path, true, || Space::open_as(&path, &Mode::ReadOnly))? {
            Opened::Here(space) => space.stats().map_err(CliError::from),
            Opened::Through(mnt) => from_mount(&mnt),
        };
    }
    if backing_of(&path).is_none() {
        return Err(not_a_space(&path));
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

/// A ratio as `2.50x`, or `-` with why when there is nothing to compare.
fn ratio_text(r: Option<f64>, none: &str) -> String {
    match r {
        Some(r) => format!("{r:.2}x"),
        None => format!("- ({none})"),
    }
}

fn print_stats(s: &Stats) {
    println!("logical bytes      {}", human(s.logical_bytes));
    println!("stored bytes       {}", human(s.stored_bytes));
    println!(
        "dedup ratio        {}",
        ratio_text(s.dedup_ratio(), "no current file holds data")
    );
    println!(
        "compression ratio  {}",
        ratio_text(s.compression_ratio(), "nothing stored")
    );
    println!("chunks             {}", s.chunks);
    println!("files              {}", s.files);
    println!("directories        {}", s.dirs);
    println!("revisions          {}", s.revisions);
    println!("reserved space     {}", human(s.reserved_bytes));
    println!("free space         {}", human(s.free_bytes));
    // Where the used space is, by what would give it back (engine/src/usage.rs).
    let u = &s.split;
    println!("used space         {}, of it:", human(s.used_bytes));
    println!("  live             {} (current files)", human(u.live_bytes));
    println!(
        "  kept revisions   {} ({} older revisions of present files; retention keeps them)",
        human(u.kept_revision_bytes),
        u.kept_revisions
    );
    println!(
        "  removed files    {} ({} revisions of {} removed files, the trash; emptied oldest \
         first when writers need room, or by `ckptfs gc --empty-trash`)",
        human(u.trash_bytes),
        u.trash_revisions,
        u.trash_files
    );
    println!(
        "  reclaimable      {} (holding no referenced chunk; gc gives it back)",
        human(s.reclaimable_bytes() + u.unreferenced_bytes)
    );
    if s.gc.runs > 0 {
        println!(
            "gc since mount     {} runs, {} revisions dropped, {} freed, {} copied, {:.1}s",
            s.gc.runs,
            s.gc.revisions_dropped,
            human(s.gc.bytes_freed),
            human(s.gc.bytes_copied),
            s.gc.seconds
        );
    }
    // The data path's stages since the mount (`stages` in --json; README "stages"): what
    // the daemon's time went to, wall and estimated CPU, summed over threads.
    let busy: Vec<_> = s
        .stages
        .iter()
        .filter(|t| t.seconds >= 0.01 || t.cpu_seconds >= 0.01)
        .collect();
    if !busy.is_empty() {
        println!("data path since mount (wall / CPU seconds summed over threads, bytes):");
        for t in busy {
            println!(
                "  {:<14} {:>9.2} s {:>9.2} s  {}",
                t.name,
                t.seconds,
                t.cpu_seconds,
                human(t.bytes)
            );
        }
    }
    if s.carries.spills > 0 {
        println!(
            "carried chunks     {} in memory, {} spilled now; {} spills ({}) since mount",
            human(s.carries.resident_bytes),
            human(s.carries.spilled_now_bytes),
            s.carries.spills,
            human(s.carries.spilled_bytes)
        );
    }
    if s.failed {
        // A daemon of an older build gives no reason.
        let why = s
            .failure
            .as_deref()
            .unwrap_or("a backing write or sync failed");
        println!("STATE              FAILED (writes refused until remount): {why}");
    }
    if s.backing_full {
        println!(
            "STATE              BACKING FULL: the backing filesystem has no room for the \
             metadata table to grow; new data gets ENOSPC until room is freed there"
        );
    }
}

/// The targets' lines of `ckptfs stats` (a space over several targets): their state, a
/// missing-mirror warning, and the revisions' redundancy.
fn print_targets(
    t: Option<&ckptfs_engine::targets::TargetsReport>,
    red: Option<&ckptfs_engine::space::RevisionRedundancy>,
) {
    if let Some(t) = t {
        println!("{}", targets::summary_line(t));
        if let Some(w) = targets::mirror_warning(t) {
            println!("{w}");
        }
    }
    if let Some(r) = red {
        println!("{}", targets::redundancy_line(r));
    }
}

/// `ckptfs stats`: of a mount or a backing directory, as text, JSON or Prometheus.
fn cmd_stats(path: &Path, json: bool, prometheus: bool) -> Result<(), CliError> {
    // A space over several targets: whether its data has full redundancy now, and
    // each target's errors since the mount; and what redundancy each revision has
    // (a pass over the extent table). Of a multi-slot space's mount: that slot's.
    let targets_of = |path: &Path| {
        let t = targets::report(path).unwrap_or_else(|e| {
            eprintln!("ckptfs: the targets' state could not be read: {e}");
            None
        });
        let red = match t.is_some() && !prometheus {
            true => targets::redundancy(path).unwrap_or_else(|e| {
                eprintln!("ckptfs: the revisions' redundancy could not be read: {e}");
                None
            }),
            false => None,
        };
        (t, red)
    };
    // A multi-slot space: what the mount's own slot holds, then every slot's line
    // and the whole space's totals from the slot headers. Of its backing directory,
    // only the latter (each slot's table is its node's).
    let abs = absolute(path);
    let backing = match abs.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        true => Some(abs.clone()),
        false => backing_of(&abs),
    };
    let multi = backing
        .as_deref()
        .filter(|b| !prometheus && slots::is_multi_slot(b));
    if let Some(b) = multi {
        // Of the backing directory itself: no mount of its own to ask, and what this
        // host's exiting daemons commit last is in the figures once they let go.
        let offline = b == abs.as_path();
        if offline {
            slots::wait_for_exiting_daemons(b)?;
        }
        let summary = slots::summary(b)?;
        let own = match offline {
            true => None,
            false => Some(read_stats(path)?),
        };
        let (t, red) = match own.is_some() {
            true => targets_of(path),
            false => (None, None),
        };
        if json {
            let mut v = own.as_ref().map_or(serde_json::json!({}), stats_json);
            if let Some(t) = &t {
                v["targets"] = serde_json::to_value(t).unwrap_or_default();
            }
            if let Some(r) = &red {
                v["revision_redundancy"] = serde_json::to_value(r).unwrap_or_default();
            }
            v["slots"] = summary["slots"].clone();
            v["space"] = summary["space"].clone();
            println!("{v}");
        } else {
            if let Some(s) = &own {
                print_stats(s);
            }
            print_targets(t.as_ref(), red.as_ref());
            slots::print_summary(&summary);
        }
        return Ok(());
    }
    let s = read_stats(path)?;
    let (t, red) = targets_of(path);
    if json {
        let mut v = stats_json(&s);
        if let Some(t) = &t {
            v["targets"] = serde_json::to_value(t).unwrap_or_default();
        }
        if let Some(r) = &red {
            v["revision_redundancy"] = serde_json::to_value(r).unwrap_or_default();
        }
        println!("{v}");
    } else if prometheus {
        print!(
            "{}",
            metrics::prometheus(&s, t.as_ref(), &absolute(path).to_string_lossy())
        );
    } else {
        print_stats(&s);
        print_targets(t.as_ref(), red.as_ref());
    }
    Ok(())
}

/// `ckptfs format` (`c` is a `Cmd::Format`).
fn cmd_format(c: Cmd) -> Result<(), CliError> {
    let Cmd::Format {
        dir,
        size,
        chunk_size,
        force,
        slots,
        targets,
        redundancy,
        codec,
        retention,
    } = c
    else {
        unreachable!("cmd_format of another command")
    };
    let mark_codec = |dir: &Path| -> Result<(), CliError> {
        if codec == "float" {
            ckptfs_engine::space::mark_features(
                dir,
                ckptfs_engine::format::Features::INCOMPAT_FLOAT_CODEC,
            )
            .map_err(|e| format!("cannot record the codec in the superblock: {e}"))?;
        }
        Ok(())
    };
    let chunk = u32::try_from(chunk_size).map_err(|_| {
        format!("chunk size must be a power of two between 4 KiB and 4 MiB, got {chunk_size} bytes")
    })?;
    let mut config = Config::default();
    retention.apply(&mut config);
    // Erasing a single-slot space right after a plain unmount waits for its exiting
    // daemon, as a mount does (a live one is refused by the lock, as before).
    let abs = absolute(&dir);
    if force
        && abs.join(ckptfs_engine::format::LOCK_FILE).exists()
        && read_backing_dir(&abs, false).is_ok_and(|sb| sb.slots == 1)
    {
        check_not_locked(&abs, false)?;
    }
    // (--redundancy without --target is refused by the parser.)
    if !targets.is_empty() {
        // Without --redundancy: no parity, each segment on one target.
        let r = redundancy.unwrap_or(ckptfs_engine::targets::Redundancy { data: 1, parity: 0 });
        Space::format_targets(&dir, size, chunk, config, force, &targets, r, slots)
            .map_err(CliError::from)?;
        mark_codec(&dir)?;
        println!(
            "ckptfs: formatted {} ({}) over {} targets, redundancy {r}: any {} may be \
             lost",
            dir.display(),
            reserved_words(&dir, size)?,
            targets.len(),
            r.parity
        );
        return Ok(());
    }
    Space::format_slots(&dir, size, chunk, config, force, slots).map_err(CliError::from)?;
    mark_codec(&dir)?;
    println!(
        "ckptfs: formatted {} ({})",
        dir.display(),
        reserved_words(&dir, size)?
    );
    Ok(())
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        c @ Cmd::Format { .. } => cmd_format(c),
        Cmd::Slots { dir, json } => slots::run(&absolute(&dir), json),
        Cmd::Targets { path, json } => targets::run(&path, json),
        Cmd::Scrub {
            path,
            throttle,
            json,
        } => targets::scrub(&path, throttle, json),
        Cmd::Recover {
            backing,
            from,
            force,
            json,
        } => {
            let r = ckptfs_engine::space::recover(&absolute(&backing), &absolute(&from), force)
                .map_err(CliError::from)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&r).map_err(|e| format!("serialize: {e}"))?
                );
            } else {
                println!(
                    "recovered {} from the metadata mirror on target {} ({}), targets table \
                     generation {}; mount it as before",
                    absolute(&backing).display(),
                    r.holder,
                    r.holder_dir.display(),
                    r.generation
                );
            }
            Ok(())
        }
        Cmd::Advise {
            path,
            node_mtbf,
            nodes,
            restart,
            commit,
            drop_in,
            mtbf_after,
            json,
        } => advise::run(
            &path,
            &advise::Args {
                node_mtbf: node_mtbf.as_deref(),
                nodes,
                restart: restart.as_deref(),
                commit: commit.as_deref(),
                drop_in: drop_in.as_deref(),
                mtbf_after: mtbf_after.as_deref(),
                json,
            },
        ),
        Cmd::Rebuild {
            path,
            replace,
            throttle,
            json,
        } => targets::rebuild(&path, replace.as_deref(), throttle, json),
        Cmd::Mount {
            paths,
            foreground,
            allow_other,
            threads,
            workers,
            codec,
            gpu,
            confirm,
            cuts,
            cuda_lib_dir,
            read_only,
            options,
            slot,
            lease,
            take_over,
            no_probe,
            notify_ready,
        } => {
            if foreground {
                block_termination_signals();
            }
            let mut tuning = Tuning {
                threads,
                workers,
                codec,
                gpu,
                confirm_by_fingerprint: confirm == "fingerprint",
                follow_changes: cuts == "follow",
                cuda_lib_dir,
                read_only,
                suid: false,
                noexec: false,
                slot,
                lease,
                take_over,
                no_probe,
            };
            let mut allow_other = allow_other;
            if let Some(o) = &options {
                apply_mount_options(o, &mut tuning, &mut allow_other)?;
            }
            mount(paths, foreground, allow_other, tuning, notify_ready)
        }
        Cmd::Umount { mountpoint } => umount(&mountpoint),
        Cmd::Config {
            path,
            retention,
            json,
        } => cmd_config(&path, &retention, json),
        Cmd::Gc {
            path,
            dry_run,
            empty_trash,
            json,
        } => cmd_gc(&path, dry_run, empty_trash, json),
        Cmd::Revisions { path, space, json } => cmd_revisions(&path, space.as_deref(), json),
        Cmd::Report { path, space, svg } => cmd_report(&path, space.as_deref(), &svg),
        Cmd::Restore {
            path,
            space,
            revision,
            to,
        } => cmd_restore(&path, space.as_deref(), revision, to.as_deref()),
        Cmd::Check { .. } => Err("check sets its own exit status; it is run from main".into()),
        Cmd::Generate { what } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            match what {
                Generate::Man { dir } => {
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                    Ok(clap_mangen::generate_to(cmd, &dir)
                        .map_err(|e| format!("cannot write man pages to {}: {e}", dir.display()))?)
                }
                Generate::Completions { shell } => {
                    clap_complete::generate(shell, &mut cmd, "ckptfs", &mut std::io::stdout());
                    Ok(())
                }
            }
        }
        Cmd::Stats {
            path,
            json,
            prometheus,
        } => cmd_stats(&path, json, prometheus),
    }
}

/// Applies `-o` mount options (see the flag's help) over the flags' values.
fn apply_mount_options(
    options: &str,
    tuning: &mut Tuning,
    allow_other: &mut bool,
) -> Result<(), CliError> {
    const KNOWN: &str = "ro, rw, allow_other, threads=N, workers=N, codec=lz4|shuffle|float, \
                         gpu=auto|on|off|emulate, confirm=fingerprint|blake3, cuts=follow|content, cuda_lib_dir=DIR, slot=N, lease=DURATION, nosuid, \
                         noexec, suid, exec";
    for o in options.split(',').filter(|o| !o.is_empty()) {
        let (key, val) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o, None),
        };
        let number = |max: u32, min: u32| -> Result<u32, CliError> {
            Ok(val
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| format!("mount option {o:?}: {key} takes a number {min}..={max}"))?)
        };
        let one_of = |allowed: &[&str]| -> Result<String, CliError> {
            Ok(val
                .filter(|v| allowed.contains(v))
                .map(str::to_string)
                .ok_or_else(|| {
                    format!("mount option {o:?}: {key} is one of {}", allowed.join(", "))
                })?)
        };
        match (key, val) {
            ("ro", None) => tuning.read_only = true,
            ("rw", None) => tuning.read_only = false,
            ("allow_other", None) => *allow_other = true,
            ("nosuid", None) => tuning.suid = false,
            ("suid", None) => tuning.suid = true,
            ("noexec", None) => tuning.noexec = true,
            ("exec", None) => tuning.noexec = false,
            ("threads", _) => tuning.threads = number(64, 1)?,
            ("workers", _) => tuning.workers = Some(number(64, 0)?),
            ("codec", _) => tuning.codec = Some(one_of(&["lz4", "shuffle", "float"])?),
            ("gpu", _) => tuning.gpu = one_of(&["auto", "on", "off", "emulate"])?,
            ("confirm", _) => {
                tuning.confirm_by_fingerprint = one_of(&["fingerprint", "blake3"])? == "fingerprint"
            }
            ("cuts", _) => tuning.follow_changes = one_of(&["follow", "content"])? == "follow",
            ("cuda_lib_dir", Some(d)) if !d.is_empty() => tuning.cuda_lib_dir = Some(d.into()),
            ("slot", _) => tuning.slot = Some(number(u32::MAX, 0)?),
            ("lease", Some(d)) => {
                tuning.lease = parse_lease(d).map_err(|e| format!("mount option {o:?}: {e}"))?
            }
            // Consumed by mount(8), fstab or the kernel's VFS, or meaningless for a FUSE
            // daemon (nodev: ckptfs always mounts nodev; atime: ckptfs keeps its own).
            (
                "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "owner" | "group"
                | "nofail" | "_netdev" | "dev" | "nodev" | "atime" | "noatime" | "relatime"
                | "norelatime" | "strictatime" | "nostrictatime" | "diratime" | "nodiratime"
                | "lazytime" | "nolazytime" | "async",
                None,
            ) => {}
            ("comment", Some(_)) => {}
            (k, _) if k.starts_with("x-") => {}
            _ => return Err(format!("unknown mount option {o:?} (known: {KNOWN})").into()),
        }
    }
    Ok(())
}

/// mount(8) runs `mount.fuse3 SOURCE MOUNTPOINT -o OPTS` for `-t fuse.ckptfs` (and fstab
/// lines of that type), which runs `ckptfs SOURCE MOUNTPOINT -o OPTS`: the mount command
/// without its name. Such a command line (a first argument that is neither a flag nor a
/// subcommand, and is a path or comes with `-o`) is read as `ckptfs mount ...`. A mistyped
/// subcommand (`ckptfs stat /ckpt x`) is left to clap, which names the right one.
fn helper_args(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    let Some(first) = args.get(1).and_then(|a| a.to_str().map(str::to_string)) else {
        return args;
    };
    let cmd = Cli::command();
    let known = first.starts_with('-')
        || first == "help"
        || cmd
            .get_subcommands()
            .any(|c| c.get_name() == first || c.get_all_aliases().any(|a| a == first));
    let helper_like = first.contains('/') || args.iter().any(|a| a == "-o");
    if known || !helper_like || args.len() < 3 {
        return args;
    }
    let mut out = Vec::with_capacity(args.len() + 1);
    out.push(args[0].clone());
    out.push("mount".into());
    out.extend(args[1..].iter().cloned());
    out
}

fn parse_target(s: &str) -> Result<ckptfs_engine::targets::TargetSpec, CliError> {
    let mut t = ckptfs_engine::targets::TargetSpec::parse(s)?;
    // Recorded absolute: the daemon and offline commands open it from anywhere.
    t.path = absolute(&t.path);
    Ok(t)
}

fn parse_redundancy(s: &str) -> Result<ckptfs_engine::targets::Redundancy, CliError> {
    Ok(ckptfs_engine::targets::Redundancy::parse(s)?)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("ckptfs=warn"))
        .init();
    let cli = Cli::parse_from(helper_args(std::env::args_os().collect()));
    // Rust ignores SIGPIPE, so `ckptfs targets | head` would panic in println! once head
    // exits. Commands that print die quietly instead, as other command-line tools do; the
    // daemon keeps ignoring it (a closed log pipe must not take the mount down).
    if !matches!(cli.cmd, Cmd::Mount { .. }) {
        // SAFETY: restoring the default disposition of a signal, before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // check has three outcomes (clean, damaged, could not check), so it picks its own status.
    if let Cmd::Check { path, json } = &cli.cmd {
        return check::run(path, *json);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ckptfs: {e}");
            e.exit_code()
        }
    }
}

/// Where a command acts: through a mount's daemon (control xattrs on its root), or directly
/// on an unmounted backing directory.
enum Target {
    Mounted { mnt: PathBuf },
    Offline { fs: Box<Fs> },
}

/// The target for a backing directory (through its mount when it is mounted).
fn space_target(dir: &Path) -> Result<Target, CliError> {
    Ok(
        match open_or_through(dir, false, || Space::open_as(dir, &Mode::Offline))? {
            Opened::Here(space) => Target::Offline {
                fs: Box::new(Fs::new(space)),
            },
            Opened::Through(mnt) => Target::Mounted { mnt },
        },
    )
}

/// A mountpoint or a backing directory.
fn target_of(path: &Path) -> Result<Target, CliError> {
    let path = absolute(path);
    if path.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() {
        return space_target(&path);
    }
    if backing_of(&path).is_some() {
        return Ok(Target::Mounted { mnt: path });
    }
    Err(not_a_space(&path))
}

/// A path that is neither a mount nor a backing directory: `exit::NOT_A_SPACE`.
fn not_a_space(path: &Path) -> CliError {
    CliError::Engine(ckptfs_engine::Error::NotASpace(format!(
        "{} is neither a ckptfs mountpoint nor a backing directory",
        path.display()
    )))
}

/// The ckptfs mount holding `path` (which need not exist) and the path relative to it.
fn locate_in_mount(path: &Path) -> Result<(PathBuf, Vec<u8>), CliError> {
    let abs = absolute(path);
    let mut probe = abs.clone();
    loop {
        if backing_of(&probe).is_some() {
            let rel = abs.strip_prefix(&probe).map_err(CliError::from)?;
            return Ok((probe, rel.as_os_str().as_encoded_bytes().to_vec()));
        }
        if !probe.pop() {
            return Err(format!("{} is not inside a ckptfs mount", abs.display()).into());
        }
    }
}

fn xattr_name(op: &str) -> std::ffi::CString {
    std::ffi::CString::new(format!("{}{op}", fuse::CONTROL_PREFIX)).expect("no NUL")
}

fn cpath(p: &Path) -> Result<std::ffi::CString, CliError> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(CliError::from)
}

fn control_set(mnt: &Path, op: &str, value: &[u8]) -> Result<(), CliError> {
    let (p, n) = (cpath(mnt)?, xattr_name(op));
    // SAFETY: valid C strings and a readable value buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) && op != "select" {
            return Err(format!(
                "{op}: {e}: only root and the owner of the mount's root directory ({}) may \
                 run gc, restore in place or change the config",
                mnt.display()
            )
            .into());
        }
        return Err(format!("{}: {e}", op_word(op)).into());
    }
    Ok(())
}

/// The command a control request serves, as users name it (a listing goes page by page
/// through requests named after the last revision seen).
fn op_word(op: &str) -> &str {
    match op.strip_prefix(fuse::REVISIONS_AFTER) {
        Some(_) => "revisions",
        None => op,
    }
}

/// The last control request's failure as a sentence.
fn control_error(op: &str) -> String {
    let op = op_word(op);
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EXDEV) {
        // A shared namespace: the file is another slot's, which keeps its revisions.
        return format!("{op}: {CROSS_SLOT}: run this through a mount of that slot");
    }
    format!("{op}: {e}")
}

/// Reads a control answer. `probe` first asks for the size, which makes the daemon compute
/// the answer; without it the daemon returns the answer of this process's last request.
fn control_get(mnt: &Path, op: &str, probe: bool) -> Result<serde_json::Value, CliError> {
    let (p, n) = (cpath(mnt)?, xattr_name(op));
    let mut len = 65536;
    if probe {
        // SAFETY: a size query writes nothing.
        let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        if r < 0 {
            return Err(CliError::from(control_error(op)));
        }
        len = r as usize;
    }
    let mut buf = vec![0u8; len.max(1)];
    // SAFETY: getxattr writes at most buf.len() bytes into buf.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(CliError::from(control_error(op)));
    }
    Ok(serde_json::from_slice(&buf[..r as usize])
        .map_err(|e| format!("{}: bad answer: {e}", op_word(op)))?)
}

fn cmd_config(path: &Path, r: &RetentionArgs, json: bool) -> Result<(), CliError> {
    // Each setting is valid or not on its own, so checking them over the defaults refuses a
    // bad value before anything is opened (an offline open rewrites the lock file), and with
    // the engine's message rather than the daemon's bare EINVAL.
    let mut proposed = Config::default();
    r.apply(&mut proposed);
    proposed.validate().map_err(CliError::from)?;
    let c = match target_of(path)? {
        Target::Mounted { mnt } => {
            if !r.is_empty() {
                control_set(&mnt, "config", r.to_pairs().as_bytes())?;
            }
            let v = control_get(&mnt, "config", true)?;
            let g = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            Config {
                keep_revisions: g("keep_revisions"),
                keep_age_secs: g("keep_age_secs"),
                keep_unlinked_secs: g("keep_unlinked_secs"),
                auto_gc_free_percent: g("auto_gc_free_percent"),
            }
        }
        Target::Offline { fs } => {
            let mut c = fs.space().config().map_err(CliError::from)?;
            if !r.is_empty() {
                r.apply(&mut c);
                fs.space().set_config(&c).map_err(CliError::from)?;
            }
            c
        }
    };
    if json {
        println!("{}", config_json(&c));
    } else {
        let age = |s: u64| {
            if s == 0 {
                "off".to_string()
            } else {
                format!("{s}s")
            }
        };
        println!("keep revisions        {}", c.keep_revisions);
        println!("keep younger than     {}", age(c.keep_age_secs));
        println!("keep unlinked for     {}", age(c.keep_unlinked_secs));
        println!(
            "automatic gc below    {}",
            if c.auto_gc_free_percent == 0 {
                "off".to_string()
            } else {
                format!("{}% free", c.auto_gc_free_percent)
            }
        );
    }
    Ok(())
}

fn progress_bar(enabled: bool) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = indicatif::ProgressBar::new(0);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {msg:24} [{bar:30}] {pos}/{len} {elapsed}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(120));
    Some(pb)
}

fn cmd_gc(path: &Path, dry_run: bool, empty_trash: bool, json: bool) -> Result<(), CliError> {
    let opts = GcOptions {
        dry_run,
        empty_trash,
        ..GcOptions::default()
    };
    let abs = absolute(path);
    if abs.join(ckptfs_engine::format::SUPERBLOCK_FILE).exists() && slots::is_multi_slot(&abs) {
        // Every slot ever claimed that no live mount holds, one after the other.
        let done = slots::for_each_offline_slot(&abs, "gc", |space| {
            Fs::new(space)
                .gc_with(opts.clone(), &mut |_| {})
                .map(|r| serde_json::to_value(&r).expect("gc report serializes"))
                .map_err(CliError::from)
        })?;
        let failed = done.iter().filter(|(_, r)| r.is_err()).count();
        if json {
            let v: Vec<serde_json::Value> = done
                .iter()
                .map(|(s, r)| match r {
                    Ok(v) => serde_json::json!({"slot": s, "report": v}),
                    Err(e) => serde_json::json!({"slot": s, "error": e}),
                })
                .collect();
            println!("{}", serde_json::json!({ "slots": v }));
        } else {
            for (s, r) in &done {
                match r {
                    Ok(v) => println!(
                        "slot {s}: {} revisions dropped, {} freed, {} copied",
                        v["revisions_dropped"],
                        human(v["bytes_freed"].as_u64().unwrap_or(0)),
                        human(v["bytes_copied"].as_u64().unwrap_or(0))
                    ),
                    Err(e) => println!("slot {s}: {e}"),
                }
            }
        }
        return match failed {
            0 => Ok(()),
            n => Err(format!("{n} slot(s) were not collected (see above)").into()),
        };
    }
    let pb = progress_bar(!json);
    let target = match target_of(path)? {
        // The kernel refuses setxattr (the control channel) on a read-only mount. A dry run
        // writes nothing: plan it on the space directly (read-only opens share its lock).
        Target::Mounted { mnt } if is_read_only_mount(&mnt) => {
            if !dry_run {
                return Err(format!(
                    "{} is mounted read-only; gc changes the space (remount it read-write), \
                     `--dry-run` shows what it would do",
                    mnt.display()
                )
                .into());
            }
            let backing = backing_of(&mnt).ok_or("cannot find the mount's backing space")?;
            Target::Offline {
                fs: Box::new(Fs::new(
                    Space::open_as(&backing, &Mode::ReadOnly).map_err(CliError::from)?,
                )),
            }
        }
        t => t,
    };
    let r = match target {
        Target::Mounted { mnt } => {
            // The daemon runs gc inside the setxattr; the bar only shows that it is working.
            if let Some(pb) = &pb {
                pb.set_message("gc in the daemon");
            }
            let req: &[u8] = match (dry_run, empty_trash) {
                (false, false) => b"run",
                (true, false) => b"dry-run",
                (false, true) => b"empty-trash",
                (true, true) => b"dry-run,empty-trash",
            };
            control_set(&mnt, "gc", req)?;
            let v = control_get(&mnt, "gc", false)?;
            gc_from_json(&v).ok_or("malformed gc answer")?
        }
        Target::Offline { fs } => fs
            .gc_with(opts, &mut |p| {
                if let Some(pb) = &pb {
                    let (msg, done, total) = match p {
                        GcProgress::Revisions {
                            histories_done,
                            histories,
                        } => ("retention", histories_done, histories),
                        GcProgress::Chunks { done, total } => ("unreferenced chunks", done, total),
                        GcProgress::Compact {
                            segments_done,
                            segments,
                        } => ("compacting", segments_done, segments),
                    };
                    pb.set_message(msg);
                    pb.set_length(total);
                    pb.set_position(done);
                }
            })
            .map_err(CliError::from)?,
    };
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if json {
        println!("{}", gc_json(&r));
    } else {
        println!(
            "{}dropped {} revisions{}, freed {} chunks ({}), copied {}, freed {} segments",
            if r.dry_run { "would have " } else { "" },
            r.revisions_dropped,
            match r.trash_revisions_dropped {
                0 => String::new(),
                n => format!(" ({n} of removed files, from the trash)"),
            },
            r.chunks_freed,
            human(r.bytes_freed),
            human(r.bytes_copied),
            r.segments_freed
        );
        if r.planned_kept > 0 {
            println!(
                "kept {} planned revisions that were opened or restored while gc ran",
                r.planned_kept
            );
        }
        println!(
            "free space {} -> {} in {:.2}s",
            human(r.free_bytes_before),
            human(r.free_bytes_after),
            r.seconds
        );
    }
    Ok(())
}

fn gc_from_json(v: &serde_json::Value) -> Option<GcReport> {
    serde_json::from_value(v.clone()).ok()
}

/// The mount (or offline space) and relative path a revisions/restore command names.
fn path_target(path: &Path, space: Option<&Path>) -> Result<(Target, Vec<u8>), CliError> {
    match space {
        Some(dir) => Ok((
            space_target(&absolute(dir))?,
            path.as_os_str().as_encoded_bytes().to_vec(),
        )),
        None => {
            let (mnt, rel) = locate_in_mount(path)?;
            Ok((Target::Mounted { mnt }, rel))
        }
    }
}

/// The revisions of `path` as the daemon (or the offline space) lists them: a JSON array of
/// {id, committed_unix, size, new_bytes, current}, oldest first.
pub(crate) fn list_revisions(
    path: &Path,
    space: Option<&Path>,
) -> Result<serde_json::Value, CliError> {
    let (target, rel) = path_target(path, space)?;
    Ok(match target {
        Target::Mounted { mnt } if is_read_only_mount(&mnt) => {
            // The kernel refuses setxattr, and so the daemon's select, on a read-only
            // mount; read the space directly instead (read-only opens share its lock).
            let backing = backing_of(&mnt).ok_or("cannot find the mount's backing space")?;
            let fs = Fs::new(Space::open_as(&backing, &Mode::ReadOnly).map_err(CliError::from)?);
            revisions_json(&fs.revisions_of(&rel).map_err(CliError::from)?)
        }
        Target::Mounted { mnt } => {
            // Paged: one answer must fit an xattr value (64 KiB), a long history does not.
            control_set(&mnt, "select", &rel)?;
            let mut all = Vec::new();
            let mut after = 0u64;
            loop {
                let page = control_get(&mnt, &format!("{}{after}", fuse::REVISIONS_AFTER), true)?;
                let list = page
                    .get("revisions")
                    .and_then(|v| v.as_array())
                    .ok_or("revisions: bad answer from the daemon")?;
                let last = list
                    .last()
                    .and_then(|r| r.get("id"))
                    .and_then(|i| i.as_u64());
                all.extend(list.iter().cloned());
                match (page.get("more").and_then(|m| m.as_bool()), last) {
                    (Some(true), Some(id)) => after = id,
                    _ => break,
                }
            }
            serde_json::Value::Array(all)
        }
        Target::Offline { fs } => revisions_json(&fs.revisions_of(&rel).map_err(CliError::from)?),
    })
}

fn cmd_report(path: &Path, space: Option<&Path>, svg: &Path) -> Result<(), CliError> {
    // The space's ratios for the subtitle: from the mount, or the backing dir offline.
    let stats_of = match space {
        Some(dir) => absolute(dir),
        None => locate_in_mount(path)?.0,
    };
    let (points, what) = if space.is_none() && std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        let mut steps = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| format!("cannot list {}: {e}", path.display()))?
            .collect::<Result<_, _>>()
            .map_err(CliError::from)?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            // Links (`latest`) and the revision view are not checkpoints of their own.
            if name == ".ckptfs" || e.file_type().map_err(CliError::from)?.is_symlink() {
                continue;
            }
            let p = report::step_point(&e.path(), name, &mut |f| {
                list_revisions(f, None).or_else(|err| match is_cross_slot(&err.to_string()) {
                    true => published_cost(f),
                    false => Err(err),
                })
            })?;
            if p.logical > 0 {
                steps.push(p);
            }
        }
        steps.sort_by(|a, b| a.committed_unix.total_cmp(&b.committed_unix));
        (steps, "checkpoint steps")
    } else {
        (
            report::file_points(&list_revisions(path, space)?),
            "revisions",
        )
    };
    let s = read_stats(&stats_of)?;
    let subtitle = format!(
        "{} {what}; the space now: dedup {}, compression {}, {} stored for {} logical",
        points.len(),
        s.dedup_ratio().map_or("-".into(), |r| format!("{r:.2}x")),
        s.compression_ratio()
            .map_or("-".into(), |r| format!("{r:.2}x")),
        human(s.stored_bytes),
        human(s.logical_bytes)
    );
    report::render_svg(&path.display().to_string(), &subtitle, &points, svg)?;
    let (logical, stored) = points
        .iter()
        .fold((0, 0), |(l, s), p| (l + p.logical, s + p.stored));
    println!(
        "wrote {}: {} {what}, {} logical, {} newly stored",
        svg.display(),
        points.len(),
        human(logical),
        human(stored)
    );
    Ok(())
}

/// How a control request over a file another slot made says so (`control_error`).
const CROSS_SLOT: &str = "another node's slot holds this file, and its revisions";

/// Whether a control request failed because the file is another node's slot's.
fn is_cross_slot(err: &str) -> bool {
    err.contains(CROSS_SLOT)
}

/// What another slot's file costs (its slot keeps its revisions), as a one-entry revision
/// listing for the report: its size, newest commit, and the stored bytes of its chunks.
fn published_cost(path: &Path) -> Result<serde_json::Value, CliError> {
    let (target, rel) = path_target(path, None)?;
    let Target::Mounted { mnt } = target else {
        return Err(format!("{}: not in a mount", path.display()).into());
    };
    control_set(&mnt, "select", &rel)?;
    let c = control_get(&mnt, "cost", true)?;
    if c.is_null() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    Ok(serde_json::json!([{
        "current": true,
        "size": c["size"],
        "new_bytes": c["stored"],
        "committed_unix": c["committed_unix"],
    }]))
}

fn cmd_revisions(path: &Path, space: Option<&Path>, json: bool) -> Result<(), CliError> {
    let v = list_revisions(path, space)?;
    // Commit times in the reader's local zone: RFC 3339 for programs, local time and age
    // for people (the daemon's answer carries only the unix time; its zone may differ).
    let mut v = v;
    for r in v.as_array_mut().into_iter().flatten() {
        if let Some(t) = r.get("committed_unix").and_then(|x| x.as_f64()) {
            r["committed"] = serde_json::Value::String(when::rfc3339(t));
        }
    }
    if json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "{:>10}  {:<34}  {:>12}  {:>12}",
        "revision", "committed", "size", "new bytes"
    );
    for r in v.as_array().into_iter().flatten() {
        let g = |k: &str| r.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        let committed = r
            .get("committed_unix")
            .and_then(|x| x.as_f64())
            .map_or_else(|| "?".to_string(), when::human);
        println!(
            "{:>10}  {:<34}  {:>12}  {:>12}{}",
            g("id"),
            committed,
            human(g("size")),
            human(g("new_bytes")),
            if r.get("current").and_then(|x| x.as_bool()) == Some(true) {
                "  current"
            } else {
                ""
            }
        );
    }
    Ok(())
}

fn cmd_restore(
    path: &Path,
    space: Option<&Path>,
    rev: u64,
    to: Option<&Path>,
) -> Result<(), CliError> {
    let (target, rel) = path_target(path, space)?;
    match (target, to) {
        (Target::Mounted { mnt }, None) => {
            control_set(&mnt, "select", &rel)?;
            control_set(&mnt, "restore", rev.to_string().as_bytes())?;
        }
        (Target::Mounted { mnt }, Some(to)) => {
            // Through the view, by history id, so unlinked paths work too.
            control_set(&mnt, "select", &rel)?;
            let hid = control_get(&mnt, "history", true)?
                .get("history")
                .and_then(|h| h.as_u64())
                .ok_or("malformed history answer")?;
            let src = mnt
                .join(".ckptfs/histories")
                .join(hid.to_string())
                .join(rev.to_string());
            std::fs::copy(&src, to)
                .map_err(|e| format!("cannot copy revision {rev} ({}): {e}", src.display()))?;
        }
        (Target::Offline { fs }, None) => {
            // SAFETY: getuid/getgid cannot fail.
            let c = unsafe {
                Caller {
                    uid: libc::getuid(),
                    gid: libc::getgid(),
                }
            };
            fs.restore(&rel, rev, c).map_err(CliError::from)?;
        }
        (Target::Offline { fs }, Some(to)) => {
            let f = fs.read_revision(&rel, rev).map_err(CliError::from)?;
            let mut out = std::fs::File::create(to).map_err(CliError::from)?;
            let mut off = 0;
            while off < f.size() {
                let piece = f
                    .read(fs.space().chunks(), off, 8 << 20)
                    .map_err(CliError::from)?;
                out.write_all(&piece).map_err(CliError::from)?;
                off += piece.len() as u64;
            }
            out.sync_all().map_err(CliError::from)?;
        }
    }
    Ok(())
}

/// Malloc arenas the daemon's threads share (`M_ARENA_MAX`). glibc gives threads up to 8
/// arenas per core, and each keeps its own high-water mark of freed buffers: with 8192
/// files written 64 KiB at a time in turn on 2 cores the daemon's peak RSS was 453-531 MiB
/// with glibc's default (16 arenas), 449-479 with 4, 384-425 with 2 (`tests/tests/
/// many_files.rs`), and on a 16-core node the default is 128. The buffers that go through
/// malloc are 16 KiB to 4 MiB, one or a few per chunk or request, so two arenas are not
/// contended (tcache serves the small allocations per thread).
const HEAP_ARENAS: i32 = 2;

fn limit_heap_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before other threads start.
    unsafe {
        if libc::mallopt(libc::M_ARENA_MAX, HEAP_ARENAS) != 1 {
            log::warn!("could not limit malloc to {HEAP_ARENAS} arenas (mallopt failed)");
        }
    }
}

/// Gives the pages of freed memory back to the kernel, once a second. glibc keeps what its
/// arenas freed (many threads allocate and free buffers of 64 KiB to 4 MiB), so the
/// daemon's resident memory only grew: the N-1 strided benchmark's peak went 228, 451, 632
/// MiB over three checkpoints in one mount, against 141 MiB live under jemalloc. A trim
/// walks the arenas' free lists (milliseconds at these sizes).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuning() -> Tuning {
        Tuning {
            threads: 4,
            workers: None,
            codec: None,
            gpu: "auto".into(),
            confirm_by_fingerprint: true,
            follow_changes: true,
            cuda_lib_dir: None,
            read_only: false,
            suid: false,
            noexec: false,
            slot: None,
            lease: ckptfs_engine::slots::DEFAULT_LEASE,
            take_over: false,
            no_probe: false,
        }
    }

    #[test]
    fn fstab_options_map_to_the_flags_and_unknown_ones_are_refused() {
        let (mut t, mut other) = (tuning(), false);
        apply_mount_options(
            "defaults,ro,allow_other,threads=8,workers=0,codec=shuffle,gpu=off,nosuid,\
             noatime,_netdev,nofail,x-systemd.automount,comment=ckpt",
            &mut t,
            &mut other,
        )
        .unwrap();
        assert!(t.read_only && other && !t.suid && !t.noexec);
        assert_eq!((t.threads, t.workers), (8, Some(0)));
        assert_eq!(
            (t.codec.as_deref(), t.gpu.as_str()),
            (Some("shuffle"), "off")
        );
        apply_mount_options(
            "slot=7,lease=500ms,confirm=blake3,cuts=content",
            &mut t,
            &mut other,
        )
        .unwrap();
        assert_eq!((t.slot, t.lease), (Some(7), Duration::from_millis(500)));
        assert!(!t.confirm_by_fingerprint && !t.follow_changes);
        for bad in [
            "bogus",
            "slot=x",
            "lease=10ms",
            "threads=0",
            "threads=x",
            "codec=zstd",
            "confirm=xxh3",
            "cuts=fixed",
            "ro=1",
            "cuda_lib_dir=",
        ] {
            let e = apply_mount_options(bad, &mut tuning(), &mut false).unwrap_err();
            assert!(e.to_string().contains("mount option"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_mount_helper_command_line_is_a_mount() {
        let v = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert_eq!(
            helper_args(v(&["ckptfs", "/data/space", "/ckpt", "-o", "rw"])),
            v(&["ckptfs", "mount", "/data/space", "/ckpt", "-o", "rw"])
        );
        assert_eq!(
            helper_args(v(&["ckptfs", "space", "/ckpt", "-o", "rw"])),
            v(&["ckptfs", "mount", "space", "/ckpt", "-o", "rw"])
        );
        for same in [
            &["ckptfs", "stats", "/ckpt"][..],
            &["ckptfs", "--help"],
            &["ckptfs", "mount", "/ckpt"],
            &["ckptfs", "/ckpt"],
            &["ckptfs", "stat", "/ckpt", "x"],
        ] {
            assert_eq!(helper_args(v(same)), v(same));
        }
    }
}
