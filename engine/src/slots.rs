//! Slots of a multi-slot space: claiming one, keeping its lease, and fencing an owner that
//! lost it (FORMAT.md "Slots").
//!
//! A slot is claimed by writing its header (owner, epoch + 1, lease), waiting `settle`, and
//! reading it back: of two claims racing for one slot, the later write wins and the earlier
//! claimer sees it and moves on. There is no `flock` in this: parallel filesystems do not
//! all honour it across nodes. The owner renews its lease every quarter lease. Everything
//! the owner writes to the backing space goes through a `FencedDevice`, which lets a write
//! through only while the lease is valid by the owner's own clock (at most 3/4 of a lease
//! since the last renewal that found the header still its own); past that it renews first,
//! and an owner whose lease lapsed (a frozen process, a stalled disk) or whose header names
//! another owner fails every later write: sticky, whatever the header says now. A taker
//! claims a held slot only once its lease is over by the taker's clock plus
//! `CLOCK_SKEW_MS`, so a fenced owner stops writing before a taker starts, as long as the
//! nodes' clocks agree within that margin and a write is not already inside the kernel when
//! its process freezes (no shared file can fence that one; FORMAT.md says so).

use crate::device::Device;
use crate::error::{DevResult, Fault};
use crate::error::{Error, Result};
use crate::format::{
    Intent, SlotHeader, SlotHint, SlotId, SlotState, SLOT_HEADER_PAIR, SLOT_HINT_LEN,
    SLOT_MOUNTPOINT_MAX,
};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// The lease a mount takes unless told otherwise: a dead node's slot can be taken over this
/// long after its last renewal; an owner stalled for 3/4 of it fences itself.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease accepted (tests use short ones; renewal is every quarter lease).
pub const MIN_LEASE: Duration = Duration::from_millis(400);
/// How far the clocks of two nodes may disagree: added to a lease before a taker claims.
pub(crate) const CLOCK_SKEW_MS: u64 = 500;

/// Now as Unix nanoseconds, by the engine's clock (`clock::now`): what leases compare.
pub fn now_unix_ns() -> u64 {
    crate::clock::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// This machine's host name, as slot headers record their holders'.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    let mut h = String::from_utf8_lossy(&buf[..end]).into_owned();
    while h.len() > 64 {
        h.pop();
    }
    h
}

/// The slot headers file (`slots/headers`): two copies per slot.
#[derive(Clone)]
pub struct SlotTable {
    dev: Arc<dyn Device>,
    slots: u32,
}

impl SlotTable {
    pub fn new(dev: Arc<dyn Device>, slots: u32) -> SlotTable {
        SlotTable { dev, slots }
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// The newest valid header of `slot`.
    pub fn read(&self, slot: SlotId) -> Result<SlotHeader> {
        let mut pair = vec![0u8; SLOT_HEADER_PAIR as usize];
        self.dev.read_at(&mut pair, SlotHeader::pair_offset(slot))?;
        SlotHeader::newest(&pair, slot)
    }

    /// Writes `h` into its copy (`h.seq % 2`) and makes it durable, then `hint` (the owner's:
    /// `SlotHint::of(h)` with the intent, probe and echo it holds now, which a renewal must
    /// carry over: a renewal that cleared them took back a probe before the other nodes had
    /// read it, or an echo before the prober had, and mounts started at the same moment were
    /// refused as incoherent, 3 in 9 on GlusterFS under load).
    pub fn write(&self, h: &SlotHeader, hint: &SlotHint) -> DevResult<()> {
        self.dev
            .write_at(&h.encode(), SlotHeader::offset(h.slot, h.seq))?;
        self.dev.sync()?;
        // The hint after the header: a reader that sees the new hint finds the new header.
        self.write_hint(h.slot, hint)
    }

    /// Writes slot `slot`'s hint and makes it visible to the other nodes (the sync: a
    /// shared filesystem's client may hold a write back until then, `SharedFile`).
    pub(crate) fn write_hint(&self, slot: SlotId, hint: &SlotHint) -> DevResult<()> {
        self.dev
            .write_at(&hint.encode(), SlotHint::offset(self.slots, slot))?;
        self.dev.sync()
    }

    /// Every slot's hint (None: never written or not intact), in slot order.
    pub fn hints(&self) -> Result<Vec<Option<SlotHint>>> {
        let n = self.slots as usize;
        let mut b = vec![0u8; n * SLOT_HINT_LEN as usize];
        self.dev
            .read_at(&mut b, SlotHint::offset(self.slots, SlotId(0)))?;
        Ok(b.chunks(SLOT_HINT_LEN as usize)
            .map(SlotHint::decode)
            .collect())
    }

    /// Every slot's header, in slot order.
    /// Of a slot whose header is damaged (both copies fail their checksums) that slot only
    /// is left out, logged: one node's damaged header must not keep the others from
    /// claiming, probing and reading theirs (`each` says which are damaged).
    pub fn all(&self) -> Result<Vec<SlotHeader>> {
        Ok(self
            .each()?
            .into_iter()
            .enumerate()
            .filter_map(|(i, h)| match h {
                Ok(h) => Some(h),
                Err(e) => {
                    log::warn!("slot {i}: its header is damaged, the slot is left out: {e}");
                    None
                }
            })
            .collect())
    }

    /// Every slot's header, in slot order, a damaged one as its error. Fails only when the
    /// table cannot be read.
    pub fn each(&self) -> Result<Vec<Result<SlotHeader>>> {
        let mut b = vec![0u8; self.slots as usize * SLOT_HEADER_PAIR as usize];
        self.dev
            .read_at(&mut b, SlotHeader::pair_offset(SlotId(0)))?;
        Ok((0..self.slots)
            .map(|i| {
                let at = i as usize * SLOT_HEADER_PAIR as usize;
                SlotHeader::newest(&b[at..at + SLOT_HEADER_PAIR as usize], SlotId(i))
            })
            .collect())
    }
}

/// This kernel boot and pid namespace, as the first 8 bytes of a mount id (the rest are
/// random): a holder whose mount id starts with this tag, under this host name, ran on this
/// very machine since its last boot and in this pid namespace, so whether its pid still
/// runs is known here for certain. None where the boot id or the namespace cannot be read
/// (then no holder is ever known gone, and takeovers wait for the lease as before).
fn machine_tag() -> Option<[u8; 8]> {
    static TAG: std::sync::OnceLock<Option<[u8; 8]>> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| {
        // A /proc of another pid namespace than this process's (a host's /proc in a
        // container with its own) would answer for other processes' pids: then no tag.
        let seen_as: u32 = std::fs::read_link("/proc/self")
            .ok()?
            .to_str()?
            .parse()
            .ok()?;
        if seen_as != std::process::id() {
            return None;
        }
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let h = blake3::hash(format!("ckptfs holder {} {}", boot.trim(), ns.display()).as_bytes());
        Some(h.as_bytes()[..8].try_into().expect("8 bytes"))
    })
}

