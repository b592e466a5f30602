//! The command line around the mount: chunk size at format time, format/mount refusing to
//! clobber or double-mount a space, and a mount waiting for a daemon that is still exiting.

use std::ffi::OsStr;
use std::fs;

use ckptfs_tests::{assert_file_eq, pattern, run_ckptfs, TempDir, TestMount};

#[test]
fn chunk_size_option_changes_chunking_and_data_roundtrips() {
    let data = pattern(0xc5, 8 << 20);
    let mut chunks = Vec::new();
    for cs in ["16K", "1M"] {
        let mut m = TestMount::with_options("1G", Some(cs));
        fs::write(m.path("ckpt"), &data).expect("write");
        let s = m.stats();
        println!("--chunk-size {cs}: {s}");
        chunks.push(s.stats.chunks);
        m.remount();
        assert_file_eq(&m.path("ckpt"), &data);
    }
    assert!(
        chunks[0] > chunks[1],
        "8 MiB stored as {} chunks with --chunk-size 16K but {} with 1M",
        chunks[0],
        chunks[1]
    );
}

/// The size the clobber test asks `format` for: no larger than it needs, since format refuses a
/// size above the disk's free space and CI machines have had under 1 GiB free while the tests
/// run (a 1G here failed CI for that reason alone).
const REFORMAT_SIZE: &str = "256M";

#[test]
fn format_and_mount_refuse_to_clobber_or_double_mount() {
    let mut m = TestMount::new();
    fs::write(m.path("precious"), b"keep me").expect("write");
    let backing = m.backing().as_os_str().to_os_string();
    let other = TempDir::new("other-mnt");

    let (st, _, _) = m.ckptfs(&[OsStr::new("mount"), &backing, other.path().as_os_str()]);
    if st.success() {
        m.ckptfs(&[OsStr::new("umount"), other.path().as_os_str()]);
        panic!("a second mount of a mounted space must fail, but it succeeded");
    }
    let (st, _, err) = m.ckptfs(&[
        OsStr::new("format"),
        &backing,
        OsStr::new("--size"),
        OsStr::new(REFORMAT_SIZE),
        OsStr::new("--force"),
    ]);
    assert!(!st.success(), "format --force of a mounted space must fail");
    assert!(
        err.contains("in use"),
        "format --force of a mounted space must fail because it is mounted, said: {err}"
    );
    assert_file_eq(&m.path("precious"), b"keep me");

    m.unmount();
    let (st, _, err) = m.ckptfs(&[
        OsStr::new("format"),
        &backing,
        OsStr::new("--size"),
        OsStr::new(REFORMAT_SIZE),
    ]);
    assert!(
        !st.success(),
        "format of an existing space without --force must fail"
    );
    assert!(
        err.contains("already holds a ckptfs space"),
        "format without --force must fail because a space is there, said: {err}"
    );
    m.mount();
    assert_file_eq(&m.path("precious"), b"keep me");

    m.unmount();
    let (st, out, err) = m.ckptfs(&[
        OsStr::new("format"),
        &backing,
        OsStr::new("--size"),
        OsStr::new(REFORMAT_SIZE),
        OsStr::new("--force"),
    ]);
    assert!(
        st.success(),
        "format --force of an unmounted space: {st}\n{out}\n{err}"
    );
    m.mount();
    let names: Vec<_> = fs::read_dir(m.mnt()).expect("read_dir").collect();
    assert!(
        names.is_empty(),
        "a re-formatted space is empty, found {} entries",
        names.len()
    );
}

/// A mount started while the previous daemon of the space is unmounted but still exiting
/// (here: kept alive by a descriptor open in its lazily detached mount, let go once the
/// mount says it waits: an event, not a sleep) waits for it, saying so, instead of refusing
/// the space as "in use".
#[test]
fn mount_waits_for_a_daemon_that_is_still_exiting() {
    let mut m = TestMount::new();
    fs::write(m.path("kept"), b"still here").expect("write");
    let held = fs::File::open(m.path("kept")).expect("open");
    let (backing, mnt) = (m.backing().to_path_buf(), m.mnt().to_path_buf());
    let (said, status, rest) = run_as_the_daemon_exits(
        &mut m,
        held,
        &[OsStr::new("mount"), backing.as_os_str(), mnt.as_os_str()],
    );
    assert!(
        said.contains("waiting for the daemon") && status.success(),
        "mount did not wait for the exiting daemon: {said}{rest}"
    );
    m.mounted_elsewhere();
    assert_file_eq(&m.path("kept"), b"still here");
}

