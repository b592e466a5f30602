//! Several daemons on one machine standing in for several nodes: one multi-slot backing
//! directory, one mountpoint per "node". Every mount is undone on drop, stopped daemons are
//! continued first, and on a panic the space's log is printed.

use crate::{ckptfs_bin, require_fuse, run_logged, TempDir, FORMAT_TIMEOUT, MOUNT_TIMEOUT};
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Targets and redundancy of a cluster over erasure-coded targets: 3+2 over six, so a
/// rebuild has a healthy target outside every segment's domains to move a lost shard to.
pub const TARGETS: usize = 6;
pub const REDUNDANCY: &str = "3+2";

/// Whether clusters are formatted over erasure-coded targets (`--target` x `TARGETS`,
/// `--redundancy REDUNDANCY`) instead of one data file: in the `slots_on_targets` test
/// binary, which runs the whole slot suite on that layout, or with
/// `CKPTFS_CLUSTER_TARGETS=1` for any other.
pub fn on_targets() -> bool {
    std::env::var_os("CKPTFS_CLUSTER_TARGETS").is_some_and(|v| v == "1")
        || std::env::current_exe().is_ok_and(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("slots_on_targets"))
        })
}

pub struct Node {
    pub mnt: PathBuf,
    pub pid: Option<u32>,
    stopped: bool,
    /// A daemon run in the foreground under a tracer (`mount_traced`): waited for at its
    /// unmount.
    traced: Option<std::process::Child>,
}

pub struct Cluster {
    root: TempDir,
    pub backing: PathBuf,
    /// The backing directory as each node reaches it: the same directory, through each
    /// node's own client of a shared filesystem (`on_clients`), or `backing` for all.
    node_backing: Vec<PathBuf>,
    /// A space on a shared filesystem: removed at drop (it is not under `root`).
    shared_dir: Option<PathBuf>,
    pub nodes: Vec<Node>,
    /// The lease every mount takes (`--lease`).
    pub lease: Duration,
    step: u64,
    /// Formatted with one slot: the default kind of space (no slot table; a journal).
    single_slot: bool,
}

impl Cluster {
    /// Formats a space with `slots` slots and makes `nodes` empty mountpoints (nothing
    /// mounted).
    pub fn new(slots: u32, size: &str, nodes: usize, lease: Duration) -> Cluster {
        Self::on_clients(slots, size, nodes, lease, &[])
    }

    /// `new`, with the space on a shared filesystem: `clients` are one directory of it as
    /// different clients mount it (GlusterFS mounted twice); node `i` reaches the space
    /// through `clients[i % len]`. With no clients, the space is in a local directory.
    pub fn on_clients(
        slots: u32,
        size: &str,
        nodes: usize,
        lease: Duration,
        clients: &[PathBuf],
    ) -> Cluster {
        require_fuse();
        let root = TempDir::new("cluster");
        let unique = root
            .path()
            .file_name()
            .expect("temp dir name")
            .to_os_string();
        let (backing, node_backing, shared_dir) = match clients {
            [] => {
                let b = root.path().join("backing");
                (b.clone(), vec![b; nodes], None)
            }
            _ => {
                let within = |c: &PathBuf| c.join(&unique).join("backing");
                fs::create_dir_all(clients[0].join(&unique)).expect("a directory on the client");
                (
                    within(&clients[0]),
                    (0..nodes)
                        .map(|i| within(&clients[i % clients.len()]))
                        .collect(),
                    Some(clients[0].join(&unique)),
                )
            }
        };
        let mut c = Cluster {
            nodes: (0..nodes)
                .map(|i| {
                    let mnt = root.path().join(format!("node{i}"));
                    fs::create_dir(&mnt).expect("mountpoint");
                    Node {
                        mnt,
                        pid: None,
                        stopped: false,
                        traced: None,
                    }
                })
                .collect(),
            root,
            backing,
            node_backing,
            shared_dir,
            lease,
            step: 0,
            single_slot: slots == 1,
        };
        let mut args: Vec<OsString> = vec![
            "format".into(),
            c.backing.clone().into(),
            "--size".into(),
            size.into(),
            "--slots".into(),
            slots.to_string().into(),
        ];
        if on_targets() {
            for t in 0..TARGETS {
                args.push("--target".into());
                args.push(c.target(t).into());
            }
            args.push("--redundancy".into());
            args.push(REDUNDANCY.into());
        }
        let (st, out, err) = c.ckptfs(&args);
        assert!(st.success(), "format --slots {slots}: {out}{err}");
        c
    }