/// Whether the holder of `h` is certainly gone: it held the slot from this machine, this
/// boot and this pid namespace (`machine_tag`, and this host name), and its process no
/// longer runs (no such pid, or a zombie). A job whose daemons were all killed (a
/// scheduler's `kill -9`, an OOM kill) left every slot held by a live-looking lease, and
/// the next job's mounts on the same nodes were refused for a whole lease ("every one of
/// the slots ... is held by a live mount", naming pids that were gone). A holder that still
/// runs, even stopped or hung, or whose pid was reused by any process, is not gone: its
/// lease is waited for as before. A holder of another machine, boot or pid namespace (two
/// containers under one host name) never is: its pid means nothing here.
pub fn holder_gone_here(h: &SlotHeader) -> bool {
    let Some(tag) = machine_tag() else {
        return false;
    };
    if h.state != SlotState::Held || h.mount_id[..8] != tag || h.host != host_name() {
        return false;
    }
    h.pid != std::process::id() && !process_runs(h.pid)
}

/// Whether process `pid` still runs: it exists and has not exited. An exited daemon stays a
/// zombie until its parent reaps it, and a daemon `mount` started in the background has
/// init (or a container's first process) for a parent, which may reap it seconds later: an
/// idle unmount took 2 s waiting for that. A process this user may not signal (EPERM), or
/// whose `/proc` entry it may not read, exists: it runs.
pub fn process_runs(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks whether the process exists.
    if pid <= 0
        || (unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM))
    {
        return false;
    }
    // /proc/PID/stat: "pid (comm) state ...", comm may hold spaces and parentheses.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(st) => st
            .rfind(')')
            .and_then(|i| st[i + 1..].split_whitespace().next())
            .is_none_or(|state| state != "Z" && state != "X"),
        Err(_) => true,
    }
}

/// A slot a claim for `mountpoint` may take: not held by a live lease, or held by a holder
/// gone from this machine (`holder_gone_here`) that was mounted at the same mountpoint:
/// this node's next mount takes its own slot back at once; any other mount waits for the
/// lease as before (tests stand for a remote node's death by killing a local daemon, and a
/// mount elsewhere on this machine has free or expired slots to take).
fn claimable(h: &SlotHeader, now_ns: u64, mountpoint: &str) -> bool {
    !is_live(h, now_ns) || (h.mountpoint == mountpoint && holder_gone_here(h))
}

/// Whether a header's lease is still running at `now_ns` (plus the clock-skew margin).
pub fn is_live(h: &SlotHeader, now_ns: u64) -> bool {
    h.state == SlotState::Held
        && now_ns
            < h.renewed_unix_ns
                .saturating_add(h.lease_ms as u64 * 1_000_000)
                .saturating_add(CLOCK_SKEW_MS * 1_000_000)
}

/// The probe to echo next among `probes` (other slots' probes, in slot order) after `last`:
/// the one after it, cyclically; the first when `last` is none of them; None when there is
/// nothing new to write (no probe, or `last` is the only one).
fn next_echo(probes: &[u64], last: u64) -> Option<u64> {
    let next = match probes.iter().position(|&p| p == last) {
        Some(i) => probes[(i + 1) % probes.len()],
        None => *probes.first()?,
    };
    (next != last).then_some(next)
}

/// Who holds a slot ("slot 3 by host n17 pid 4242 mounted at /ckpt (epoch 2, ...)"), for
/// messages.
pub fn describe_holder(h: &SlotHeader, now_ns: u64) -> String {
    let age = now_ns.saturating_sub(h.renewed_unix_ns) as f64 / 1e9;
    format!(
        "slot {} by host {} pid {}{} (epoch {}, lease renewed {age:.1} s ago, {} s lease)",
        h.slot.0,
        h.host,
        h.pid,
        if h.mountpoint.is_empty() {
            String::new()
        } else {
            format!(" mounted at {}", h.mountpoint)
        },
        h.epoch,
        h.lease_ms as f64 / 1000.0
    )
}