/// An offline command on the backing directory right after a plain `fusermount3 -u` (which
/// returns before the daemon has committed and exited) waits for the daemon, then runs on
/// the space itself, on a single-slot space and on a slot of a multi-slot one. Here the
/// daemon is kept alive by a descriptor open in its lazily detached mount, and let go once
/// `check` says it is waiting (an event, not a sleep). Before, `check` went "through" the
/// old mountpoint, no longer a ckptfs mount, and failed with `No data available` (one
/// slot), or left the slot unchecked, to be checked "through that mount" (several).
#[test]
fn an_offline_command_right_after_an_unmount_waits_for_the_exiting_daemon() {
    for slots in ["1", "2"] {
        let mut m = TestMount::with_format_args("256M", &["--slots", slots]);
        offline_check_waits_for_the_exiting_daemon(&mut m, slots);
    }
}

/// `stats` of a multi-slot backing directory right after a plain unmount waits for the
/// exiting daemon (kept alive by a descriptor open in its lazily detached mount) as `check`
/// does, and then shows its slot released, not held by the mount that is gone.
#[test]
fn stats_of_a_multi_slot_space_right_after_an_unmount_waits_for_the_exiting_daemon() {
    let mut m = TestMount::with_format_args("256M", &["--slots", "2"]);
    fs::write(m.path("kept"), b"still here").expect("write");
    let held = fs::File::open(m.path("kept")).expect("open");
    let backing = m.backing().to_path_buf();
    let (said, status, rest) = run_as_the_daemon_exits(
        &mut m,
        held,
        &[
            OsStr::new("stats"),
            backing.as_os_str(),
            OsStr::new("--json"),
        ],
    );
    assert!(
        said.contains("waiting for the daemon") && status.success(),
        "stats did not wait for the exiting daemon: {said}{rest}"
    );
    let v: serde_json::Value = serde_json::from_str(
        rest.lines()
            .find(|l| l.starts_with('{'))
            .unwrap_or_else(|| panic!("no JSON in: {rest}")),
    )
    .expect("stats JSON");
    let states: Vec<&str> = v["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .filter_map(|r| r["state"].as_str())
        .collect();
    assert!(
        !states.contains(&"held"),
        "a slot still held after the wait: {states:?}"
    );
    m.mount();
    assert_file_eq(&m.path("kept"), b"still here");
}

/// `format --force` of a space right after a plain unmount waits for the exiting daemon
/// (kept alive here by a descriptor open in its lazily detached mount, let go once format
/// says it waits), then erases the space; before, it was refused as "in use". A live mount
/// is still refused.
#[test]
fn format_force_right_after_an_unmount_waits_for_the_exiting_daemon() {
    let mut m = TestMount::new();
    fs::write(m.path("old"), b"erased").expect("write");
    let backing = m.backing().to_path_buf();
    let (st, out, err) = m.ckptfs(&[
        OsStr::new("format"),
        backing.as_os_str(),
        OsStr::new("--size"),
        OsStr::new("64M"),
        OsStr::new("--force"),
    ]);
    assert!(!st.success(), "format --force of a live mount: {out}{err}");
    assert!(err.contains("in use"), "{err}");
    let held = fs::File::open(m.path("old")).expect("open");
    let (said, status, rest) = run_as_the_daemon_exits(
        &mut m,
        held,
        &[
            OsStr::new("format"),
            backing.as_os_str(),
            OsStr::new("--size"),
            OsStr::new("64M"),
            OsStr::new("--force"),
        ],
    );
    assert!(
        said.contains("waiting for the daemon") && status.success(),
        "format --force after the unmount: {said}{rest}"
    );
    m.mount();
    assert!(!m.path("old").exists(), "the space was not formatted anew");
}

/// An offline command given another path to a mounted space (a symlink here; two clients
/// of a shared filesystem alike) goes through the live mount at once: the daemon is not
/// taken for an exiting one because the lock file names its mount by a different path
/// (that wait ran 30 s and failed, "has not exited", in a build before this test).
#[test]
fn an_offline_command_given_another_path_to_a_mounted_space_goes_through_its_mount() {
    let mut m = TestMount::new();
    fs::write(m.path("f"), b"data").expect("write");
    let link = m.root().join("link-to-backing");
    std::os::unix::fs::symlink(m.backing(), &link).expect("symlink");
    for cmd in ["check", "stats"] {
        let (st, out, err) = m.ckptfs(&[OsStr::new(cmd), link.as_os_str()]);
        assert!(st.success(), "{cmd} through {}: {out}{err}", link.display());
        assert!(
            !err.contains("waiting"),
            "{cmd} waited for a live daemon: {err}"
        );
    }
}

fn offline_check_waits_for_the_exiting_daemon(m: &mut TestMount, slots: &str) {
    fs::write(m.path("kept"), b"still here").expect("write");
    let held = fs::File::open(m.path("kept")).expect("open");
    let backing = m.backing().to_path_buf();
    let (said, status, rest) =
        run_as_the_daemon_exits(m, held, &[OsStr::new("check"), backing.as_os_str()]);
    assert!(
        said.contains("waiting for the daemon"),
        "--slots {slots}: check did not wait for the exiting daemon; it said: {said}{rest}"
    );
    assert!(
        status.success(),
        "--slots {slots}: check failed: {said}{rest}"
    );
    assert!(
        rest.contains("clean") && !rest.contains("not checked here"),
        "--slots {slots}: check's report: {rest}"
    );
    m.mount();
    assert_file_eq(&m.path("kept"), b"still here");
}

/// A mount right after a plain `umount` (the daemon may still be exiting for a moment)
/// succeeds quietly: nothing on stderr (xfstests generic/604 reads a notice there as a
/// failure); the "waiting" notice is for waits long enough to notice.
#[test]
fn a_mount_right_after_an_unmount_is_quiet() {
    let dir = TempDir::new("quiet");
    let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
    fs::create_dir(&mnt).unwrap();
    let (st, out, err) = run_ckptfs(
        dir.path(),
        "format",
        &[
            OsStr::new("format"),
            backing.as_os_str(),
            OsStr::new("--size"),
            OsStr::new("64M"),
        ],
    );
    assert!(st.success(), "format: {out}{err}");
    for round in 0..5 {
        let (st, out, err) = run_ckptfs(
            dir.path(),
            &format!("mount-{round}"),
            &[OsStr::new("mount"), backing.as_os_str(), mnt.as_os_str()],
        );
        assert!(st.success(), "mount {round}: {out}{err}");
        let wrote = fs::write(mnt.join(format!("f{round}")), b"x");
        // Unmounted before anything is asserted, so a failure leaves no mount behind.
        let st = std::process::Command::new("umount")
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(st.success(), "umount {round}");
        wrote.unwrap();
        assert_eq!(err, "", "mount {round} said something on stderr");
    }
}

/// The mount(8) source naming the binary under test: fuse3's helper runs `PROG SOURCE MNT -o
/// OPTS` for `-t fuse` and a source `PROG#SOURCE`. (For `-t fuse.ckptfs` it runs `ckptfs`
/// from the standard PATH that mount(8) gives its helpers, which would be an installed
/// binary, not this build; README "System mounts" says how to install one.)
fn helper_source(backing: &std::path::Path) -> String {
    format!(
        "{}#{}",
        ckptfs_tests::ckptfs_bin().display(),
        backing.display()
    )
}

/// Lazily unmounts its path when dropped, if something is mounted there.
struct DetachOnDrop(Option<std::path::PathBuf>);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.as_ref().filter(|p| mountinfo(p).is_some()) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(p)
                .status();
        }
    }
}

