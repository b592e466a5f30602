//! Shared harness for the cross-crate tests: each test formats a fresh backing space, mounts it
//! through the real `ckptfs` binary, and drives it with ordinary syscalls.
//!
//! The binary is found next to the test executable (`target/<profile>/ckptfs`) or at
//! `$CKPTFS_BIN`. Tests need `/dev/fuse` and root (or `fusermount3`); without them they fail
//! loudly instead of passing vacuously. Tests that wait for the daemon to have answered the
//! kernel's background requests ([`TestMount::wait_requests_answered`]) also need fusectl at
//! `/sys/fs/fuse/connections` (mounted there on first use when root may).

pub use ckptfs_engine::maintenance::gc::GcReport;
pub use ckptfs_engine::space::StatsReport;
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub mod cluster;
pub mod n1model;
pub mod nsmodel;
pub mod rotation;
pub mod s3;
pub mod tagged;

/// Size of the backing space unless a test asks for another. Format reserves it with
/// fallocate, and nextest runs tests side by side on CI machines whose disks are small (one
/// failed with 2 GB free while another test held its 2 GiB): keep spaces small.
pub const DEFAULT_SPACE_SIZE: &str = "512M";

pub(crate) const FORMAT_TIMEOUT: Duration = Duration::from_secs(180);
pub(crate) const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);
const UMOUNT_TIMEOUT: Duration = Duration::from_secs(300);
const STATS_TIMEOUT: Duration = Duration::from_secs(60);

/// The pid of the daemon that holds the single-slot space in `backing`, from its lock file.
pub fn daemon_pid_of(backing: &Path) -> u32 {
    let lock = backing.join("lock");
    let note = fs::read_to_string(&lock).unwrap_or_else(|e| panic!("read {}: {e}", lock.display()));
    note.strip_prefix("pid ")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{} names no pid: {note:?}", lock.display()))
}

/// Path of the `ckptfs` binary under test.
pub fn ckptfs_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CKPTFS_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "CKPTFS_BIN={} does not name a file; build it with `cargo build --workspace`",
            p.display()
        );
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    // exe is target/<profile>/deps/<test>-<hash>; the binary is target/<profile>/ckptfs.
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable has no target/<profile>/deps parent");
    let bin = profile_dir.join("ckptfs");
    assert!(
        bin.is_file(),
        "the ckptfs binary is missing at {}: run `cargo build --workspace` first \
         (or point CKPTFS_BIN at it)",
        bin.display()
    );
    bin
}

/// Fails the test with a clear message when this machine cannot mount FUSE filesystems.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: these tests mount a real FUSE filesystem \
         (load the fuse module, or give the container --device /dev/fuse)"
    );
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let fusermount = ["/usr/bin/fusermount3", "/bin/fusermount3"]
        .iter()
        .any(|p| Path::new(p).exists());
    assert!(
        root || fusermount,
        "not root and no fusermount3 found: install fuse3 (apt-get install -y fuse3) or run as root"
    );
}

