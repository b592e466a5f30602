//! A FUSE filesystem that does nothing: one directory whose files take writes (the bytes are
//! dropped, only the size is kept) and serve zeros up to their size. What it reaches is the
//! limit of the kernel's FUSE path on this machine, the ceiling for any daemon, ckptfs included.
//!
//! It negotiates what ckptfs does (mount/src/fuse.rs): the same request size, readahead and
//! atomic O_TRUNC, direct I/O with parallel writes on write-only opens and the page cache for
//! the rest, the same mount options and FUSE thread count, so the kernel takes the same path.
//!
//! The sink runs as a child process (`ckptfs-bench sink MNT`), as a daemon would, so its CPU
//! time is measured like the daemon's. `SinkMount` is the parent's guard: it unmounts the sink
//! when the benchmark ends, fails or is interrupted; the sink unmounts itself on SIGTERM and
//! when its parent dies.

use crate::sys::Result;
use crate::sys::{fusermount_u, is_mountpoint, MAX_WRITE_BYTES};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// ckptfs's `MAX_BACKGROUND` (readahead requests in flight before the kernel counts the mount
/// as congested), so the sink's readers meet the kernel as ckptfs's do.
const MAX_BACKGROUND: u16 = 256;
/// ckptfs mount's default `--threads`.
pub const THREADS: usize = 4;
/// Files whose name ends with this are opened with direct I/O for reading too (for the
/// limits' direct-read row; ckptfs reads through the page cache).
pub const DIRECT_SUFFIX: &str = "direct";
const TTL: Duration = Duration::from_secs(1);
const BLOCK_BYTES: u32 = 4096;
/// How long the guard waits for the sink to exit after unmounting it before killing it.
const EXIT_WAIT: Duration = Duration::from_secs(5);

struct Files {
    /// Name in the root directory to inode.
    names: HashMap<OsString, u64>,
    /// Inode to size.
    sizes: HashMap<u64, u64>,
    /// Inodes of names ending with `DIRECT_SUFFIX`.
    direct: HashSet<u64>,
    next_ino: u64,
}

struct SinkFs {
    files: Mutex<Files>,
    /// What every read returns (requests are at most `MAX_WRITE_BYTES`, see `init`).
    zeros: Vec<u8>,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

/// ckptfs's `open_flags`: write-only handles bypass the page cache and may write in parallel;
/// the rest read through it.
fn open_flags(flags: OpenFlags) -> FopenFlags {
    if matches!(flags.acc_mode(), OpenAccMode::O_WRONLY) {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        FopenFlags::empty()
    }
}

impl SinkFs {
    fn new() -> SinkFs {
        // SAFETY: geteuid and getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        SinkFs {
            files: Mutex::new(Files {
                names: HashMap::new(),
                sizes: HashMap::new(),
                direct: HashSet::new(),
                next_ino: INodeNo::ROOT.0 + 1,
            }),
            zeros: vec![0; MAX_WRITE_BYTES as usize],
            uid,
            gid,
            mounted_at: SystemTime::now(),
        }
    }

    fn files(&self) -> std::sync::MutexGuard<'_, Files> {
        // A panic in another request leaves plain sizes behind, nothing to repair.
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn attr(&self, ino: u64, size: Option<u64>) -> FileAttr {
        let (kind, perm, nlink, size) = match size {
            Some(s) => (FileType::RegularFile, 0o644, 1, s),
            None => (FileType::Directory, 0o755, 2, 0),
        };
        let t = self.mounted_at;
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLOCK_BYTES,
            flags: 0,
        }
    }

    /// The attributes of `ino`, None when there is no such inode.
    fn attr_of(&self, ino: INodeNo) -> Option<FileAttr> {
        if ino == INodeNo::ROOT {
            return Some(self.attr(ino.0, None));
        }
        let size = *self.files().sizes.get(&ino.0)?;
        Some(self.attr(ino.0, Some(size)))
    }
}

