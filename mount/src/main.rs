//! `ckptfs`: format, mount, unmount and inspect checkpoint filesystems.
//!
//! This file holds the command line (`Cli`, `Cmd`) and the dispatch (`run`); the rest is one
//! file per family:
//!
//! - the daemon: `daemon.rs` (mount, umount, spawning and signals, the maintenance
//!   scheduler's jobs) and `fuse.rs`, the FUSE adapter, which translates kernel requests
//!   into `ckptfs_fs::Fs` calls;
//! - the control channel both sides share: `control.rs` (one typed `Request` per control
//!   request, its wire form, who may send it);
//! - the commands: `format_cmd.rs`, `config.rs`, `stats.rs` (and `metrics.rs`, Prometheus
//!   text), `gc.rs`, `revisions.rs` (revisions, report, restore; `report.rs` draws),
//!   `check.rs`, `targets.rs` (targets, rebuild, scrub), `slots.rs`, `advise.rs`;
//! - `error.rs`: the typed error and its exit codes; `when.rs`: times as users write them.

mod advise;
mod check;
mod config;
mod control;
mod daemon;
mod error;
mod format_cmd;
mod fuse;
mod gc;
mod remote;
mod revisions;
mod stats;
use config::*;
use daemon::*;
use error::CliError;
use format_cmd::*;
use gc::*;
use revisions::*;
use stats::*;
mod metrics;
mod report;
mod slots;
mod targets;
mod told;
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
        #[command(flatten)]
        remote: remote::RemoteArgs,
    },
    /// The object-store tier: on a mount, what the bucket holds and how far behind it is
    /// (commits, bytes, seconds); on an unmounted backing directory, its settings and the
    /// bucket's newest checkpoint, or (with --remote) give it a tier.
    Remote {
        /// A mountpoint or a backing directory.
        path: PathBuf,
        #[command(flatten)]
        args: remote::RemoteArgs,
        /// Wait until the bucket holds everything committed on the mount.
        #[arg(long)]
        sync: bool,
        #[arg(long)]
        json: bool,
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
    /// Rebuild a lost backing directory: of a space formatted with --target, from the
    /// metadata mirror its targets hold (--from; K+1 of them, `ckptfs targets` says which);
    /// of a space with an object-store tier, from the bucket alone (--remote). Then mount
    /// BACKING_DIR as before.
    Recover {
        /// The backing directory to rebuild (new or empty; --force replaces a damaged one).
        backing: PathBuf,
        /// A target directory of the space: where to find the newest mirror.
        #[arg(
            long,
            value_name = "TARGET_DIR",
            required_unless_present = "remote",
            conflicts_with = "remote"
        )]
        from: Option<PathBuf>,
        #[command(flatten)]
        remote: remote::RemoteArgs,
        /// With --remote: the size of the new space (default: twice what the bucket's
        /// newest checkpoint stores, plus 1 GiB).
        #[arg(long, value_parser = parse_size, requires = "remote")]
        size: Option<u64>,
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
        /// Threads serving FUSE requests: at most this many requests (closes waiting for
        /// their commit among them) are served at once.
        #[arg(long, default_value_t = DEFAULT_THREADS, value_parser = clap::value_parser!(u32).range(1..=64))]
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
        /// When a file's bytes are durable: `close` (the default) when its `close()`
        /// returns, at the cost of one sync of the journal shared by the closes that arrive
        /// together; `fsync` when the application calls `fsync` on any file or directory of
        /// the mount (or it unmounts): `close()` returns without waiting for a disk, and a
        /// crash may lose the closes after the last `fsync`, never one before it (POSIX's
        /// contract, for jobs that make their own durability points). `syncfs(2)` is not
        /// passed to FUSE filesystems by Linux: `fsync` one file instead.
        #[arg(long, default_value = "close", value_parser = ["close", "fsync"])]
        durability: String,
        /// Of a multi-slot space: when this node sees what other nodes changed. `strict`
        /// (the default): every lookup, stat and listing, as soon as the other node's call
        /// returned; the kernel keeps no name or attribute, so each stat asks the daemon
        /// and reads the slots' hints. `close-to-open` (as NFS): opens, creates, renames,
        /// removals, listings and lookups of names this node has not seen still see other
        /// nodes' changes at once, but a stat, or a path walk to an open that then
        /// checks it, may use what the kernel learnt up to 1 s before; `ls -l` and stat of
        /// many files run at a single node's speed (README, "Several nodes").
        #[arg(long, default_value = "strict", value_parser = ["strict", "close-to-open"])]
        coherence: String,
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
        /// --read-only), `rw`, `allow_other`, `threads=N`, `workers=N`, `codec=C`, `gpu=G`, `confirm=C`, `cuts=C`, `durability=D`,
        /// `coherence=C`, `cuda_lib_dir=DIR` (as the flags), `suid` (ckptfs mounts nosuid unless told),
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
        /// With s3://BUCKET/PREFIX in place of BACKING_DIR: the local directory its space
        /// lives in. An empty one is filled from the bucket first (its newest checkpoint);
        /// the mount then owns the prefix (a lease) and uploads what it writes.
        ///
        /// Chunks are fetched as files are read (ranged reads, read-ahead, every chunk
        /// checked by blake3), not before the mount is ready.
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
        /// With s3://...: the most bytes of fetched chunks kept on local disk
        /// (`remote-cache` in the cache directory; default 4G, 0: none). Kept in its
        /// `remote` file for later mounts.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        cache_size: Option<u64>,
        /// Take the object-store tier's lease even while it runs: only when its holder is
        /// known to be dead (a node lost with its mount). A live holder is fenced at its next
        /// upload, but what it wrote locally since is not in the bucket.
        #[arg(long)]
        remote_take_over: bool,
        /// With s3://...: the object store's URL (as `format --remote-endpoint`).
        #[arg(long, value_name = "URL")]
        remote_endpoint: Option<String>,
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
        /// Check the space's object-store tier instead: read every chunk the bucket's
        /// newest checkpoint names and verify it by blake3.
        #[arg(long)]
        remote: bool,
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

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// How long a mount waits for a daemon that was unmounted but is still exiting (committing
/// what was open, closing the metadata table) to let go of the space.
pub(crate) const EXITING_HOLDER_WAIT: Duration = Duration::from_secs(30);