/// The fields of the mountinfo line of `mnt`: (fstype, source, mount options), if mounted.
fn mountinfo(mnt: &std::path::Path) -> Option<(String, String, String)> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let dash = f.iter().position(|x| *x == "-")?;
        (std::path::Path::new(f[4]) == mnt).then(|| {
            (
                f[dash + 1].to_string(),
                f[dash + 2].to_string(),
                f[5].to_string(),
            )
        })
    })
}

/// mount(8) and an fstab line go through fuse3's helper (mount.fuse3 runs `ckptfs BACKING
/// MNT -o OPTS`) with the mount options a site writes; the mount is of type fuse.ckptfs with
/// the kernel flags asked for (mount.fuse3 adds `dev,suid` unless the line says otherwise,
/// as mount(8) means by default; ckptfs keeps nodev always); df and plain umount work; an unknown option is refused with
/// a message.
#[test]
fn mount_t_fuse_ckptfs_and_fstab_lines_work() {
    if !std::path::Path::new("/sbin/mount.fuse3").exists()
        && !std::path::Path::new("/usr/sbin/mount.fuse3").exists()
    {
        return ckptfs_tests::skip(
            "mount_t_fuse_ckptfs_and_fstab_lines_work",
            "fuse3",
            "no mount.fuse3 (apt-get install fuse3)",
        );
    }
    let mut m = TestMount::new();
    m.unmount();
    let (backing, mnt) = (m.backing().to_path_buf(), m.mnt().to_path_buf());
    // Mounts made by mount(8) are not TestMount's: if an assertion fails while one is up,
    // detach it so the test leaves no mount (and daemon) behind.
    let mut detach = DetachOnDrop(Some(mnt.clone()));
    let umount = |what: &str| {
        let out = std::process::Command::new("umount")
            .arg(&mnt)
            .output()
            .unwrap();
        assert!(out.status.success(), "umount after {what}: {out:?}");
        assert!(
            mountinfo(&mnt).is_none(),
            "still mounted after umount ({what})"
        );
    };

    let out = std::process::Command::new("mount")
        .args(["-t", "fuse"])
        .arg(helper_source(&backing))
        .arg(&mnt)
        .args([
            "-o",
            "threads=2,nosuid,noexec,noatime,_netdev,x-systemd.automount",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "mount -t fuse.ckptfs: {out:?}");
    let (fstype, source, opts) = mountinfo(&mnt).expect("mounted");
    // fuser mounts with type "fuse" (no subtype) when it can call mount(2) itself.
    assert_eq!(fstype, "fuse");
    assert_eq!(source, format!("ckptfs:{}", backing.display()));
    for flag in ["nosuid", "noexec", "nodev"] {
        assert!(
            opts.split(',').any(|o| o == flag),
            "{flag} not applied: {opts}"
        );
    }
    let data = pattern(7, 3 << 20);
    fs::write(mnt.join("a.bin"), &data).unwrap();
    assert_file_eq(&mnt.join("a.bin"), &data);
    let df = std::process::Command::new("df").arg(&mnt).output().unwrap();
    assert!(df.status.success(), "df: {df:?}");
    assert!(String::from_utf8_lossy(&df.stdout).contains(&*mnt.to_string_lossy()));
    umount("mount -t");

    // An fstab line (in a file of its own: `mount -T`), mounted by its mountpoint alone.
    let fstab = m.root().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse noauto,threads=3,codec=lz4 0 0\n",
            helper_source(&backing),
            mnt.display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new("mount")
        .arg("-T")
        .arg(&fstab)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(out.status.success(), "mount from fstab: {out:?}");
    assert_file_eq(&mnt.join("a.bin"), &data);
    umount("fstab");

    let out = std::process::Command::new("mount")
        .args(["-t", "fuse"])
        .arg(helper_source(&backing))
        .arg(&mnt)
        .args(["-o", "bogus_option"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "an unknown option must be refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown mount option \"bogus_option\""),
        "{err}"
    );
    assert!(mountinfo(&mnt).is_none());

    detach.0 = None;
    m.mount();
    assert_file_eq(&m.path("a.bin"), &data);
}

/// `scripts/install.sh` (staged with DESTDIR) installs the binary, a man page per command
/// and completions for bash, zsh and fish, generated from the CLI definition.
#[test]
fn install_script_installs_binary_man_pages_and_completions() {
    let dest = TempDir::new("install");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install.sh");
    let out = std::process::Command::new(&script)
        .arg("/usr/local")
        .env("DESTDIR", dest.path())
        .env("CKPTFS_BIN", ckptfs_tests::ckptfs_bin())
        .output()
        .expect("run scripts/install.sh");
    assert!(out.status.success(), "install.sh: {out:?}");
    let root = dest.path().join("usr/local");
    let bin = root.join("bin/ckptfs");
    let v = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&v.stdout).starts_with("ckptfs "),
        "{v:?}"
    );
    for page in [
        "ckptfs",
        "ckptfs-mount",
        "ckptfs-stats",
        "ckptfs-revisions",
        "ckptfs-gc",
    ] {
        let p = root.join(format!("share/man/man1/{page}.1"));
        let text = fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(text.contains(".TH "), "{} is not a man page", p.display());
    }
    let bash = root.join("share/bash-completion/completions/ckptfs");
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&bash)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "bash -n {}: {check:?}",
        bash.display()
    );
    let text = fs::read_to_string(&bash).unwrap();
    for word in ["mount", "revisions", "--prometheus"] {
        assert!(text.contains(word), "bash completion lacks {word}");
    }
    assert!(root.join("share/zsh/site-functions/_ckptfs").is_file());
    assert!(root
        .join("share/fish/vendor_completions.d/ckptfs.fish")
        .is_file());
}