    /// Target `t`'s directory, of a cluster over targets (`on_targets`): beside the
    /// backing directory, so on the shared filesystem too where the space is (every node
    /// reaches the targets by the paths the targets table holds: the first client's).
    pub fn target(&self, t: usize) -> PathBuf {
        self.backing.with_file_name("targets").join(format!("t{t}"))
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Runs `ckptfs ARGS`; (status, stdout, stderr).
    pub fn ckptfs(&mut self, args: &[OsString]) -> (ExitStatus, String, String) {
        self.step += 1;
        let name = format!("{:03}-cmd", self.step);
        let mut cmd = Command::new(ckptfs_bin());
        cmd.args(args);
        run_logged(&mut cmd, self.root.path(), &name, FORMAT_TIMEOUT)
            .unwrap_or_else(|e| panic!("ckptfs {args:?}: {e}"))
    }

    /// `node`'s mountpoint joined with `rel`.
    /// Makes `node`'s daemon forget the decoded chunks it keeps (the `drop_caches`
    /// control); the kernel drops a file's pages at each open by itself.
    pub fn drop_caches(&self, node: usize) {
        drop_daemon_caches(&self.nodes[node].mnt);
    }

    /// `node`'s mountpoint.
    pub fn mountpoint(&self, node: usize) -> &Path {
        &self.nodes[node].mnt
    }

    /// The `ckptfs mount` arguments that mount `node` with the cluster's lease.
    pub fn mount_args(&self, node: usize) -> Vec<OsString> {
        vec![
            "mount".into(),
            "--lease".into(),
            format!("{}ms", self.lease.as_millis()).into(),
            self.node_backing[node].clone().into(),
            self.nodes[node].mnt.clone().into(),
        ]
    }

    pub fn path(&self, node: usize, rel: &str) -> PathBuf {
        self.nodes[node].mnt.join(rel)
    }

    /// Tries to mount the space at `node`'s mountpoint with `extra` options (and the
    /// cluster's lease); (status, stdout, stderr).
    pub fn try_mount(&mut self, node: usize, extra: &[&str]) -> (ExitStatus, String, String) {
        self.try_mount_env(node, extra, &[])
    }

    /// `try_mount` with environment variables for the daemon (fault points).
    pub fn try_mount_env(
        &mut self,
        node: usize,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (ExitStatus, String, String) {
        let mut args: Vec<OsString> = vec!["mount".into()];
        args.extend(extra.iter().map(OsString::from));
        args.push("--lease".into());
        args.push(format!("{}ms", self.lease.as_millis()).into());
        args.push(self.node_backing[node].clone().into());
        args.push(self.nodes[node].mnt.clone().into());
        self.step += 1;
        let name = format!("{:03}-mount{node}", self.step);
        let mut cmd = Command::new(ckptfs_bin());
        cmd.args(&args);
        cmd.envs(env.iter().copied());
        let r = run_logged(&mut cmd, self.root.path(), &name, MOUNT_TIMEOUT)
            .unwrap_or_else(|e| panic!("ckptfs {args:?}: {e}"));
        if r.0.success() {
            self.nodes[node].pid = Some(self.pid_of(node));
        }
        r
    }

    /// Mounts `nodes` all at the same moment, as a job's prolog does on every node (each
    /// `ckptfs mount` started once all are ready to start), node `n` with the options
    /// `extra(n)`; (status, stdout, stderr) each.
    pub fn mount_at_once(
        &mut self,
        nodes: &[usize],
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Vec<(ExitStatus, String, String)> {
        let cmds: Vec<(Command, String)> = nodes
            .iter()
            .map(|&node| {
                let mut cmd = Command::new(ckptfs_bin());
                cmd.arg("mount").args(extra(node));
                cmd.arg("--lease")
                    .arg(format!("{}ms", self.lease.as_millis()));
                cmd.arg(&self.node_backing[node]).arg(&self.nodes[node].mnt);
                self.step += 1;
                (cmd, format!("{:03}-mount{node}", self.step))
            })
            .collect();
        let dir = self.root.path().to_path_buf();
        let barrier = std::sync::Barrier::new(cmds.len());
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = cmds
                .into_iter()
                .map(|(mut cmd, name)| {
                    let (dir, barrier) = (&dir, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        run_logged(&mut cmd, dir, &name, MOUNT_TIMEOUT)
                            .unwrap_or_else(|e| panic!("ckptfs mount: {e}"))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (&node, r) in nodes.iter().zip(&results) {
            if r.0.success() {
                self.nodes[node].pid = Some(self.pid_of(node));
            }
        }
        results
    }

    /// Mounts `node` (which must succeed); returns the slot it claimed.
    pub fn mount(&mut self, node: usize, extra: &[&str]) -> u32 {
        let (st, out, err) = self.try_mount(node, extra);
        assert!(
            st.success(),
            "mount node {node}: {out}{err}\n{}",
            self.log_tail()
        );
        self.slot_of(node)
    }

    /// `ckptfs slots --json`.
    pub fn slots(&mut self) -> serde_json::Value {
        let (st, out, err) =
            self.ckptfs(&["slots".into(), self.backing.clone().into(), "--json".into()]);
        assert!(st.success(), "ckptfs slots: {out}{err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("slots json")["slots"].clone()
    }

    fn row_of(&mut self, node: usize) -> serde_json::Value {
        let want = self.nodes[node].mnt.to_string_lossy().into_owned();
        let rows = self.slots();
        rows.as_array()
            .expect("slots array")
            .iter()
            .filter(|r| r["mountpoint"] == want.as_str() && r["state"] != "released")
            .max_by_key(|r| r["epoch"].as_u64())
            .cloned()
            .unwrap_or_else(|| panic!("no slot is mounted at {want}: {rows:#}"))
    }

    /// The slot `node`'s mount holds.
    pub fn slot_of(&mut self, node: usize) -> u32 {
        if self.single_slot {
            return 0;
        }
        self.row_of(node)["slot"].as_u64().expect("slot") as u32
    }

    fn pid_of(&mut self, node: usize) -> u32 {
        if self.single_slot {
            // A single-slot space has no slot table: its lock file names the daemon.
            return crate::daemon_pid_of(&self.node_backing[node]);
        }
        self.row_of(node)["pid"].as_u64().expect("pid") as u32
    }

    pub fn unmount(&mut self, node: usize) {
        let mnt = self.nodes[node].mnt.clone();
        let (st, out, err) = self.ckptfs(&["umount".into(), mnt.into()]);
        assert!(st.success(), "umount node {node}: {out}{err}");
        self.nodes[node].pid = None;
        if let Some(mut child) = self.nodes[node].traced.take() {
            let _ = child.wait();
        }
    }

    /// `ckptfs umount` of a mount that cannot make everything durable (a fenced one): it
    /// unmounts and exits non-zero; returns what it said.
    pub fn unmount_failing(&mut self, node: usize) -> String {
        let mnt = self.nodes[node].mnt.clone();
        let (st, out, err) = self.ckptfs(&["umount".into(), mnt.into()]);
        assert!(!st.success(), "umount node {node} should fail: {out}{err}");
        self.nodes[node].pid = None;
        format!("{out}{err}")
    }

    /// Mounts `node` with its daemon in the foreground under `tracer` (a command line such
    /// as `strace -f -o LOG`), so every system call the daemon makes is seen. Returns once
    /// the mount is ready; the tracer exits with the daemon at `unmount`.
    pub fn mount_traced(&mut self, node: usize, tracer: &[&str]) {
        let mut cmd = Command::new(tracer[0]);
        cmd.args(&tracer[1..])
            .arg(ckptfs_bin())
            .args(["mount", "--foreground", "--lease"])
            .arg(format!("{}ms", self.lease.as_millis()))
            .arg(&self.node_backing[node])
            .arg(&self.nodes[node].mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                fs::File::create(self.root.path().join(format!("traced-{node}.stderr")))
                    .expect("stderr file"),
            );
        let child = cmd.spawn().expect("start the traced daemon");
        self.nodes[node].traced = Some(child);
        let dev = |p: &Path| fs::metadata(p).ok().map(|m| m.dev());
        let start = Instant::now();
        while dev(&self.nodes[node].mnt) == dev(self.root.path()) {
            assert!(
                start.elapsed() < MOUNT_TIMEOUT,
                "the traced daemon did not mount: {}",
                fs::read_to_string(self.root.path().join(format!("traced-{node}.stderr")))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.nodes[node].pid = Some(self.pid_of(node));
    }

    fn signal(&mut self, node: usize, sig: libc::c_int) {
        let pid = self.nodes[node].pid.expect("node is mounted");
        // SAFETY: kill has no memory-safety preconditions; pid is the node's daemon.
        assert_eq!(
            unsafe { libc::kill(pid as i32, sig) },
            0,
            "kill {sig} {pid}"
        );
    }

    /// Whether `node`'s daemon is stopped (SIGSTOP, or a fault point that stopped itself).
    pub fn is_stopped(&self, node: usize) -> bool {
        let Some(pid) = self.nodes[node].pid else {
            return false;
        };
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next())
            == Some("T")
    }

    /// Marks `node`'s daemon as stopped by itself (a fault point), so `resume` and the
    /// cluster's drop continue it.
    pub fn stopped_by_fault(&mut self, node: usize) {
        self.nodes[node].stopped = true;
    }

    /// The raw bytes of slot `slot`'s two header copies in the slot table.
    pub fn header_pair(&self, slot: u32) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let f = fs::File::open(self.backing.join("slots/headers")).expect("slot table");
        let mut b = vec![0u8; 8192];
        f.read_exact_at(&mut b, 4096 + slot as u64 * 8192)
            .expect("read a header pair");
        b
    }

    /// SIGSTOP `node`'s daemon (a frozen, not dead, node). Nothing may touch its mount
    /// until `resume`.
    pub fn freeze(&mut self, node: usize) {
        self.signal(node, libc::SIGSTOP);
        self.nodes[node].stopped = true;
    }

    pub fn resume(&mut self, node: usize) {
        self.signal(node, libc::SIGCONT);
        self.nodes[node].stopped = false;
    }

    /// SIGKILL `node`'s daemon, wait for it to be gone, and detach its dead mount.
    pub fn kill(&mut self, node: usize) {
        self.kill_leaving_mount(node);
        detach(&self.nodes[node].mnt, self.root.path());
    }

    /// SIGKILL `node`'s daemon and wait for it to be gone, leaving its dead mount in place
    /// (`ENOTCONN` at the mountpoint), as a node whose daemon was killed has it.
    pub fn kill_leaving_mount(&mut self, node: usize) {
        self.signal(node, libc::SIGKILL);
        let pid = self.nodes[node].pid.take().expect("pid");
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
            assert!(start.elapsed() < Duration::from_secs(30), "{pid} survives");
            std::thread::sleep(Duration::from_millis(5));
        }
        self.nodes[node].stopped = false;
    }

    /// Waits until `slot`'s lease has run out by the rule a taker applies
    /// (`slots::is_live`: its header's last renewal, plus the lease, plus the clock-skew
    /// margin), read from the header itself: the event a takeover waits for, not a guess
    /// at how long it takes.
    pub fn wait_lease_out(&self, slot: u32) {
        use ckptfs_engine::format::{SlotHeader, SlotId};
        use ckptfs_engine::slots::{is_live, now_unix_ns};
        let limit = self.lease * 4 + Duration::from_secs(30);
        let start = Instant::now();
        loop {
            let pair = self.header_pair(slot);
            let h = SlotHeader::newest(&pair, SlotId(slot)).expect("a slot header that decodes");
            if !is_live(&h, now_unix_ns()) {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "slot {slot}'s lease still runs after {limit:?}: {h:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.backing.join("daemon.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

fn detach(mnt: &Path, parent: &Path) {
    let dev = |p: &Path| fs::metadata(p).ok().map(|m| m.dev());
    for (cmd, flag) in [("fusermount3", "-z"), ("umount", "-l")] {
        if dev(mnt) == dev(parent) {
            return;
        }
        let mut c = Command::new(cmd);
        if cmd == "fusermount3" {
            c.arg("-u");
        }
        let _ = c
            .arg(flag)
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "daemon.log of {}:\n{}",
                self.backing.display(),
                self.log_tail()
            );
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].stopped {
                self.resume(i);
            }
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].pid.is_some() {
                let mnt = self.nodes[i].mnt.clone();
                let (st, _, _) = self.ckptfs(&["umount".into(), mnt.clone().into()]);
                if !st.success() {
                    detach(&mnt, self.root.path());
                }
            }
            if let Some(mut child) = self.nodes[i].traced.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let dev = |p: &Path| fs::metadata(p).ok().map(|m| m.dev());
        if self
            .nodes
            .iter()
            .any(|n| dev(&n.mnt) != dev(self.root.path()))
        {
            eprintln!(
                "a node is still mounted; leaving {}",
                self.root.path().display()
            );
            self.root.keep();
        } else if let Some(d) = &self.shared_dir {
            let _ = fs::remove_dir_all(d);
        }
    }
}

/// The `drop_caches` control of the daemon mounted at `mnt` (a setxattr on its root).
pub fn drop_daemon_caches(mnt: &Path) {
    if let Err(e) = set_control(mnt, "drop_caches", b"1") {
        panic!("drop_caches on {}: {e}", mnt.display());
    }
}

/// Sets the control `user.ckptfs.NAME` of the daemon mounted at `mnt` to `value` (a
/// setxattr on its root).
pub fn set_control(mnt: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mnt.as_os_str().as_bytes()).expect("no NUL");
    let name = std::ffi::CString::new(format!("user.ckptfs.{name}")).expect("no NUL");
    // SAFETY: both strings are NUL-terminated and live across the call, as does `value`.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Moves the clock of the daemon mounted at `mnt` forward by `d` (the `clock` control; the
/// daemon must have been started with `CKPTFS_TEST_CLOCK=1`): what a test does instead of
/// sleeping through an interval the daemon measures.
pub fn advance_daemon_clock(mnt: &Path, d: std::time::Duration) {
    let v = format!("{}", d.as_secs_f64());
    if let Err(e) = set_control(mnt, "clock", v.as_bytes()) {
        panic!(
            "clock +{v} s on {} (was the daemon started with CKPTFS_TEST_CLOCK=1?): {e}",
            mnt.display()
        );
    }
}
