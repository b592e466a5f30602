//! The `ckptfs` binary under test, driven through its CLI, and a guard that unmounts the space
//! when the benchmark ends, fails or is interrupted.

use crate::report::Stages;
pub use crate::sys::is_mountpoint;
use crate::sys::Result;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub struct Ckptfs {
    bin: PathBuf,
    backing: PathBuf,
    mnt: PathBuf,
    logs: PathBuf,
    /// Appended to every `ckptfs mount BACKING MNT` (--mount-arg).
    mount_args: Vec<String>,
    step: u32,
    mounted: bool,
    /// Mounted, and no `ckptfs` command has run since: the daemon's stage counters are all 0
    /// and nothing has asked it for its metadata.
    fresh: bool,
}

impl Ckptfs {
    /// A scenario's fresh space beside a plain directory on the same disk: `dir/backing`
    /// formatted (`space` bytes, `format_args` added) and mounted at `dir/mnt`, the CLI's
    /// output in `dir/logs`. Returns it with `dir/plain` (not created) and `dir/mnt`.
    pub fn beside_plain(
        bin: &Path,
        dir: &Path,
        mount_args: Vec<String>,
        space: u64,
        chunk_size: &str,
        format_args: &[&str],
    ) -> Result<(Ckptfs, PathBuf, PathBuf)> {
        let logs = dir.join("logs");
        crate::util::fresh_dir(&logs)?;
        let mnt = dir.join("mnt");
        fs::create_dir_all(&mnt).map_err(|e| format!("create {}: {e}", mnt.display()))?;
        let mut ck = Ckptfs::new(
            bin.to_path_buf(),
            dir.join("backing"),
            mnt.clone(),
            logs,
            mount_args,
        );
        ck.clear_stale_mount()?;
        crate::util::fresh_dir(&dir.join("backing"))?;
        ck.format(space, chunk_size, format_args)?;
        ck.mount()?;
        ck.configure()?;
        Ok((ck, dir.join("plain"), mnt))
    }

    pub fn new(
        bin: PathBuf,
        backing: PathBuf,
        mnt: PathBuf,
        logs: PathBuf,
        mount_args: Vec<String>,
    ) -> Ckptfs {
        Ckptfs {
            bin,
            backing,
            mnt,
            logs,
            mount_args,
            step: 0,
            mounted: false,
            fresh: false,
        }
    }