/// How a mount asks for a slot.
#[derive(Clone, Debug)]
pub struct SlotRequest {
    /// A particular slot (`mount --slot N`), else the first free one.
    pub slot: Option<SlotId>,
    pub lease: Duration,
    /// Recorded in the header, so `ckptfs slots` can say where the slot is mounted.
    pub mountpoint: String,
    /// Claim `slot` even while its holder's lease runs (`mount --take-over`): only for a
    /// holder known to be dead (its node powered off). A live holder would write on until
    /// its next renewal finds the new epoch, and could damage what the new owner writes.
    pub take_over: bool,
}

impl Default for SlotRequest {
    fn default() -> Self {
        SlotRequest {
            slot: None,
            lease: DEFAULT_LEASE,
            mountpoint: String::new(),
            take_over: false,
        }
    }
}

/// A held slot: its lease, renewed by a background thread until `release` (or drop).
pub struct Lease {
    table: SlotTable,
    me: SlotHeader,
    lease: Duration,
    base: Instant,
    /// Nanoseconds after `base` at which the last successful renewal started.
    renewed_at: AtomicU64,
    /// Serialises renewals (the thread's and a writer's).
    renewing: Mutex<u64>,
    fenced: AtomicBool,
    why: Mutex<Option<String>>,
    /// Released by unmount: every later write is refused (another mount may own it now).
    released: AtomicBool,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// What the slot uses, for its header (set by the space once its store is open). Called
    /// only by the renewal thread, which holds no lock of the store: a writer that renews
    /// from `permit` may hold them, so renewals read the last value from `used`.
    usage: Mutex<Option<UsageFn>>,
    used: AtomicU64,
    /// The published manifest (generation, length) every header write carries.
    manifest: Mutex<(u64, u64)>,
    /// The hint last written (the newest header's fields and the intent announced now):
    /// what an announcement or a header write writes again with its change.
    hint: Mutex<SlotHint>,
    /// Held by the one change of names of this node under way (`nslock::lock`, from its
    /// announcement to its withdrawal): a slot's hint carries one intent, so a second
    /// change announcing while the first is under way replaced the first's keys, and a
    /// conflicting change on another node saw neither (two O_EXCL creates of one name on
    /// two nodes both succeeded while other processes of the first node made files).
    pub(crate) changing: Mutex<()>,
    /// A fault point for the fencing test (`CKPTFS_FAULT_STOP_IN_RENEWAL=PATH`): once a file
    /// exists at PATH, the next renewal stops the daemon (SIGSTOP) between reading its
    /// header and writing it, once, as a node frozen at the worst moment.
    stop_in_renewal: Mutex<Option<std::path::PathBuf>>,
}

/// Bytes of the slot's segments in use now.
pub(crate) type UsageFn = Box<dyn Fn() -> Option<u64> + Send + Sync>;

impl Lease {
    /// Claims a slot of `table` as `req` asks, waiting `settle` between the claim and its
    /// read-back. Refuses, naming the holders, when no slot can be claimed.
    pub fn claim(table: SlotTable, req: &SlotRequest, settle: Duration) -> Result<Arc<Lease>> {
        if req.lease < MIN_LEASE {
            return Err(Error::Invalid(format!(
                "a lease of {:?} is below the minimum of {MIN_LEASE:?}",
                req.lease
            )));
        }
        // As the header stores it.
        let mut mountpoint = req.mountpoint.clone();
        while mountpoint.len() > SLOT_MOUNTPOINT_MAX {
            mountpoint.pop();
        }
        let candidates = Self::candidates(&table, req, &mountpoint)?;
        let mut mount_id = [0u8; 16];
        mount_id.copy_from_slice(
            &blake3::hash(
                format!(
                    "{}{}{:?}",
                    now_unix_ns(),
                    std::process::id(),
                    Instant::now()
                )
                .as_bytes(),
            )
            .as_bytes()[..16],
        );
        if let Some(tag) = machine_tag() {
            mount_id[..8].copy_from_slice(&tag);
        }
        let mut lost = Vec::new();
        for slot in candidates {
            let h = table.read(slot)?;
            let now = now_unix_ns();
            let live = is_live(&h, now);
            if live && claimable(&h, now, &mountpoint) {
                log::warn!(
                    "taking over slot {slot} at once: its holder ran on this machine and is \
                     gone (pid {} no longer runs): {}",
                    h.pid,
                    describe_holder(&h, now)
                );
            } else if live && req.take_over && req.slot.is_some() {
                log::warn!(
                    "taking over slot {slot} while its lease runs (--take-over): {}",
                    describe_holder(&h, now)
                );
            } else if live {
                if req.slot.is_some() {
                    return Err(Error::Locked(format!(
                        "slot {slot} is held by a live mount: {}; it can be taken over once \
                         that lease has run out",
                        describe_holder(&h, now)
                    )));
                }
                lost.push(describe_holder(&h, now));
                continue;
            }
            let base = Instant::now();
            let mine = SlotHeader {
                slot,
                state: SlotState::Held,
                seq: h.seq + 1,
                epoch: h.epoch + 1,
                renewed_unix_ns: now_unix_ns(),
                lease_ms: req.lease.as_millis() as u32,
                pid: std::process::id(),
                mount_id,
                host: host_name(),
                mountpoint: mountpoint.clone(),
                used_bytes: h.used_bytes,
                manifest_gen: h.manifest_gen,
                manifest_len: h.manifest_len,
            };
            table.write(&mine, &SlotHint::of(&mine))?;
            std::thread::sleep(settle);
            let back = table.read(slot)?;
            if back.mount_id != mine.mount_id || back.epoch != mine.epoch {
                // Another claim of the same slot landed after ours: it is theirs.
                if req.slot.is_some() {
                    return Err(Error::Locked(format!(
                        "slot {slot} was claimed by another mount at the same time: {}",
                        describe_holder(&back, now_unix_ns())
                    )));
                }
                lost.push(describe_holder(&back, now_unix_ns()));
                continue;
            }
            if h.state == SlotState::Held {
                log::warn!(
                    "took over slot {slot} from a lease that ran out ({}); now epoch {}",
                    describe_holder(&h, now),
                    mine.epoch
                );
            }
            let lease = Arc::new(Lease {
                table,
                me: mine.clone(),
                lease: req.lease,
                base,
                renewed_at: AtomicU64::new(0),
                renewing: Mutex::new(mine.seq),
                fenced: AtomicBool::new(false),
                why: Mutex::new(None),
                released: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                thread: Mutex::new(None),
                usage: Mutex::new(None),
                used: AtomicU64::new(h.used_bytes),
                manifest: Mutex::new((h.manifest_gen, h.manifest_len)),
                hint: Mutex::new(SlotHint::of(&mine)),
                changing: Mutex::new(()),
                stop_in_renewal: Mutex::new(
                    std::env::var_os("CKPTFS_FAULT_STOP_IN_RENEWAL").map(Into::into),
                ),
            });
            lease.start_renewal(req.lease / 4)?;
            return Ok(lease);
        }
        Err(Error::Locked(format!(
            "no slot of this space could be claimed: {}",
            lost.join("; ")
        )))
    }