/// How long a mount waits for an exiting daemon before it says so.
pub(crate) const EXITING_HOLDER_NOTICE: Duration = Duration::from_secs(2);

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
        Cmd::Remote {
            path,
            args,
            sync,
            json,
        } => remote::run(&path, &args, sync, json),
        Cmd::Recover {
            backing,
            from,
            remote: r,
            size,
            force,
            json,
        } => {
            let Some(from) = from else {
                if force {
                    return Err("--force is for --from; recover --remote into a new or \
                                empty directory"
                        .into());
                }
                return remote::recover(&backing, &r, size, json, None);
            };
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
            durability,
            coherence,
            cuda_lib_dir,
            read_only,
            options,
            slot,
            lease,
            take_over,
            no_probe,
            cache,
            cache_size,
            remote_take_over,
            remote_endpoint,
            notify_ready,
        } => {
            let mut paths = paths;
            if let Some(url) = paths[0].to_str().filter(|p| p.starts_with("s3://")) {
                if paths.len() != 2 {
                    return Err(
                        "usage: ckptfs mount s3://BUCKET/PREFIX MOUNTPOINT --cache DIR".into(),
                    );
                }
                paths[0] = remote::cache_for(url, cache.as_deref(), remote_endpoint, cache_size)?;
            } else if cache.is_some() || remote_endpoint.is_some() || cache_size.is_some() {
                return Err(
                    "--cache, --cache-size and --remote-endpoint are for mounting \
                     s3://BUCKET/PREFIX"
                        .into(),
                );
            }
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
                close_durable: durability == "close",
                close_to_open: coherence == "close-to-open",
                cuda_lib_dir,
                read_only,
                suid: false,
                noexec: false,
                slot,
                lease,
                take_over,
                no_probe,
                remote_take_over,
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
    if let Cmd::Check { path, remote, json } = &cli.cmd {
        if *remote {
            return remote::check(path, *json);
        }
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
            close_durable: true,
            close_to_open: false,
            cuda_lib_dir: None,
            read_only: false,
            suid: false,
            noexec: false,
            slot: None,
            lease: ckptfs_engine::slots::DEFAULT_LEASE,
            take_over: false,
            no_probe: false,
            remote_take_over: false,
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
            "slot=7,lease=500ms,confirm=blake3,cuts=content,durability=fsync,\
             coherence=close-to-open",
            &mut t,
            &mut other,
        )
        .unwrap();
        assert_eq!((t.slot, t.lease), (Some(7), Duration::from_millis(500)));
        assert!(!t.confirm_by_fingerprint && !t.follow_changes && !t.close_durable);
        assert!(t.close_to_open);
        for bad in [
            "bogus",
            "slot=x",
            "lease=10ms",
            "threads=0",
            "threads=x",
            "codec=zstd",
            "confirm=xxh3",
            "cuts=fixed",
            "coherence=weak",
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