/// Unpacks the `.tar.gz` `archive` into `into`.
fn untar(archive: &Path, into: &Path) {
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .output()
        .unwrap_or_else(|e| panic!("run tar: {e}"));
    assert!(
        out.status.success(),
        "unpacking {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "ckptfs-{tag}-{}-{n}-{nanos:08x}",
            std::process::id()
        ));
        fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("create temp dir {}: {e}", path.display()));
        TempDir { path }
    }

    /// The directory `path` itself, emptied first: for a fixture that records absolute
    /// paths (`TestMount::from_archive_at`). One test at a time may use a given path.
    pub fn at(path: &Path) -> TempDir {
        match fs::remove_dir_all(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("empty {}: {e}", path.display()),
        }
        fs::create_dir_all(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        TempDir {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory in place when dropped.
    pub fn keep(&mut self) {
        self.path = PathBuf::new();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Runs a command with stdout/stderr sent to files (never pipes: `ckptfs mount` leaves a daemon
/// behind that would hold a pipe open) and a wall-clock limit. Returns (status, stdout, stderr).
fn run_logged(
    cmd: &mut Command,
    log_dir: &Path,
    name: &str,
    timeout: Duration,
) -> io::Result<(ExitStatus, String, String)> {
    let out_path = log_dir.join(format!("{name}.stdout"));
    let err_path = log_dir.join(format!("{name}.stderr"));
    let out = fs::File::create(&out_path)?;
    let err = fs::File::create(&err_path)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{cmd:?} did not finish within {timeout:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| fs::read_to_string(p).unwrap_or_default();
    Ok((status, read(&out_path), read(&err_path)))
}

/// Runs `ckptfs ARGS` outside any [`TestMount`] (for commands that must be refused), logging
/// into `log_dir` under `name`. Returns (status, stdout, stderr).
pub fn run_ckptfs(log_dir: &Path, name: &str, args: &[&OsStr]) -> (ExitStatus, String, String) {
    let mut cmd = Command::new(ckptfs_bin());
    cmd.args(args);
    run_logged(&mut cmd, log_dir, name, FORMAT_TIMEOUT).unwrap_or_else(|e| {
        let shown: Vec<OsString> = args.iter().map(|a| a.to_os_string()).collect();
        panic!("`ckptfs {}`: {e}", join_args(&shown))
    })
}

/// For tests that compare answers with the machine's own filesystem as another user: a
/// ckptfs mount made with `--allow-other` and a plain directory (tagged `tag`), both open to
/// everyone. Panics unless run as root (the tests switch users).
pub fn mount_beside_plain(tag: &str) -> (TestMount, TempDir) {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test switches users: run it as root"
    );
    let mut m = TestMount::new();
    m.unmount();
    m.mount_with(&["--allow-other"]);
    let plain = TempDir::new(tag);
    for d in [m.mnt(), plain.path()] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o777)).expect("chmod dir");
    }
    (m, plain)
}

fn is_mountpoint(p: &Path, parent: &Path) -> bool {
    st_dev(p) != st_dev(parent)
}

fn st_dev(p: &Path) -> Option<u64> {
    fs::metadata(p).ok().map(|m| m.dev())
}

/// A formatted backing space mounted at a private mountpoint; unmounted (even on panic) on drop.
pub struct TestMount {
    root: TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    mounted: bool,
    bin: PathBuf,
    step: u64,
    /// Extra environment for every `ckptfs` command (and so the daemon), e.g. CKPTFS_FAULTS.
    env: Vec<(String, String)>,
    /// The backing directory is a tmpfs of its own (`on_small_filesystem`), unmounted on drop.
    backing_fs: bool,
}

impl TestMount {
    /// Formats a space of DEFAULT_SPACE_SIZE with the default chunk size and mounts it.
    pub fn new() -> TestMount {
        TestMount::with_options(DEFAULT_SPACE_SIZE, None)
    }

    /// Formats with `--size size` (and `--chunk-size` when given), then mounts.
    pub fn with_options(size: &str, chunk_size: Option<&str>) -> TestMount {
        match chunk_size {
            Some(cs) => TestMount::with_format_args(size, &["--chunk-size", cs]),
            None => TestMount::with_format_args(size, &[]),
        }
    }

    /// Formats with `--size size` plus `extra` format options (`--keep-revisions 3`, ...), then
    /// mounts.
    pub fn with_format_args(size: &str, extra: &[&str]) -> TestMount {
        let mut tm = TestMount::unformatted();
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("format"),
            tm.backing.as_os_str(),
            OsStr::new("--size"),
            OsStr::new(size),
        ];
        args.extend(extra.iter().map(OsStr::new));
        let args: Vec<OsString> = args.iter().map(|a| a.to_os_string()).collect();
        tm.run_ok("format", &args, FORMAT_TIMEOUT);
        tm.mount();
        tm
    }

    /// `with_format_args` with `env` in the environment of every command, the format
    /// included (an object-store tier's credentials and endpoint).
    pub fn with_env_format_args(size: &str, extra: &[&str], env: &[(&str, String)]) -> TestMount {
        let mut tm = TestMount::empty_with_env(env);
        let mut args: Vec<OsString> = vec![
            "format".into(),
            tm.backing.clone().into_os_string(),
            "--size".into(),
            size.into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        tm.run_ok("format", &args, FORMAT_TIMEOUT);
        tm.mount();
        tm
    }

    /// An empty backing directory and mountpoint, nothing mounted, with `env` for every
    /// command: for a space the test makes with its own commands (`ckptfs recover`), then
    /// `mount()`s.
    pub fn empty_with_env(env: &[(&str, String)]) -> TestMount {
        let mut tm = TestMount::unformatted();
        for (k, v) in env {
            tm.set_env(k, v);
        }
        tm
    }

    /// A space over `targets` storage targets (`root/targets/tN`, each its own failure
    /// domain) with `--redundancy redundancy`, formatted with `--size size`, mounted.
    pub fn with_targets(size: &str, targets: usize, redundancy: &str) -> TestMount {
        let mut tm = TestMount::unformatted();
        let mut args: Vec<OsString> = vec![
            "format".into(),
            tm.backing.clone().into_os_string(),
            "--size".into(),
            size.into(),
            "--redundancy".into(),
            redundancy.into(),
        ];
        if let Some(n) = targets_slots() {
            // The target suite on slots over targets: this mount claims one of `n` slots.
            args.push("--slots".into());
            args.push(n.to_string().into());
        }
        for i in 0..targets {
            args.push("--target".into());
            args.push(tm.target_dir(i).into_os_string());
        }
        tm.run_ok("format", &args, FORMAT_TIMEOUT);
        tm.mount();
        tm
    }

    /// Whether `with_targets` made a space of several slots (`targets_slots`).
    pub fn shared_targets(&self) -> bool {
        targets_slots().is_some()
    }

    /// Target `i`'s directory of a space made by `with_targets`.
    pub fn target_dir(&self, i: usize) -> PathBuf {
        self.root.path().join("targets").join(format!("t{i}"))
    }

    /// A space unpacked from a `.tar.gz` of a backing directory (a fixture made by an earlier
    /// build), mounted.
    pub fn from_archive(archive: &Path) -> TestMount {
        let mut tm = TestMount::unformatted();
        untar(archive, &tm.backing);
        tm.mount();
        tm
    }

    /// A space unpacked at the fixed directory `root` from a `.tar.gz` holding `backing/`
    /// and whatever else its space names by absolute path under `root` (the storage
    /// targets of `tests/fixtures/golden-targets-v1`), mounted. `root` is emptied first and
    /// removed with the mount.
    pub fn from_archive_at(archive: &Path, root: &Path) -> TestMount {
        let mut tm = TestMount::unformatted_in(TempDir::at(root));
        fs::remove_dir(&tm.backing).expect("the archive brings the backing directory");
        untar(archive, root);
        tm.mount();
        tm
    }

    /// Empty backing directory and mountpoint, nothing mounted.
    fn unformatted() -> TestMount {
        TestMount::unformatted_in(TempDir::new("test"))
    }

    /// `unformatted` in the directory `root`.
    fn unformatted_in(root: TempDir) -> TestMount {
        require_fuse();
        let bin = ckptfs_bin();
        let backing = root.path().join("backing");
        let mnt = root.path().join("mnt");
        fs::create_dir(&backing).expect("create backing dir");
        fs::create_dir(&mnt).expect("create mountpoint");
        // The daemon's temporary files (a read-only mount's log) stay with the test's files
        // and go with them.
        let tmp = root.path().join("tmp");
        fs::create_dir(&tmp).expect("create temp dir");
        TestMount {
            root,
            backing,
            mnt,
            mounted: false,
            bin,
            step: 0,
            env: vec![("TMPDIR".into(), tmp.to_string_lossy().into_owned())],
            backing_fs: false,
        }
    }

    /// A space of `size` formatted on a filesystem of its own of `fs_size` (a tmpfs mounted
    /// on the backing directory; root only), mounted: for what happens when the backing
    /// filesystem fills up. None, said loudly, where a tmpfs cannot be mounted.
    pub fn on_small_filesystem(fs_size: &str, size: &str) -> Option<TestMount> {
        let mut tm = TestMount::unformatted();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={fs_size},mode=0700"),
                "tmpfs",
            ])
            .arg(&tm.backing)
            .status();
        if !matches!(st, Ok(s) if s.success()) {
            skip(
                "a test on a small backing filesystem",
                "tmpfs",
                &format!("cannot mount a tmpfs for the backing directory ({st:?}; needs root)"),
            );
            return None;
        }
        tm.backing_fs = true;
        let args: Vec<OsString> = vec![
            "format".into(),
            tm.backing.clone().into_os_string(),
            "--size".into(),
            size.into(),
        ];
        tm.run_ok("format", &args, FORMAT_TIMEOUT);
        tm.mount();
        Some(tm)
    }

    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// The backing directory.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// The test's own directory (holds the backing dir, the mountpoint and logs).
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// `mnt/rel`.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    fn run(
        &mut self,
        what: &str,
        args: &[OsString],
        timeout: Duration,
    ) -> io::Result<(ExitStatus, String, String)> {
        self.step += 1;
        let name = format!("{:03}-{what}", self.step);
        let mut cmd = Command::new(&self.bin);
        cmd.args(args);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        run_logged(&mut cmd, self.root.path(), &name, timeout)
    }

    fn run_ok(&mut self, what: &str, args: &[OsString], timeout: Duration) -> String {
        match self.run(what, args, timeout) {
            Ok((st, out, _)) if st.success() => out,
            Ok((st, out, err)) => panic!(
                "`ckptfs {}` failed ({st}):\nstdout:\n{out}\nstderr:\n{err}",
                join_args(args)
            ),
            Err(e) => panic!("`ckptfs {}`: {e}", join_args(args)),
        }
    }

    /// Runs `ckptfs ARGS` as given and returns (exit status, stdout, stderr) without judging it.
    pub fn ckptfs(&mut self, args: &[&OsStr]) -> (ExitStatus, String, String) {
        let args: Vec<OsString> = args.iter().map(|a| a.to_os_string()).collect();
        self.run("cmd", &args, FORMAT_TIMEOUT)
            .unwrap_or_else(|e| panic!("`ckptfs {}`: {e}", join_args(&args)))
    }

    /// Sets `key=value` in the environment of every later `ckptfs` command (and the daemon a
    /// mount starts); an empty value removes it.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        if !value.is_empty() {
            self.env.push((key.to_string(), value.to_string()));
        }
    }

    /// Mounts the space (it must not be mounted).
    pub fn mount(&mut self) {
        self.mount_with(&[]);
    }

    /// Mounts the space with extra `ckptfs mount` options (`--allow-other`, ...).
    pub fn mount_with(&mut self, options: &[&str]) {
        assert!(!self.mounted, "already mounted");
        let mut args = vec![OsStr::new("mount").to_os_string()];
        args.extend(options.iter().map(|o| OsStr::new(o).to_os_string()));
        args.push(self.backing.clone().into_os_string());
        args.push(self.mnt.clone().into_os_string());
        self.run_ok("mount", &args, MOUNT_TIMEOUT);
        self.mounted = true;
        let parent_dev = st_dev(self.root.path());
        assert_ne!(
            st_dev(&self.mnt),
            parent_dev,
            "`ckptfs mount` exited 0 but {} is not a mountpoint yet",
            self.mnt.display()
        );
    }

    /// The space was mounted at this mountpoint by a `ckptfs mount` the test ran itself
    /// (to watch what it says): from now on this guard unmounts it.
    pub fn mounted_elsewhere(&mut self) {
        assert!(!self.mounted, "already mounted");
        assert_ne!(
            st_dev(&self.mnt),
            st_dev(self.root.path()),
            "{} is not a mountpoint",
            self.mnt.display()
        );
        self.mounted = true;
    }

    /// Unmounts through `ckptfs umount`, which waits for the daemon to exit.
    pub fn unmount(&mut self) {
        assert!(self.mounted, "not mounted");
        let args = vec![
            OsStr::new("umount").to_os_string(),
            self.mnt.clone().into_os_string(),
        ];
        // A busy mount right after the test's last close was seen once in CI under load
        // (fusermount3: Device or resource busy) and never reproduced; it is retried twice,
        // loudly, so a mount that stays busy (a file really left open) still fails.
        for attempt in 1..=3 {
            match self.run("umount", &args, UMOUNT_TIMEOUT) {
                Ok((st, _, err)) if !st.success() && attempt < 3 && err.contains("busy") => {
                    eprintln!("WARNING: unmount attempt {attempt} found the mount busy: {err}");
                    std::thread::sleep(Duration::from_millis(500));
                }
                _ => break,
            }
        }
        if is_mountpoint(&self.mnt, self.root.path()) {
            self.run_ok("umount", &args, UMOUNT_TIMEOUT);
        }
        self.mounted = false;
        assert_eq!(
            st_dev(&self.mnt),
            st_dev(self.root.path()),
            "`ckptfs umount` exited 0 but {} is still a mountpoint",
            self.mnt.display()
        );
    }

    /// Unmounts and mounts again: everything afterwards is read from the backing space.
    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// The mount daemon's pid, from the space's lock file ("pid N mounted at ...").
    pub fn daemon_pid(&self) -> u32 {
        daemon_pid_of(&self.backing)
    }

    /// Crashes the daemon: SIGKILL, so nothing is flushed or committed on the way out. Waits
    /// until it has exited (its lock and /dev/fuse are released then), detaches the dead mount
    /// (`fusermount3 -u -z`, else `umount -l`) and leaves the space unmounted; `mount()` mounts
    /// it again with no repair step. Returns the pid killed.
    pub fn kill_daemon(&mut self) -> u32 {
        assert!(self.mounted, "not mounted");
        let pid = self.daemon_pid();
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            cmdline.windows(6).any(|w| w == b"ckptfs"),
            "pid {pid} from the lock file is not a ckptfs daemon: {:?}",
            String::from_utf8_lossy(&cmdline)
        );
        // SAFETY: kill has no memory-safety preconditions; pid was checked to be the daemon.
        check(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) })
            .unwrap_or_else(|e| panic!("kill -9 {pid}: {e}"));
        // Gone, or a zombie nobody reaps (its parent `ckptfs mount` has exited): either way
        // its descriptors are closed.
        let start = Instant::now();
        loop {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            if matches!(state, None | Some("Z") | Some("X")) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "daemon {pid} still alive 30 s after SIGKILL: {stat}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.detach("after killing the daemon and a lazy unmount");
        pid
    }

    /// Detaches the mount lazily (`fusermount3 -u -z`, else `umount -l`) and marks the space
    /// unmounted; `what` names the situation in the failure message.
    fn detach(&mut self, what: &str) {
        for (cmd, flag) in [("fusermount3", "-z"), ("umount", "-l")] {
            if st_dev(&self.mnt) == st_dev(self.root.path()) {
                break;
            }
            let mut c = Command::new(cmd);
            if cmd == "fusermount3" {
                c.arg("-u");
            }
            let _ = c
                .arg(flag)
                .arg(&self.mnt)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        self.mounted = false;
        assert_eq!(
            st_dev(&self.mnt),
            st_dev(self.root.path()),
            "{} is still a mountpoint {what}",
            self.mnt.display()
        );
    }

    /// Detaches the mount (`fusermount3 -u -z`, else `umount -l`) without waiting for the
    /// daemon: with a descriptor still open in the mount, the daemon lives on, unmounted but
    /// holding the space, until that descriptor is closed. Leaves the space unmounted.
    pub fn lazy_unmount(&mut self) {
        assert!(self.mounted, "not mounted");
        self.detach("after a lazy unmount");
    }

    /// Waits until the daemon has answered every request the kernel has queued for this
    /// mount, including the RELEASEs that the kernel sends in the background after close(2)
    /// has returned: the condition a test means by "once the late releases have arrived".
    /// Reads the kernel's own count (`/sys/fs/fuse/connections/<minor>/waiting`, fusectl),
    /// mounting fusectl there first when the system has not (root only). Fails after 60 s.
    pub fn wait_requests_answered(&self) {
        assert!(self.mounted, "not mounted");
        let conns = Path::new("/sys/fs/fuse/connections");
        let dev = fs::metadata(&self.mnt)
            .unwrap_or_else(|e| panic!("stat {}: {e}", self.mnt.display()))
            .dev();
        let waiting = conns.join(libc::minor(dev).to_string()).join("waiting");
        if !waiting.exists() {
            let _ = Command::new("mount")
                .args(["-t", "fusectl", "fusectl"])
                .arg(conns)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        assert!(
            waiting.exists(),
            "{} is missing: these tests read the FUSE connection's request count from \
             fusectl (mount -t fusectl fusectl {}, as root)",
            waiting.display(),
            conns.display()
        );
        let start = Instant::now();
        loop {
            let text = fs::read_to_string(&waiting)
                .unwrap_or_else(|e| panic!("read {}: {e}", waiting.display()));
            let n: u64 = text
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{}: {text:?}", waiting.display()));
            if n == 0 {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the daemon still has {n} requests unanswered after 60 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `ckptfs stats <mountpoint> --json` (the backing dir when unmounted), read with the
    /// engine's own type: the JSON has one schema, the one the daemon writes it with.
    pub fn stats(&mut self) -> Report<StatsReport> {
        let target = self.target();
        self.stats_of(&target)
    }

    /// `ckptfs stats <path> --json` for an explicit path (mountpoint or backing dir).
    pub fn stats_of(&mut self, target: &Path) -> Report<StatsReport> {
        Report::read("stats", self.stats_json_of(target))
    }

    /// The stats JSON itself, for tests of its form.
    pub fn stats_json_of(&mut self, target: &Path) -> serde_json::Value {
        let args = vec![
            OsStr::new("stats").to_os_string(),
            target.as_os_str().to_os_string(),
            OsStr::new("--json").to_os_string(),
        ];
        let out = self.run_ok("stats", &args, STATS_TIMEOUT);
        let v: serde_json::Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("`ckptfs stats --json` printed non-JSON ({e}):\n{out}"));
        assert!(v.is_object(), "stats JSON is not an object: {v}");
        v
    }

    /// Whether the space is mounted now.
    pub fn is_mounted(&self) -> bool {
        self.mounted
    }

    /// Runs `ckptfs ARGS` and returns its stdout; panics (with stdout and stderr) when it fails.
    #[track_caller]
    pub fn ckptfs_ok(&mut self, args: &[&OsStr]) -> String {
        let (st, out, err) = self.ckptfs(args);
        let shown: Vec<OsString> = args.iter().map(|a| a.to_os_string()).collect();
        assert!(
            st.success(),
            "`ckptfs {}` failed ({st}):\nstdout:\n{out}\nstderr:\n{err}",
            join_args(&shown)
        );
        out
    }

    /// Runs `ckptfs ARGS` (which should include `--json`) and parses its stdout as JSON.
    #[track_caller]
    pub fn ckptfs_json(&mut self, args: &[&OsStr]) -> serde_json::Value {
        let out = self.ckptfs_ok(args);
        let shown: Vec<OsString> = args.iter().map(|a| a.to_os_string()).collect();
        serde_json::from_str(out.trim()).unwrap_or_else(|e| {
            panic!(
                "`ckptfs {}` printed non-JSON ({e}):\n{out}",
                join_args(&shown)
            )
        })
    }

    /// The mountpoint when mounted, else the backing directory: what `gc`, `stats` and
    /// `config` take.
    pub fn target(&self) -> PathBuf {
        if self.mounted {
            self.mnt.clone()
        } else {
            self.backing.clone()
        }
    }

    /// Revisions of `rel` (a path relative to the fs root): `ckptfs revisions MNT/rel --json`
    /// when mounted, `ckptfs revisions --space BACKING rel --json` when not. Panics when the
    /// command fails.
    #[track_caller]
    pub fn revisions(&mut self, rel: &str) -> Vec<Revision> {
        let v = match self.try_revisions_json(rel) {
            Ok(v) => v,
            Err(msg) => panic!("{msg}"),
        };
        parse_revisions(&v)
    }

    /// Like [`TestMount::revisions`] but returns the raw JSON, or the failure as a message.
    pub fn try_revisions_json(&mut self, rel: &str) -> Result<serde_json::Value, String> {
        let args: Vec<OsString> = if self.mounted {
            vec![
                "revisions".into(),
                self.mnt.join(rel).into_os_string(),
                "--json".into(),
            ]
        } else {
            vec![
                "revisions".into(),
                "--space".into(),
                self.backing.clone().into_os_string(),
                rel.into(),
                "--json".into(),
            ]
        };
        let refs: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        let (st, out, err) = self.ckptfs(&refs);
        if !st.success() {
            return Err(format!(
                "`ckptfs {}` failed ({st}):\nstdout:\n{out}\nstderr:\n{err}",
                join_args(&args)
            ));
        }
        serde_json::from_str(out.trim()).map_err(|e| {
            format!(
                "`ckptfs {}` printed non-JSON ({e}):\n{out}",
                join_args(&args)
            )
        })
    }

    fn restore_args(&self, rel: &str, id: u64, to: Option<&Path>) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["restore".into()];
        if self.mounted {
            args.push(self.mnt.join(rel).into_os_string());
        } else {
            args.push("--space".into());
            args.push(self.backing.clone().into_os_string());
            args.push(rel.into());
        }
        args.push("--revision".into());
        args.push(id.to_string().into());
        if let Some(to) = to {
            args.push("--to".into());
            args.push(to.as_os_str().to_os_string());
        }
        args
    }

    /// `ckptfs restore ... --revision id --to FILE` (through the mount when mounted, with
    /// `--space` when not).
    #[track_caller]
    pub fn restore_to(&mut self, rel: &str, id: u64, to: &Path) {
        let args = self.restore_args(rel, id, Some(to));
        let refs: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        self.ckptfs_ok(&refs);
    }

    /// `ckptfs restore ... --revision id` (no `--to`): revision `id` becomes current again.
    #[track_caller]
    pub fn restore(&mut self, rel: &str, id: u64) {
        let args = self.restore_args(rel, id, None);
        let refs: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        self.ckptfs_ok(&refs);
    }

    /// `ckptfs gc TARGET [--dry-run] --json` on the mountpoint (mounted) or backing dir,
    /// read with the engine's type.
    #[track_caller]
    pub fn gc(&mut self, dry_run: bool) -> Report<GcReport> {
        let target = self.target();
        let mut args: Vec<&OsStr> = vec![OsStr::new("gc"), target.as_os_str()];
        if dry_run {
            args.push(OsStr::new("--dry-run"));
        }
        args.push(OsStr::new("--json"));
        let r: Report<GcReport> = Report::read("gc", self.ckptfs_json(&args));
        assert_eq!(r.dry_run, dry_run, "gc `dry_run`: {r}");
        r
    }

    /// `ckptfs config BACKING [OPTIONS] --json` (the backing dir, mounted or not).
    #[track_caller]
    pub fn config(&mut self, options: &[&str]) -> serde_json::Value {
        let backing = self.backing.clone();
        let mut args: Vec<&OsStr> = vec![OsStr::new("config"), backing.as_os_str()];
        args.extend(options.iter().map(OsStr::new));
        args.push(OsStr::new("--json"));
        let v = self.ckptfs_json(&args);
        assert!(v.is_object(), "config JSON is not an object: {v}");
        v
    }

    /// `MNT/.ckptfs/revisions/<rel>`: the read-only view of a path's revisions.
    pub fn view_dir(&self, rel: &str) -> PathBuf {
        self.mnt.join(".ckptfs/revisions").join(rel)
    }

    /// `MNT/.ckptfs/revisions/<rel>/<id>`.
    pub fn view_path(&self, rel: &str, id: u64) -> PathBuf {
        self.view_dir(rel).join(id.to_string())
    }

    /// Last lines of the daemon's and commands' logs, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut names: Vec<PathBuf> = fs::read_dir(self.root.path())
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        names.retain(|p| {
            p.extension()
                .is_some_and(|e| e == "stderr" || e == "stdout")
        });
        // The daemon may keep its own log in the backing dir.
        if let Ok(rd) = fs::read_dir(&self.backing) {
            names.extend(
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "log")),
            );
        }
        names.sort();
        let mut s = String::new();
        for p in names {
            let text = fs::read_to_string(&p).unwrap_or_default();
            if text.trim().is_empty() {
                continue;
            }
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            s.push_str(&format!(
                "--- {} ---\n{}\n",
                p.file_name().unwrap_or_default().to_string_lossy(),
                tail.join("\n")
            ));
        }
        s
    }
}