/// `ckptfs report --svg` draws a file's revisions and a directory's checkpoint steps; the
/// SVG is well-formed XML (checked with Python's parser where there is one) with a bar
/// pair per checkpoint and its labels.
#[test]
fn report_draws_revisions_of_a_file_and_steps_of_a_directory() {
    let m = TestMount::new();
    // model.pt and two ranks' states; a quarter of each changes per step.
    let mut states: Vec<Vec<u8>> = (0..3).map(|i| pattern(1 + i, 8 << 20)).collect();
    for step in 1..=6u64 {
        for (i, state) in states.iter_mut().enumerate() {
            let q = state.len() / 4;
            let at = (step as usize % 4) * q;
            state[at..at + q].copy_from_slice(&pattern(100 * (i as u64 + 1) + step, q));
        }
        fs::write(m.path("model.pt"), &states[0]).unwrap();
        fs::create_dir_all(m.path(format!("run/step-{step}"))).unwrap();
        for rank in 0..2 {
            let f = m.path(format!("run/step-{step}/rank-{rank}.bin"));
            fs::write(f, &states[rank + 1]).unwrap();
        }
    }
    std::os::unix::fs::symlink("step-6", m.path("run/latest")).unwrap();
    let dir = TempDir::new("report");
    let bin = ckptfs_tests::ckptfs_bin();
    for (target, want) in [("model.pt", "rev "), ("run", "step-6")] {
        let svg = dir.path().join(format!("{target}.svg"));
        let out = std::process::Command::new(&bin)
            .arg("report")
            .arg(m.path(target))
            .arg("--svg")
            .arg(&svg)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        println!("{said}{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "report {target}: {out:?}");
        assert!(said.contains(": 6 "), "six checkpoints of {target}: {said}");
        let text = fs::read_to_string(&svg).unwrap();
        if let Some(keep) = std::env::var_os("CKPTFS_KEEP_REPORT") {
            fs::copy(
                &svg,
                std::path::Path::new(&keep).join(format!("{target}.svg")),
            )
            .unwrap();
        }
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
        assert!(text.contains(want), "{target}: no label {want}");
        assert!(text.matches("<rect").count() >= 12, "{target}: bars");
        let parsed = std::process::Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])",
            ])
            .arg(&svg)
            .status();
        match parsed {
            Ok(st) => assert!(st.success(), "{target}: the SVG is not well-formed XML"),
            Err(e) => eprintln!("WARNING: no /usr/bin/python3 ({e}); XML not parsed"),
        }
    }
}