impl Filesystem for SinkFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        let _ = config.set_max_readahead(MAX_WRITE_BYTES);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let found = {
            let f = self.files();
            f.names.get(name).map(|ino| (*ino, f.sizes[ino]))
        };
        match found {
            Some((ino, size)) => reply.entry(&TTL, &self.attr(ino, Some(size)), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if let Some(s) = size {
            if let Some(cur) = self.files().sizes.get_mut(&ino.0) {
                *cur = s;
            }
        }
        self.getattr(req, ino, None, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut f = self.files();
        match f.names.remove(name).filter(|_| parent == INodeNo::ROOT) {
            Some(ino) => {
                f.sizes.remove(&ino);
                f.direct.remove(&ino);
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let writes = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        let direct = {
            let mut f = self.files();
            if writes && flags.0 & libc::O_TRUNC != 0 {
                if let Some(size) = f.sizes.get_mut(&ino.0) {
                    *size = 0;
                }
            }
            f.direct.contains(&ino.0)
        };
        let fopen = if direct {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            open_flags(flags)
        };
        reply.opened(FileHandle(0), fopen);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(&len) = self.files().sizes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let n = len.saturating_sub(offset).min(u64::from(size)) as usize;
        if n <= self.zeros.len() {
            reply.data(&self.zeros[..n]);
        } else {
            reply.data(&vec![0; n]);
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.files().sizes.get_mut(&ino.0) {
            Some(size) => *size = (*size).max(offset + data.len() as u64),
            None => return reply.error(Errno::ENOENT),
        }
        reply.written(data.len() as u32)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        reply.ok()
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut entries = vec![
            (INodeNo::ROOT, FileType::Directory, OsString::from(".")),
            (INodeNo::ROOT, FileType::Directory, OsString::from("..")),
        ];
        entries.extend(
            self.files()
                .names
                .iter()
                .map(|(n, i)| (INodeNo(*i), FileType::RegularFile, n.clone())),
        );
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let ino = {
            let mut f = self.files();
            let ino = f.next_ino;
            f.next_ino += 1;
            // A name that exists gets a new, empty inode, as after unlink and create.
            if let Some(old) = f.names.insert(name.to_owned(), ino) {
                f.sizes.remove(&old);
                f.direct.remove(&old);
            }
            f.sizes.insert(ino, 0);
            if name.as_encoded_bytes().ends_with(DIRECT_SUFFIX.as_bytes()) {
                f.direct.insert(ino);
            }
            ino
        };
        reply.created(
            &TTL,
            &self.attr(ino, Some(0)),
            Generation(0),
            FileHandle(0),
            open_flags(OpenFlags(flags)),
        )
    }
}

/// The signals that make the sink unmount itself and exit.
fn termination_signals() -> libc::sigset_t {
    // SAFETY: plain sigset manipulation on a local, zero-initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Sets the mount's readahead to the request size, as `ckptfs mount` does (the kernel caps a
/// FUSE mount at 128 KiB otherwise). Needs root; a failure leaves the kernel's default, and is
/// said once.
fn set_readahead(mnt: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mnt) else {
        return;
    };
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(m.dev()),
        libc::minor(m.dev())
    );
    if let Err(e) = std::fs::write(&path, (MAX_WRITE_BYTES / 1024).to_string()) {
        eprintln!("ckptfs-bench sink: readahead left at the kernel default: {path}: {e}");
    }
}

/// `ckptfs-bench sink MNT`: mounts the sink at MNT, says `ready` on stdout once the mount
/// answers, and serves until unmounted (by the parent, or by itself on SIGTERM/SIGHUP, which
/// it also gets when the parent dies).
pub fn sink_main(mnt: &Path) -> Result<()> {
    // Ctrl-C reaches the whole process group; the parent unmounts the sink in its cleanup.
    // SAFETY: setting a signal to be ignored, and the parent-death signal, have no
    // preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    // Blocked before any thread starts, so only the waiting thread below receives them.
    let set = termination_signals();
    // SAFETY: pthread_sigmask reads the set; the old mask is not requested.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("ckptfs-bench-sink".into()),
        fuser::MountOption::Subtype("sink".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
        fuser::MountOption::Exec,
        fuser::MountOption::RW,
    ];
    config.n_threads = Some(THREADS);
    let session = fuser::Session::new(SinkFs::new(), mnt, &config)
        .map_err(|e| format!("cannot mount the sink at {}: {e}", mnt.display()))?;
    let m = mnt.to_path_buf();
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: sigwait reads the set and writes the signal number into `sig`.
        unsafe { libc::sigwait(&set, &mut sig) };
        // A plain unmount fails while files in the mount are open (a dead parent's workers
        // may still hold some); detached, the session ends once they are closed.
        if !fusermount_u(&m, false) && !fusermount_u(&m, true) {
            eprintln!("ckptfs-bench sink: cannot unmount {}", m.display());
        }
    });
    let m = mnt.to_path_buf();
    std::thread::spawn(move || {
        // The stat inside waits until the session serves requests.
        set_readahead(&m);
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready").and_then(|_| out.flush());
    });
    session
        .run()
        .map_err(|e| format!("sink session ended with an error: {e}"))
}

/// The sink mounted by a child process; unmounted when dropped.
pub struct SinkMount {
    child: Child,
    mnt: PathBuf,
}

impl SinkMount {
    /// Mounts a sink at `mnt` (created if missing; a mount left there by a killed run is
    /// detached first) and waits until it answers.
    pub fn start(exe: &Path, mnt: &Path) -> Result<SinkMount> {
        if is_mountpoint(mnt) {
            eprintln!(
                "ckptfs-bench: {} is still mounted (an earlier run?); unmounting it",
                mnt.display()
            );
            if !fusermount_u(mnt, false) {
                fusermount_u(mnt, true);
            }
        }
        std::fs::create_dir_all(mnt).map_err(|e| format!("create {}: {e}", mnt.display()))?;
        let mut child = Command::new(exe)
            .arg("sink")
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start the sink ({}): {e}", exe.display()))?;
        let out = child.stdout.take().ok_or("the sink has no stdout")?;
        let sink = SinkMount {
            child,
            mnt: mnt.to_path_buf(),
        };
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| format!("read from the sink: {e}"))?;
        if line.trim() != "ready" {
            return Err("the sink did not mount (see its error above)".into());
        }
        Ok(sink)
    }

    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Unmounts and waits for the sink to exit; kills it after `EXIT_WAIT`.
    pub fn stop(mut self) -> Result<()> {
        self.unmount()
    }

    fn unmount(&mut self) -> Result<()> {
        if let Ok(Some(_)) = self.child.try_wait() {
            // Died on its own: only the mount may be left.
            if is_mountpoint(&self.mnt) {
                fusermount_u(&self.mnt, true);
            }
            return Err("the sink exited early".into());
        }
        if !fusermount_u(&self.mnt, false) {
            fusermount_u(&self.mnt, true);
        }
        let deadline = Instant::now() + EXIT_WAIT;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => return Err(format!("the sink failed: {st}")),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!(
                        "the sink did not exit within {EXIT_WAIT:?} of its unmount; killed"
                    ));
                }
            }
        }
    }
}

impl Drop for SinkMount {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            if is_mountpoint(&self.mnt) {
                fusermount_u(&self.mnt, true);
            }
            return;
        }
        if let Err(e) = self.unmount() {
            eprintln!("ckptfs-bench: sink at {}: {e}", self.mnt.display());
        }
    }
}