impl Default for TestMount {
    fn default() -> Self {
        TestMount::new()
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "ckptfs logs from {}:\n{}",
                self.root.path().display(),
                self.log_tail()
            );
        }
        if self.mounted {
            let args = vec![
                OsStr::new("umount").to_os_string(),
                self.mnt.clone().into_os_string(),
            ];
            let ok =
                matches!(self.run("umount", &args, UMOUNT_TIMEOUT), Ok((st, _, _)) if st.success());
            if !ok {
                eprintln!("`ckptfs umount` failed; falling back to fusermount3 -u -z");
                let _ = Command::new("fusermount3")
                    .args([OsStr::new("-u"), OsStr::new("-z"), self.mnt.as_os_str()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                if st_dev(&self.mnt) != st_dev(self.root.path()) {
                    let _ = Command::new("umount")
                        .args([OsStr::new("-l"), self.mnt.as_os_str()])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                }
            }
            self.mounted = false;
        }
        if self.backing_fs && !self.mounted {
            // The daemon may still be closing its files there for a moment after `umount`.
            for _ in 0..50 {
                let st = Command::new("umount")
                    .arg(&self.backing)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                if matches!(st, Ok(s) if s.success()) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if self.backing_fs && st_dev(&self.backing) != st_dev(self.root.path()) {
            eprintln!(
                "{} is still mounted; leaving {} in place",
                self.backing.display(),
                self.root.path().display()
            );
            self.root.keep();
        }
        // Never recurse into a still-mounted filesystem when the TempDir is removed.
        if st_dev(&self.mnt).is_some() && st_dev(&self.mnt) != st_dev(self.root.path()) {
            eprintln!(
                "{} is still mounted; leaving {} in place",
                self.mnt.display(),
                self.root.path().display()
            );
            self.root.keep();
        }
    }
}

fn join_args(args: &[OsString]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A report the CLI printed as JSON (`stats`, `gc`), read with the engine's serde type, so
/// daemon, CLI and tests share one schema; prints as the JSON it came from.
#[derive(Clone)]
pub struct Report<T> {
    pub report: T,
    json: serde_json::Value,
}

impl<T: serde::de::DeserializeOwned> Report<T> {
    #[track_caller]
    fn read(what: &str, json: serde_json::Value) -> Report<T> {
        let report = serde_json::from_value(json.clone()).unwrap_or_else(|e| {
            panic!("`ckptfs {what} --json` does not match the engine's type ({e}):\n{json}")
        });
        Report { report, json }
    }
}

impl<T> Report<T> {
    pub fn json(&self) -> &serde_json::Value {
        &self.json
    }
}

impl<T> std::ops::Deref for Report<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.report
    }
}

impl<T> std::fmt::Display for Report<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.json)
    }
}