    /// The slots to try, in order: the one asked for, or the slots nobody holds (never
    /// used, then released), then expired ones; within each, the slot this host last held
    /// at this mountpoint first, so a node that remounts gets its own slot (and its share's
    /// data) back rather than the lowest one, which another node may be about to take
    /// again. Refuses, naming the holders, when every slot is held by a live mount.
    fn candidates(table: &SlotTable, req: &SlotRequest, mountpoint: &str) -> Result<Vec<SlotId>> {
        let n = table.slots();
        Ok(match req.slot {
            Some(s) if s.0 >= n => {
                return Err(Error::Invalid(format!(
                    "slot {s} does not exist: this space has {n} slots (0 to {})",
                    n - 1
                )))
            }
            Some(s) => vec![s],
            None => {
                let all = table.all()?;
                let now = now_unix_ns();
                let me = host_name();
                let mine = |h: &SlotHeader| h.host == me && h.mountpoint == mountpoint;
                let mut c: Vec<&SlotHeader> = all
                    .iter()
                    .filter(|h| claimable(h, now, mountpoint))
                    .collect();
                // Expired slots last. A held slot still claimable is this mount's own, held
                // by a daemon gone from this machine: it ranks as released, so a node whose
                // daemon was killed gets its own slot back rather than a free one (its data
                // stays in one share, the free slot stays for others).
                let expired = |h: &SlotHeader| h.state == SlotState::Held && !is_live(h, now);
                c.sort_by_key(|h| (expired(h), !mine(h), h.slot));
                if c.is_empty() {
                    let mut holders: Vec<String> = all
                        .iter()
                        .take(8)
                        .map(|h| describe_holder(h, now))
                        .collect();
                    if all.len() > 8 {
                        holders.push(format!("and {} more", all.len() - 8));
                    }
                    return Err(Error::Locked(format!(
                        "every one of the {n} slots of this space is held by a live mount: {}",
                        holders.join("; ")
                    )));
                }
                c.iter().map(|h| h.slot).collect()
            }
        })
    }