/// A user other than root mounts, uses, and unmounts a space (through fuse3's setuid
/// fusermount3, which fuser falls back to when mount(2) says EPERM), and `df`, `ckptfs
/// umount` and `fusermount3 -u` work for them. Needs root to play the user (nobody) and
/// /dev/fuse open to users, as distributions make it (`.ci/run` sets that mode where a
/// container made it 0600).
#[test]
fn an_unprivileged_user_mounts_uses_and_unmounts_a_space() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    const TEST: &str = "an_unprivileged_user_mounts_uses_and_unmounts_a_space";
    let fuse_mode = fs::metadata("/dev/fuse")
        .map(|m| m.permissions().mode() & 0o777)
        .ok();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || fuse_mode.is_none_or(|m| m & 0o006 != 0o006) {
        let why = format!(
            "needs root and /dev/fuse open to users (euid root: {root}, /dev/fuse mode {})",
            fuse_mode.map_or("absent".into(), |m| format!("{m:o}"))
        );
        return ckptfs_tests::skip(TEST, "root", &why);
    }
    let (uid, gid) = (65534u32, 65534u32);
    let dir = TempDir::new("user-mount");
    let bin = dir.path().join("ckptfs");
    fs::copy(ckptfs_tests::ckptfs_bin(), &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    let (space, mnt) = (dir.path().join("space"), dir.path().join("mnt"));
    fs::create_dir(&mnt).unwrap();
    for p in [dir.path(), &mnt] {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
    }
    let as_user = |prog: &std::path::Path, args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(prog)
            .args(args)
            .env("HOME", dir.path())
            .env("TMPDIR", dir.path())
            .uid(uid)
            .gid(gid)
            .output()
            .unwrap();
        println!(
            "$ {} {args:?}\n{}{}",
            prog.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{} {args:?} as uid {uid}: {out:?}",
            prog.display()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let sh = std::path::Path::new("/bin/sh");
    let (s, m) = (space.as_os_str(), mnt.as_os_str());
    as_user(
        &bin,
        &["format".as_ref(), s, "--size".as_ref(), "64M".as_ref()],
    );
    as_user(&bin, &["mount".as_ref(), s, m]);
    let (fstype, _, opts) = mountinfo(&mnt).expect("mounted by the user");
    assert!(fstype.starts_with("fuse"), "{fstype}");
    assert!(opts.contains("nosuid") && opts.contains("nodev"), "{opts}");
    let f = mnt.join("ckpt.bin");
    let script = format!(
        "head -c 3000000 /dev/urandom > {0} && cat {0} | wc -c",
        f.display()
    );
    let wc = as_user(sh, &["-c".as_ref(), script.as_ref()]);
    assert_eq!(wc.trim(), "3000000");
    let df = as_user("df".as_ref(), &[m]);
    assert!(df.contains(&*mnt.to_string_lossy()), "{df}");
    as_user(&bin, &["umount".as_ref(), m]);
    assert!(
        mountinfo(&mnt).is_none(),
        "still mounted after ckptfs umount"
    );

    // Again, unmounted with the helper directly; the checkpoint is still there.
    as_user(&bin, &["mount".as_ref(), s, m]);
    let n = as_user(
        sh,
        &["-c".as_ref(), format!("wc -c < {}", f.display()).as_ref()],
    );
    assert_eq!(n.trim(), "3000000", "the checkpoint survived the remount");
    // `fusermount3 -u` is refused (EBUSY) while anything references the mount, also for a
    // moment: it failed so once in CI right after `wc` had exited, with nothing of this test
    // left in the mount. It is retried only while no process has a file, a directory or a
    // mapping in the mount (a leak of ours would be such a holder, and fails the test
    // naming it); a reference too short to find is what the retry tolerates.
    let mut tries = 0;
    loop {
        let out = std::process::Command::new("fusermount3")
            .args(["-u".as_ref(), m])
            .uid(uid)
            .gid(gid)
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let holders = holders_of(&mnt);
        tries += 1;
        assert!(
            err.contains("busy") && holders.is_empty() && tries < 20,
            "fusermount3 -u as uid {uid} (try {tries}): {err}; holders: {holders:?}"
        );
        println!("fusermount3 -u: {err}; no holder found, try {tries} again");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        mountinfo(&mnt).is_none(),
        "still mounted after fusermount3 -u"
    );
}

/// What the processes of this machine hold inside `mnt`: open files, working and root
/// directories, and mapped files, as "pid N: PATH".
fn holders_of(mnt: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let base = p.path();
        let mut links: Vec<std::path::PathBuf> = vec![base.join("cwd"), base.join("root")];
        if let Ok(fds) = fs::read_dir(base.join("fd")) {
            links.extend(fds.flatten().map(|f| f.path()));
        }
        for l in links {
            if let Ok(t) = fs::read_link(&l) {
                if t.starts_with(mnt) {
                    found.push(format!("pid {pid}: {}", t.display()));
                }
            }
        }
        let maps = fs::read_to_string(base.join("maps")).unwrap_or_default();
        let m = mnt.to_string_lossy();
        for line in maps.lines().filter(|l| l.contains(&*m)) {
            found.push(format!("pid {pid}: mapped {line}"));
        }
    }
    found
}