impl<T> std::fmt::Debug for Report<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.json)
    }
}

/// Whether `CKPTFS_REQUIRE` (a comma-separated list: `gluster`, `numpy`, `fuse3`, ...)
/// names `resource`: then a test that would skip for want of it fails instead. This is the
/// one skip policy of the integration tests: a test skips only through `skip`, naming the
/// resource it lacks; `.ci/run` requires everything it installs. (The GPU tests of the
/// kernels crate read the same variable for `gpu`.)
pub fn required(resource: &str) -> bool {
    std::env::var("CKPTFS_REQUIRE")
        .map(|v| v.split(',').any(|r| r.trim() == resource))
        .unwrap_or(false)
}

/// Skips a test that needs `resource`, which is absent for `why`: says so loudly (the
/// line starts with SKIPPED), or fails the test when `CKPTFS_REQUIRE` names the resource.
pub fn skip(test: &str, resource: &str, why: &str) {
    assert!(
        !required(resource),
        "{test}: CKPTFS_REQUIRE names {resource}, which is not available: {why}"
    );
    eprintln!("SKIPPED {test}: no {resource}: {why}");
    println!("SKIPPED {test}: no {resource}: {why}");
}

/// The two client mounts of one GlusterFS volume (`scripts/gluster.sh start` prints them
/// as `CKPTFS_GLUSTER_CLIENTS=A:B`, and `.ci/run` exports that), or why there are none.
pub fn gluster_clients() -> Result<Vec<PathBuf>, String> {
    let v = std::env::var("CKPTFS_GLUSTER_CLIENTS").map_err(|_| {
        std::env::var("CKPTFS_GLUSTER_UNAVAILABLE").unwrap_or_else(|_| {
            "CKPTFS_GLUSTER_CLIENTS is not set (`scripts/gluster.sh start` makes a volume, \
             mounts it twice and prints the value)"
                .into()
        })
    })?;
    let clients: Vec<PathBuf> = v.split(':').map(PathBuf::from).collect();
    if clients.len() < 2 {
        return Err(format!(
            "CKPTFS_GLUSTER_CLIENTS={v} names fewer than two clients"
        ));
    }
    for c in &clients {
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let want = c.to_string_lossy();
        if !mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(&want) && l.contains("fuse.glusterfs"))
        {
            return Err(format!("{} is not a GlusterFS mount", c.display()));
        }
    }
    Ok(clients)
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`): what the memory tests read of
/// the daemon.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// Seed for a randomized test: `$CKPTFS_SEED` when set, else `default`. Printed so a failing
/// run can be replayed.
pub fn test_seed(test: &str, default: u64) -> u64 {
    let seed = std::env::var("CKPTFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("{test}: seed {seed} (replay with CKPTFS_SEED={seed})");
    seed
}

/// Whole seconds of the system clock (what the daemon stamps commits and removals with).
pub fn unix_secs_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_secs()
}

/// Waits until the system clock reads more than `secs` whole seconds: for a test that needs
/// a timestamp the daemon takes next to differ from one it took before (a policy age, a
/// commit time). Polls the clock rather than sleeping a fixed time; fails if the clock has
/// not got there 60 s after it should have (a clock that stopped or went back).
pub fn wait_for_clock_past(secs: u64) {
    let start = Instant::now();
    let limit = Duration::from_secs(secs.saturating_sub(unix_secs_now()) + 60);
    while unix_secs_now() <= secs {
        assert!(
            start.elapsed() < limit,
            "the system clock did not pass {secs} (now {})",
            unix_secs_now()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A well-mixed 64-bit value of two inputs (seed, index): test data and random choices that
/// depend only on what names them.
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(0x632b_e59b_d9b4_e019);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Incompressible pseudo-random bytes that depend only on (seed, absolute offset), so any range
/// of a huge file can be regenerated without keeping it in memory.
pub fn fill_pattern(seed: u64, offset: u64, buf: &mut [u8]) {
    let key = splitmix64(seed);
    let mut pos = offset;
    let mut i = 0;
    while i < buf.len() {
        let word = splitmix64(key ^ (pos / 8)).to_le_bytes();
        let start = (pos % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[start..start + n]);
        i += n;
        pos += n as u64;
    }
}

/// `len` bytes of [`fill_pattern`] from offset 0.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(seed, 0, &mut v);
    v
}

/// Where two byte strings first differ, as a short message (None when equal).
pub fn first_difference(actual: &[u8], expected: &[u8]) -> Option<String> {
    if actual == expected {
        return None;
    }
    let common = actual.len().min(expected.len());
    let at = (0..common)
        .find(|&i| actual[i] != expected[i])
        .unwrap_or(common);
    let show = |b: &[u8]| {
        let end = (at + 16).min(b.len());
        format!("{:02x?}", &b[at.min(end)..end])
    };
    Some(format!(
        "len actual {} expected {}; first difference at offset {at}: actual {} expected {}",
        actual.len(),
        expected.len(),
        show(actual),
        show(expected)
    ))
}

/// Reads `path` whole and panics with the first differing offset when it is not `expected`.
#[track_caller]
pub fn assert_file_eq(path: &Path, expected: &[u8]) {
    let actual = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    if let Some(d) = first_difference(&actual, expected) {
        panic!("{}: content differs: {d}", path.display());
    }
}

/// Streams `path` and compares it with `expected(offset, buf)` in 1 MiB pieces.
#[track_caller]
pub fn assert_file_matches(path: &Path, len: u64, mut expected: impl FnMut(u64, &mut [u8])) {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    assert_eq!(meta.len(), len, "{}: size", path.display());
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut got = vec![0u8; 1 << 20];
    let mut want = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < len {
        let n = ((len - off) as usize).min(got.len());
        f.read_exact(&mut got[..n])
            .unwrap_or_else(|e| panic!("{}: read at {off}: {e}", path.display()));
        expected(off, &mut want[..n]);
        if let Some(d) = first_difference(&got[..n], &want[..n]) {
            panic!(
                "{}: content differs in the piece at {off}: {d}",
                path.display()
            );
        }
        off += n as u64;
    }
    let mut extra = [0u8; 1];
    let n = f.read(&mut extra).expect("read at EOF");
    assert_eq!(n, 0, "{}: readable past its size {len}", path.display());
}

/// The errno of a failed call, or the value.
pub fn errno<T>(r: io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// A path as a C string for libc calls.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path has a NUL byte")
}

/// Converts a libc return value (-1 on error) into io::Result.
pub fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Sorted relative paths of everything under `dir` (directories included).
pub fn list_tree(dir: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let rd = fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()));
        for e in rd {
            let e = e.expect("dir entry");
            let p = e.path();
            out.push(p.strip_prefix(base).expect("under base").to_path_buf());
            if e.file_type().expect("file type").is_dir() {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// One entry of `ckptfs revisions --json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Revision {
    pub id: u64,
    pub committed_unix: f64,
    /// RFC 3339 with the local offset; checked against `committed_unix` when parsed.
    pub committed: String,
    pub size: u64,
    pub new_bytes: u64,
    pub current: bool,
}