    /// Starts the thread that renews this lease every `period` (a quarter of the lease),
    /// and ends once the lease is released or dropped.
    fn start_renewal(self: &Arc<Self>, period: Duration) -> Result<()> {
        let weak = Arc::downgrade(self);
        let t = std::thread::Builder::new()
            .name(format!("lease-slot-{}", self.me.slot))
            .spawn(move || loop {
                let deadline = Instant::now() + period;
                while Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20).min(period));
                    match weak.upgrade() {
                        Some(l) if !l.stop.load(Ordering::Acquire) => {}
                        _ => return,
                    }
                }
                match weak.upgrade() {
                    Some(l) if !l.stop.load(Ordering::Acquire) => {
                        l.refresh_usage();
                        let _ = l.renew();
                    }
                    _ => return,
                }
            })
            .map_err(Error::from)?;
        *self.thread.lock() = Some(t);
        Ok(())
    }

    pub fn slot(&self) -> SlotId {
        self.me.slot
    }

    /// How renewals learn the bytes the slot uses (published in its header).
    pub(crate) fn set_usage(&self, f: UsageFn) {
        *self.usage.lock() = Some(f);
    }

    /// Reads the slot's usage now (for the next header write). Call holding no store lock.
    pub(crate) fn refresh_usage(&self) {
        if let Some(u) = self.usage.lock().as_ref().and_then(|f| f()) {
            self.used.store(u, Ordering::Relaxed);
        }
    }

    pub fn epoch(&self) -> u64 {
        self.me.epoch
    }

    /// Why this owner is fenced, if it is.
    pub fn fenced(&self) -> Option<String> {
        match self.fenced.load(Ordering::Acquire) {
            true => self.why.lock().clone(),
            false => None,
        }
    }

    fn fence(&self, why: String) -> Fault {
        let mut w = self.why.lock();
        if w.is_none() {
            log::error!("{why}");
            *w = Some(why.clone());
        }
        self.fenced.store(true, Ordering::Release);
        Fault::Fenced(w.clone().unwrap_or(why))
    }

    fn since_renewal(&self) -> Duration {
        let now = self.base.elapsed().as_nanos() as u64;
        Duration::from_nanos(now.saturating_sub(self.renewed_at.load(Ordering::Acquire)))
    }

    /// Renews the lease: reads the header (fencing this owner if it names another claim),
    /// then writes it back with the renewal time. An owner whose lease lapsed is fenced
    /// without looking: a taker may be writing already.
    pub fn renew(&self) -> DevResult<()> {
        self.write_own(None)
    }

    /// The manifest this slot has published (generation, length).
    pub fn manifest(&self) -> (u64, u64) {
        *self.manifest.lock()
    }

    /// Publishes manifest generation `gen`, valid up to `len` bytes, by a header write
    /// (after the caller made those bytes durable). Fenced like any write.
    pub fn publish(&self, gen: u64, len: u64) -> DevResult<()> {
        self.permit()?;
        self.write_own(Some((gen, len)))
    }

    /// A renewal, carrying a new manifest pointer when `manifest` is given.
    fn write_own(&self, manifest: Option<(u64, u64)>) -> DevResult<()> {
        let mut seq = self.renewing.lock();
        if let Some(why) = self.fenced() {
            return Err(Fault::Fenced(why));
        }
        let since = self.since_renewal();
        let slot = self.me.slot;
        if since >= self.lease {
            let now_hdr = self.table.read(slot).ok();
            let who = match now_hdr {
                Some(h) if h.epoch != self.me.epoch => {
                    format!("; it now belongs to {}", describe_holder(&h, now_unix_ns()))
                }
                _ => String::new(),
            };
            return Err(self.fence(format!(
                "slot {slot}: this mount did not renew its lease for {:.1} s (the process was \
                 stopped or the backing storage stalled), longer than the {:.1} s lease{who}; \
                 it writes nothing more and fails every write; unmount it",
                since.as_secs_f64(),
                self.lease.as_secs_f64()
            )));
        }
        let started = self.base.elapsed().as_nanos() as u64;
        let wall = now_unix_ns();
        let h = self.table.read(slot).map_err(|e| match e {
            Error::Io(io) => Fault::Os(io),
            other => Fault::Os(io::Error::other(other)),
        })?;
        if h.epoch != self.me.epoch || h.mount_id != self.me.mount_id || h.state != SlotState::Held
        {
            return Err(self.fence(format!(
                "slot {slot} was taken over ({}); this mount (epoch {}) writes nothing more \
                 and fails every write; unmount it",
                describe_holder(&h, now_unix_ns()),
                self.me.epoch
            )));
        }
        let armed = {
            let mut f = self.stop_in_renewal.lock();
            let armed = f.as_ref().is_some_and(|p| p.exists());
            if armed {
                *f = None;
            }
            armed
        };
        if armed {
            log::warn!("fault point: stopping between reading and writing the slot header");
            // SAFETY: raise has no memory-safety preconditions.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        // Checked again right before the write: this thread may have been stopped (or the
        // read stalled) since the check above, for longer than the lease, and a taker may
        // have written its header meanwhile. What is left unfenced is the write system
        // call itself (FORMAT.md "Claim, lease, takeover, fencing").
        let since = self.since_renewal();
        if since >= self.lease {
            return Err(self.fence(format!(
                "slot {slot}: this mount was held up for {:.1} s while renewing its lease, \
                 longer than the {:.1} s lease; it writes nothing more (not even its slot \
                 header) and fails every write; unmount it",
                since.as_secs_f64(),
                self.lease.as_secs_f64()
            )));
        }
        let (manifest_gen, manifest_len) = manifest.unwrap_or_else(|| self.manifest());
        let next = SlotHeader {
            seq: h.seq + 1,
            renewed_unix_ns: wall,
            used_bytes: self.used.load(Ordering::Relaxed),
            manifest_gen,
            manifest_len,
            ..self.me.clone()
        };
        let mut hint = self.hint.lock();
        let kept = SlotHint {
            intent: hint.intent,
            probe: hint.probe,
            echo: hint.echo,
            ..SlotHint::of(&next)
        };
        self.table.write(&next, &kept)?;
        *hint = kept;
        drop(hint);
        *self.manifest.lock() = (manifest_gen, manifest_len);
        *seq = next.seq;
        self.renewed_at.store(started, Ordering::Release);
        Ok(())
    }

    /// Announces `intent` (FORMAT.md "Intents"): writes it into this slot's hint and makes
    /// it visible to the other nodes before returning. Fenced like any write.
    pub(crate) fn announce(
        &self,
        keys: [u64; crate::format::INTENT_KEYS],
        prio: u64,
    ) -> DevResult<()> {
        self.permit()?;
        let mut hint = self.hint.lock();
        let intent = Intent {
            seq: hint.intent.seq + 1,
            prio,
            keys,
        };
        let next = SlotHint { intent, ..*hint };
        self.table.write_hint(self.me.slot, &next)?;
        *hint = next;
        Ok(())
    }

    /// Withdraws the intent announced (done, or given up to let an older one go first).
    pub(crate) fn clear_intent(&self) -> DevResult<()> {
        let mut hint = self.hint.lock();
        if hint.intent.is_empty() {
            return Ok(());
        }
        self.permit()?;
        let next = SlotHint {
            intent: Intent {
                seq: hint.intent.seq + 1,
                prio: 0,
                keys: [0; crate::format::INTENT_KEYS],
            },
            ..*hint
        };
        self.table.write_hint(self.me.slot, &next)?;
        *hint = next;
        Ok(())
    }

    /// Writes this slot's hint with `f` applied (probe and echo fields), visibly.
    fn update_hint(&self, f: impl FnOnce(&mut SlotHint)) -> DevResult<()> {
        self.permit()?;
        let mut hint = self.hint.lock();
        let mut next = *hint;
        f(&mut next);
        if next == *hint {
            return Ok(());
        }
        self.table.write_hint(self.me.slot, &next)?;
        *hint = next;
        Ok(())
    }

    /// Answers another slot's coherence probe (FORMAT.md "Coherence probe"): the probes in
    /// `hints` are echoed in this slot's hint in turn, in slot order, the one after the
    /// probe echoed last, so nodes that all mount at once each get their echo (the hint
    /// has room for one).
    /// Whether any other slot shows a probe (a node mounting now, which clears its probe
    /// once answered or given up).
    pub fn answer_probes(&self, hints: &[Option<SlotHint>]) -> DevResult<bool> {
        let last = self.hint.lock().echo;
        let probes: Vec<u64> = hints
            .iter()
            .enumerate()
            .filter(|(i, _)| *i as u32 != self.me.slot.0)
            .filter_map(|(_, h)| h.map(|h| h.probe))
            .filter(|&p| p != 0)
            .collect();
        if let Some(p) = next_echo(&probes, last) {
            self.update_hint(|h| h.echo = p)?;
        }
        Ok(!probes.is_empty())
    }

    /// Probes whether the other live nodes see this node's writes and this node theirs: a
    /// nonce in this slot's hint, echoed by any other node that reads it (each does once a
    /// second). Returns Ok(None) with no other live node, Ok(Some((slot, elapsed))) for
    /// the first echo, and an error naming the nodes when live nodes answer nothing
    /// within `wait`.
    pub fn probe_coherence(&self, wait: Duration) -> Result<Option<(SlotId, Duration)>> {
        let now = now_unix_ns();
        let live: Vec<SlotHeader> = self
            .table
            .all()?
            .into_iter()
            // A holder gone from this machine answers nothing: waiting for it refused the
            // mount of a node whose killed daemon left its slot held.
            .filter(|h| h.slot != self.me.slot && is_live(h, now) && !holder_gone_here(h))
            .collect();
        if live.is_empty() {
            return Ok(None);
        }
        let nonce = u64::from_le_bytes(
            blake3::hash(format!("{now}{:?}", self.me.mount_id).as_bytes()).as_bytes()[..8]
                .try_into()
                .expect("8"),
        ) | 1;
        self.update_hint(|h| h.probe = nonce).map_err(Error::from)?;
        let start = Instant::now();
        let answered =
            loop {
                let hints = self.table.hints()?;
                // Nodes that mount at the same moment (a job's prolog on every node) probe
                // each other: each answers the others while it waits for its own echo.
                self.answer_probes(&hints).map_err(Error::from)?;
                if let Some((i, _)) = hints.iter().enumerate().find(|(i, h)| {
                    *i as u32 != self.me.slot.0 && h.is_some_and(|h| h.echo == nonce)
                }) {
                    break Some((SlotId(i as u32), start.elapsed()));
                }
                if start.elapsed() > wait {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
        self.update_hint(|h| h.probe = 0).map_err(Error::from)?;
        match answered {
            Some(a) => Ok(Some(a)),
            None => Err(Error::Incoherent(format!(
                "{} other node(s) hold live leases on this space ({}), but none saw this \
                 node's coherence probe within {:.0} s. Either they are all stopped, or the \
                 backing filesystem does not show other clients this node's writes (or this \
                 node theirs): ckptfs needs O_DIRECT reads to bypass the client cache and \
                 fdatasync'd writes to reach the other clients (GlusterFS and Lustre give \
                 that with their default options; NFS needs close-to-open and O_DIRECT \
                 support). Mount again once those nodes run, or with --no-probe if you know \
                 they are stopped",
                live.len(),
                live.iter()
                    .map(|h| describe_holder(h, now))
                    .collect::<Vec<_>>()
                    .join("; "),
                wait.as_secs_f64()
            ))),
        }
    }

    /// The table of every slot's header and hint.
    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    /// The lease's length.
    pub(crate) fn lease_len(&self) -> Duration {
        self.lease
    }

    /// Lets a write to the backing space through only while the lease is valid: within 3/4
    /// of a lease of the last renewal, else after renewing now.
    pub(crate) fn permit(&self) -> DevResult<()> {
        if let Some(why) = self.fenced() {
            return Err(Fault::Fenced(why));
        }
        if self.released.load(Ordering::Acquire) {
            return Err(Fault::Fenced(format!(
                "slot {} was released by this mount's unmount",
                self.me.slot
            )));
        }
        if self.since_renewal() < self.lease * 3 / 4 {
            return Ok(());
        }
        self.renew()
    }

    /// Gives the slot back (unmount): the header says released, so the next mount may take
    /// it at once. Does nothing for a fenced owner.
    pub fn release(&self) {
        self.stop.store(true, Ordering::Release);
        let t = self.thread.lock().take();
        // Not joined from the lease thread itself (it may hold the last reference).
        if let Some(t) = t.filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = t.join();
        }
        let seq = self.renewing.lock();
        if self.fenced().is_some() || self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        if self.since_renewal() >= self.lease * 3 / 4 {
            // Past what `permit` allows: a taker may own the slot by now, and a stale header
            // must not land over its own. The slot is left to expire.
            log::warn!(
                "slot {}: not released: its lease was not renewed for {:.1} s; it expires \
                 instead",
                self.me.slot,
                self.since_renewal().as_secs_f64()
            );
            return;
        }
        match self.table.read(self.me.slot) {
            Ok(h) if h.epoch == self.me.epoch && h.mount_id == self.me.mount_id => {
                let released = SlotHeader {
                    seq: h.seq.max(*seq) + 1,
                    state: SlotState::Released,
                    renewed_unix_ns: now_unix_ns(),
                    used_bytes: self.used.load(Ordering::Relaxed),
                    manifest_gen: self.manifest().0,
                    manifest_len: self.manifest().1,
                    ..self.me.clone()
                };
                if let Err(e) = self.table.write(&released, &SlotHint::of(&released)) {
                    log::warn!("slot {}: could not record its release: {e}", self.me.slot);
                }
            }
            Ok(h) => log::warn!(
                "slot {}: not released, it was taken over ({})",
                self.me.slot,
                describe_holder(&h, now_unix_ns())
            ),
            Err(e) => log::warn!("slot {}: not released: {e}", self.me.slot),
        }
    }
}

/// A device whose writes, syncs and resizes pass only while its owner's lease is valid
/// (`Lease::permit`); reads always pass.
pub(crate) struct FencedDevice {
    pub inner: Arc<dyn Device>,
    pub lease: Arc<Lease>,
}

impl Device for FencedDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> DevResult<()> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> DevResult<()> {
        self.lease.permit()?;
        self.inner.write_at(buf, off)
    }
    fn sync(&self) -> DevResult<()> {
        self.lease.permit()?;
        self.inner.sync()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> DevResult<()> {
        self.lease.permit()?;
        self.inner.set_len(len)
    }
    fn room_low(&self) -> bool {
        self.inner.room_low()
    }
    fn file_now(&self) -> Option<DevResult<crate::device::FileNow>> {
        self.inner.file_now()
    }
}

/// Releases its slot when dropped: the last field of a `Space`, so the slot is given back
/// after the space's table and store have closed (a write after the release is refused).
pub(crate) struct LeaseGuard(pub Arc<Lease>);

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    /// Nodes that all mount at once (a job's prolog) probe each other: each must get its
    /// echo from one of the others while they all wait, with no other node mounted.
    #[test]
    fn nodes_that_mount_at_once_all_pass_the_coherence_probe() {
        for nodes in [2u32, 3, 4] {
            let dev: Arc<dyn Device> = Arc::new(MemDevice::new(8 << 20));
            let leases: Vec<Arc<Lease>> = (0..nodes)
                .map(|i| {
                    let req = SlotRequest {
                        slot: Some(SlotId(i)),
                        lease: MIN_LEASE,
                        ..SlotRequest::default()
                    };
                    Lease::claim(SlotTable::new(dev.clone(), nodes), &req, Duration::ZERO).unwrap()
                })
                .collect();
            let barrier = std::sync::Barrier::new(nodes as usize);
            let done = std::sync::atomic::AtomicU32::new(0);
            std::thread::scope(|s| {
                let handles: Vec<_> = leases
                    .iter()
                    .map(|l| {
                        let (barrier, done) = (&barrier, &done);
                        s.spawn(move || {
                            barrier.wait();
                            let r = l.probe_coherence(Duration::from_secs(30));
                            done.fetch_add(1, Ordering::SeqCst);
                            // A mounted node goes on answering (the daemon's
                            // `answer_probes_while_held`): without it, the nodes whose echo
                            // came first stopped answering, and under load the last one's
                            // probe was left with no one to echo it (a failure seen in CI).
                            while done.load(Ordering::SeqCst) < nodes {
                                if let Ok(h) = l.table().hints() {
                                    let _ = l.answer_probes(&h);
                                }
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            r
                        })
                    })
                    .collect();
                for (i, h) in handles.into_iter().enumerate() {
                    let r = h.join().unwrap();
                    assert!(
                        matches!(r, Ok(Some(_))),
                        "{nodes} nodes at once: node {i} got {r:?}"
                    );
                }
            });
        }
    }

    /// A lease renewal rewrites the owner's hint: it must carry the probe and the echo in it
    /// (a renewal between a probe's write and the other node's read took the probe back, and
    /// one between an echo and the prober's read took the echo: mounts started at the same
    /// moment on GlusterFS under load were refused 3 times in 9). Fails every time with a
    /// renewal that writes `SlotHint::of(header)`.
    #[test]
    fn a_renewal_keeps_the_probe_and_the_echo() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(8 << 20));
        let claim = |i| {
            let req = SlotRequest {
                slot: Some(SlotId(i)),
                lease: MIN_LEASE,
                ..SlotRequest::default()
            };
            Lease::claim(SlotTable::new(dev.clone(), 2), &req, Duration::ZERO).unwrap()
        };
        let (prober, answerer) = (claim(0), claim(1));
        let nonce = 0x5eed_0001;
        prober.update_hint(|h| h.probe = nonce).unwrap();
        prober.renew().unwrap();
        let hints = prober.table().hints().unwrap();
        assert_eq!(
            hints[0].map(|h| h.probe),
            Some(nonce),
            "the prober's renewal took its probe back before the other node read it"
        );
        answerer.answer_probes(&hints).unwrap();
        answerer.renew().unwrap();
        let hints = prober.table().hints().unwrap();
        assert_eq!(
            hints[1].map(|h| h.echo),
            Some(nonce),
            "the answerer's renewal took its echo back before the prober read it"
        );
        // And the renewed hints still say the new header's sequence number (a reader that
        // sees the hint finds the header it names).
        assert_eq!(
            hints[0].map(|h| h.seq),
            Some(prober.table().read(SlotId(0)).unwrap().seq)
        );
    }

    /// A slot whose holder ran on this machine (this boot, this pid namespace, this host
    /// name) at the same mountpoint and no longer runs is taken at once, lease or not: the
    /// next job's mounts after a `kill -9` of every daemon were refused for a whole lease. A
    /// holder that still runs, one of another machine (its mount id does not carry this
    /// machine's tag), or one that was mounted elsewhere keeps its slot until its lease runs
    /// out.
    #[test]
    fn a_slot_whose_holder_is_gone_from_this_machine_is_taken_at_once() {
        let Some(tag) = machine_tag() else {
            eprintln!("SKIPPED: no boot id or pid namespace to tell this machine by");
            return;
        };
        // No process has the pid `pid_max`: pids are below it.
        let gone_pid: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4_194_304);
        let mut alive = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let held = |slot: u32, pid: u32, tagged: bool| {
            let mut h = SlotHeader::free(SlotId(slot));
            h.state = SlotState::Held;
            h.seq = 1;
            h.epoch = 1;
            h.renewed_unix_ns = now_unix_ns();
            h.lease_ms = 60_000;
            h.pid = pid;
            h.host = host_name();
            h.mountpoint = format!("/ckpt{slot}");
            h.mount_id = [7; 16];
            if tagged {
                h.mount_id[..8].copy_from_slice(&tag);
            }
            h
        };
        // Every claim below is a mount at `/ckpt1`.
        let req = SlotRequest {
            lease: MIN_LEASE,
            mountpoint: "/ckpt1".into(),
            ..SlotRequest::default()
        };
        let claim_any = |holders: &[SlotHeader]| {
            let dev: Arc<dyn Device> = Arc::new(MemDevice::new(8 << 20));
            let table = SlotTable::new(dev, holders.len() as u32);
            for h in holders {
                table.write(h, &SlotHint::of(h)).unwrap();
            }
            Lease::claim(table, &req, Duration::ZERO).map(|l| l.slot())
        };
        // Slot 1's holder is gone from this machine: taken, though slot 0 comes first and
        // both leases run.
        let got = claim_any(&[held(0, alive.id(), true), held(1, gone_pid, true)]);
        assert_eq!(got.ok(), Some(SlotId(1)));
        // The same pid, but under another machine's tag: its pid means nothing here.
        let got = claim_any(&[held(0, alive.id(), true), held(1, gone_pid, false)]);
        assert!(matches!(got, Err(Error::Locked(_))), "{got:?}");
        // A holder that runs keeps its slot.
        let got = claim_any(&[held(0, alive.id(), true)]);
        assert!(matches!(got, Err(Error::Locked(_))), "{got:?}");
        // A gone holder that was mounted elsewhere (`/ckpt0`): its lease is waited for.
        let got = claim_any(&[held(0, gone_pid, true), held(1, alive.id(), true)]);
        assert!(matches!(got, Err(Error::Locked(_))), "{got:?}");
        // With a free slot too, this mount's own slot comes first (a killed node gets its
        // own slot back), and the gone holder is no live node to probe: the probe passes
        // at once instead of waiting for an echo that cannot come.
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(8 << 20));
        let table = SlotTable::new(dev, 3);
        let gone = held(1, gone_pid, true);
        table.write(&gone, &SlotHint::of(&gone)).unwrap();
        let mine = Lease::claim(table.clone(), &req, Duration::ZERO).unwrap();
        assert_eq!(mine.slot(), SlotId(1), "the killed node's own slot");
        let other = held(2, gone_pid, true);
        table.write(&other, &SlotHint::of(&other)).unwrap();
        let probe = mine.probe_coherence(Duration::from_millis(300));
        assert!(matches!(probe, Ok(None)), "{probe:?}");
        alive.kill().unwrap();
        alive.wait().unwrap();
    }

    #[test]
    fn echoes_go_round_every_probe() {
        assert_eq!(next_echo(&[], 0), None);
        assert_eq!(next_echo(&[5], 0), Some(5));
        assert_eq!(
            next_echo(&[5], 5),
            None,
            "one probe, answered: nothing to write"
        );
        let probes = [5, 7, 9];
        let mut last = 0;
        let mut seen = Vec::new();
        for _ in 0..6 {
            last = next_echo(&probes, last).unwrap();
            seen.push(last);
        }
        assert_eq!(seen, [5, 7, 9, 5, 7, 9]);
        assert_eq!(next_echo(&probes, 42), Some(5), "an old echo: start again");
    }

    /// A mount that lost its slot learns it from its renewal, its publish or a write's
    /// permit, and each reports `Error::Fenced`, which the errno map places, not an I/O
    /// error carrying a sentence.
    #[test]
    fn a_lost_slot_is_reported_as_fenced_by_every_path() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(8 << 20));
        let req = SlotRequest {
            slot: Some(SlotId(0)),
            lease: MIN_LEASE,
            ..SlotRequest::default()
        };
        let owner = Lease::claim(SlotTable::new(dev.clone(), 2), &req, Duration::ZERO).unwrap();
        // Another mount takes the slot over (`mount --take-over`: its holder is dead to it).
        let taker = SlotRequest {
            take_over: true,
            ..req
        };
        let _new = Lease::claim(SlotTable::new(dev, 2), &taker, Duration::ZERO).unwrap();
        let found = [owner.renew(), owner.publish(1, 0), owner.permit()];
        for r in found {
            let e = Error::from(r.expect_err("the old owner was fenced"));
            assert!(matches!(e, Error::Fenced(_)), "{e:?}");
        }
    }
}