    /// Whether the daemon was just mounted and no `ckptfs` command has run since.
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// Runs `ckptfs ARGS` and returns its stdout. Output goes to files under the log directory,
    /// never to pipes: `ckptfs mount` leaves a daemon behind that would hold a pipe open.
    fn run(&mut self, args: &[&OsStr]) -> Result<String> {
        self.step += 1;
        self.fresh = false;
        let what = args
            .first()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        let base = self.logs.join(format!("{:04}-{what}", self.step));
        let out_path = base.with_extension("out");
        let err_path = base.with_extension("err");
        let open = |p: &Path| fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
        let status = Command::new(&self.bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(open(&out_path)?)
            .stderr(open(&err_path)?)
            .status()
            .map_err(|e| format!("run {}: {e}", self.bin.display()))?;
        let out = fs::read_to_string(&out_path).unwrap_or_default();
        if !status.success() {
            let err = fs::read_to_string(&err_path).unwrap_or_default();
            let shown: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
            return Err(format!(
                "`ckptfs {}` failed ({status}): {}{}",
                shown.join(" "),
                err.trim(),
                out.trim()
            ));
        }
        Ok(out)
    }

    /// `ckptfs format BACKING --size SIZE --chunk-size CHUNK EXTRA...`.
    pub fn format(&mut self, size: u64, chunk_size: &str, extra: &[&str]) -> Result<()> {
        let (b, s) = (self.backing.clone(), size.to_string());
        let mut args: Vec<&OsStr> = vec![
            "format".as_ref(),
            b.as_os_str(),
            "--size".as_ref(),
            s.as_ref(),
            "--chunk-size".as_ref(),
            chunk_size.as_ref(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        self.run(&args).map(drop)
    }

    pub fn mount(&mut self) -> Result<()> {
        let (b, m) = (self.backing.clone(), self.mnt.clone());
        let extra = self.mount_args.clone();
        let mut args: Vec<&OsStr> = vec!["mount".as_ref(), b.as_os_str(), m.as_os_str()];
        args.extend(extra.iter().map(OsStr::new));
        self.run(&args)?;
        self.mounted = true;
        self.fresh = true;
        Ok(())
    }

    /// `ckptfs umount`, which returns once the daemon has committed everything and exited.
    pub fn umount(&mut self) -> Result<()> {
        let m = self.mnt.clone();
        self.run(&["umount".as_ref(), m.as_os_str()])?;
        self.mounted = false;
        Ok(())
    }

    /// The retention the benchmark needs: deleted files and replaced revisions go at the next
    /// gc, so the space never fills across repetitions, and no automatic gc runs inside a timed
    /// section (the benchmark runs gc itself between repetitions).
    pub fn configure(&mut self) -> Result<()> {
        let m = self.mnt.clone();
        self.run(&[
            "config".as_ref(),
            m.as_os_str(),
            "--keep-revisions".as_ref(),
            "1".as_ref(),
            "--keep-unlinked".as_ref(),
            "off".as_ref(),
            "--keep-age".as_ref(),
            "off".as_ref(),
            "--auto-gc-free-percent".as_ref(),
            "0".as_ref(),
        ])
        .map(drop)
    }

    pub fn gc(&mut self) -> Result<()> {
        let m = self.mnt.clone();
        self.run(&["gc".as_ref(), m.as_os_str(), "--json".as_ref()])
            .map(drop)
    }

    pub fn stats(&mut self) -> Result<serde_json::Value> {
        let m = self.mnt.clone();
        let out = self.run(&["stats".as_ref(), m.as_os_str(), "--json".as_ref()])?;
        serde_json::from_str(out.trim())
            .map_err(|e| format!("`ckptfs stats --json` printed non-JSON ({e}): {out}"))
    }

    /// The daemon's pid, from the lock file ("pid N mounted at ...").
    pub fn daemon_pid(&self) -> Result<u32> {
        let lock = self.backing.join("lock");
        let note = fs::read_to_string(&lock).map_err(|e| format!("{}: {e}", lock.display()))?;
        note.strip_prefix("pid ")
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{} names no pid: {note:?}", lock.display()))
    }

    /// Unmounts a mount left at `mnt` by an earlier, killed run.
    pub fn clear_stale_mount(&mut self) -> Result<()> {
        if !is_mountpoint(&self.mnt) {
            return Ok(());
        }
        eprintln!(
            "ckptfs-bench: {} is still mounted (an earlier run?); unmounting it",
            self.mnt.display()
        );
        if self.umount().is_err() {
            lazy_unmount(&self.mnt);
        }
        if is_mountpoint(&self.mnt) {
            return Err(format!(
                "{} is still mounted; unmount it first",
                self.mnt.display()
            ));
        }
        Ok(())
    }
}

/// stored_bytes of a `ckptfs stats --json` answer.
pub fn stored_bytes(stats: &serde_json::Value) -> Result<u64> {
    stats["stored_bytes"]
        .as_u64()
        .ok_or_else(|| format!("`ckptfs stats --json` has no stored_bytes: {stats}"))
}

/// Seconds per daemon stage ("stages" of `ckptfs stats --json`: cumulative since the daemon
/// started, summed over its threads); None from a ckptfs that does not report them.
pub fn stage_seconds(stats: &serde_json::Value) -> Option<Stages> {
    stage_field(stats, "seconds")
}

/// One field of every stage in `ckptfs stats --json` (0 where a stage lacks it).
fn stage_field(stats: &serde_json::Value, field: &str) -> Option<Stages> {
    let m = stats.get("stages")?.as_object()?;
    Some(
        m.iter()
            .map(|(k, v)| (k.clone(), v[field].as_f64().unwrap_or(0.0)))
            .collect(),
    )
}

/// Per stage: the daemon's count so far ("stages" of `ckptfs stats --json`): `dispatch` counts
/// every FUSE request, `ingest` the write requests and `reply` the read requests.
pub fn stage_counts(stats: &serde_json::Value) -> Option<Stages> {
    stage_field(stats, "count")
}

/// Per stage: the daemon's estimated CPU seconds so far (`cpu_seconds`; see the engine's
/// `pipeline::Stage`); None from a ckptfs that does not estimate them.
pub fn stage_cpu_seconds(stats: &serde_json::Value) -> Option<Stages> {
    stats
        .get("stages")?
        .as_object()?
        .values()
        .next()?
        .get("cpu_seconds")?;
    stage_field(stats, "cpu_seconds")
}

fn lazy_unmount(mnt: &Path) {
    crate::sys::fusermount_u(mnt, true);
}

impl Drop for Ckptfs {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        if let Err(e) = self.umount() {
            eprintln!("ckptfs-bench: {e}; detaching the mount (fusermount3 -u -z)");
            lazy_unmount(&self.mnt);
        }
    }
}