/// Seconds since the epoch of an RFC 3339 time `YYYY-MM-DDTHH:MM:SS[.fff](Z|+HH:MM|-HH:MM)`;
/// None when it is not one. Written out here so the test does not share the CLI's code.
pub fn rfc3339_unix(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac = 0.0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        frac = format!("0.{}", &s[start..i]).parse().ok()?;
    }
    let off = match b.get(i)? {
        b'Z' if i + 1 == b.len() => 0,
        c @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let o = num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60;
            if *c == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    // Days from 1970-01-01 to y-mo-d (proleptic Gregorian; Howard Hinnant's algorithm).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + mi * 60 + sec - off) as f64 + frac)
}

/// Parses the `ckptfs revisions --json` array; panics naming what is missing.
#[track_caller]
pub fn parse_revisions(v: &serde_json::Value) -> Vec<Revision> {
    let arr = v
        .as_array()
        .unwrap_or_else(|| panic!("`ckptfs revisions --json` is not an array: {v}"));
    arr.iter()
        .map(|e| {
            let u = |k: &str| {
                e.get(k)
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or_else(|| panic!("revision entry has no integer `{k}`: {e}"))
            };
            let committed_unix = e
                .get("committed_unix")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or_else(|| panic!("revision entry has no number `committed_unix`: {e}"));
            let committed = e
                .get("committed")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_else(|| panic!("revision entry has no string `committed`: {e}"))
                .to_string();
            let t = rfc3339_unix(&committed)
                .unwrap_or_else(|| panic!("`committed` is not RFC 3339 with an offset: {e}"));
            assert!(
                (t - committed_unix).abs() < 0.002,
                "`committed` {committed} is not `committed_unix` {committed_unix}: {e}"
            );
            Revision {
                id: u("id"),
                committed_unix,
                committed,
                size: u("size"),
                new_bytes: u("new_bytes"),
                current: e
                    .get("current")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or_else(|| panic!("revision entry has no bool `current`: {e}")),
            }
        })
        .collect()
}