/// The daemon says which gear search its cutter measured fastest on this CPU (having AVX-512
/// does not make its gathers fast: AMD Zen 4 ran them 3.5x slower than the scalar loop), and
/// `CKPTFS_GEAR` forces one. Whichever it uses, the data is the same.
#[test]
fn the_daemon_says_which_cutter_search_it_measured_and_ckptfs_gear_forces_one() {
    let mut m = TestMount::new();
    let log_path = m.backing().join("daemon.log");
    let log = || fs::read_to_string(&log_path).expect("daemon.log");
    let said = log();
    let line = said
        .lines()
        .rfind(|l| l.contains("cutter search "))
        .unwrap_or_else(|| panic!("no cutter search in the daemon's log:\n{said}"));
    #[cfg(target_arch = "x86_64")]
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    if avx512 {
        assert!(
            line.contains("measured GiB/s per core: scalar=") && line.contains("avx512="),
            "with AVX-512 both searches are measured: {line}"
        );
    } else {
        assert!(
            line.contains("cutter search scalar (the only search this CPU has)"),
            "{line}"
        );
    }
    let data = pattern(5, 3 << 20);
    fs::write(m.path("a"), &data).expect("write");
    m.unmount();
    // Each test runs in its own process under nextest: this reaches the daemon only.
    std::env::set_var("CKPTFS_GEAR", "scalar");
    m.mount();
    std::env::remove_var("CKPTFS_GEAR");
    let said = log();
    let line = said
        .lines()
        .rfind(|l| l.contains("cutter search "))
        .expect("a cutter search line");
    assert!(
        line.contains("cutter search scalar (chosen by CKPTFS_GEAR)"),
        "{line}"
    );
    fs::write(m.path("b"), &data).expect("write");
    assert_file_eq(&m.path("a"), &data);
    assert_file_eq(&m.path("b"), &data);
}

/// Runs `ckptfs ARGS` right after a plain (lazy) unmount of `m`, whose daemon `held` (a
/// descriptor open in the detached mount) keeps alive until the command says it is waiting
/// for that daemon (an event, not a sleep): (what it said until then, its exit status, the
/// rest of its output).
fn run_as_the_daemon_exits(
    m: &mut TestMount,
    held: fs::File,
    args: &[&OsStr],
) -> (String, std::process::ExitStatus, String) {
    m.lazy_unmount();
    let (child, said) = ckptfs_tests::spawn_until_said(
        std::process::Command::new(ckptfs_tests::ckptfs_bin()).args(args),
        "waiting for the daemon",
    );
    drop(held);
    let (status, rest) = ckptfs_tests::finish_said(child);
    (said, status, rest)
}