/// Closes `f` and reports close(2)'s error (dropping a File ignores it; ckptfs reports ENOSPC
/// and EIO at close).
pub fn close_checked(f: fs::File) -> io::Result<()> {
    use std::os::unix::io::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: fd was just released by the File, so it is open and owned here.
    check(unsafe { libc::close(fd) }).map(|_| ())
}

/// open(O_WRONLY|O_CREAT|O_TRUNC) + sequential writes of `len` bytes produced by
/// `fill(offset, buf)` in `piece`-byte writes + a checked close. Every failure is returned.
pub fn write_file_with(
    path: &Path,
    len: u64,
    piece: usize,
    mut fill: impl FnMut(u64, &mut [u8]),
) -> io::Result<()> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let mut buf = vec![0u8; piece.max(1)];
    let mut off = 0u64;
    while off < len {
        let n = ((len - off) as usize).min(buf.len());
        fill(off, &mut buf[..n]);
        f.write_all(&buf[..n])?;
        off += n as u64;
    }
    close_checked(f)
}

/// Writes `data` whole (create/truncate, 1 MiB writes) and checks close.
pub fn write_file_checked(path: &Path, data: &[u8]) -> io::Result<()> {
    write_file_with(path, data.len() as u64, 1 << 20, |off, buf| {
        let o = off as usize;
        buf.copy_from_slice(&data[o..o + buf.len()]);
    })
}

/// statvfs(2) of `path`: (f_bavail * f_frsize, f_blocks * f_frsize).
pub fn statvfs_bytes(path: &Path) -> (u64, u64) {
    let c = cpath(path);
    // SAFETY: statvfs fills the zeroed struct; c is a valid C string.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(c.as_ptr(), &mut sv) })
        .unwrap_or_else(|e| panic!("statvfs {}: {e}", path.display()));
    let fr = sv.f_frsize as u64;
    (sv.f_bavail as u64 * fr, sv.f_blocks as u64 * fr)
}

/// Slots of the spaces `TestMount::with_targets` formats: `None` (one) except in the
/// `targets_on_slots` test binary (3) or with `CKPTFS_TARGETS_SLOTS=N` (N > 1), which run
/// the target suite again on slots over targets (the mount claims one slot; the others
/// stay free).
pub fn targets_slots() -> Option<u32> {
    if let Some(n) = std::env::var("CKPTFS_TARGETS_SLOTS")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| *n > 1)
    {
        return Some(n);
    }
    std::env::current_exe()
        .is_ok_and(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("targets_on_slots"))
        })
        .then_some(3)
}

/// Runs `cmd` with its output piped and reads its stderr until a line containing `needle`
/// (or its end), so a test can act at the moment the command says something (an event,
/// not a sleep). Returns the child, still running, and what it said so far (with whatever
/// was read ahead past that line); its stdout and the rest of its stderr are read by
/// `Child::wait_with_output`.
pub fn spawn_until_said(
    cmd: &mut std::process::Command,
    needle: &str,
) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    let mut err = BufReader::new(child.stderr.take().expect("piped stderr"));
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).expect("read stderr") == 0 {
            break;
        }
        said.push_str(&line);
        if line.contains(needle) {
            break;
        }
    }
    // What was read ahead past the line goes with what it said; the rest of stderr is
    // `wait_with_output`'s.
    said.push_str(&String::from_utf8_lossy(err.buffer()));
    child.stderr = Some(err.into_inner());
    (child, said)
}

/// Waits for a child of `spawn_until_said`: (its exit status, its stdout then the rest of its
/// stderr).
pub fn finish_said(child: std::process::Child) -> (std::process::ExitStatus, String) {
    let out = child.wait_with_output().expect("wait for the command");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

/// A count from the environment (a stress test's knob), `default` where unset or unparsable.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
