# shellcheck shell=bash
# Shared helpers for scripts/pjdfstest.sh and scripts/fsx.sh.
# Sourced, not executed.  Callers use `set -euo pipefail`.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck disable=SC2034  # used by the sourcing scripts
LOG_DIR="${CKPTFS_TEST_LOG_DIR:-$REPO_ROOT/target/test-logs}"

log() { printf '[%s] %s\n' "${SCRIPT_NAME:-ckptfs-test}" "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

require_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (FUSE mount, chown tests, user switching)"
}

# Absolute path of the ckptfs binary, default ${CARGO_TARGET_DIR:-target}/debug/ckptfs.
resolve_ckptfs_bin() {
    local bin="${1:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/ckptfs}"
    [[ $bin == /* ]] || bin="$PWD/$bin"
    [[ -x $bin ]] || die "ckptfs binary not found or not executable: $bin (build it: cargo build -p ckptfs)"
    printf '%s\n' "$bin"
}

require_fuse() {
    [[ -c /dev/fuse ]] || die "/dev/fuse missing (modprobe fuse? container without --device /dev/fuse?)"
    command -v fusermount3 >/dev/null || command -v fusermount >/dev/null \
        || die "fusermount3 not found (apt-get install fuse3)"
}

# Globals set by ckptfs_mount; used by ckptfs_cleanup.
CKPTFS_BIN=""
CKPTFS_WORK=""
CKPTFS_BACKING=""
CKPTFS_MNT=""
CKPTFS_MOUNTED=0

# ckptfs_mount BIN SIZE [MOUNT_OPTION...]: format a fresh backing dir and mount
# it on a fresh mountpoint, both under a new temp dir ($CKPTFS_WORK).  Extra
# `ckptfs mount` options come from the arguments and $CKPTFS_MOUNT_OPTS.
# Installs an EXIT trap that unmounts and removes everything.
ckptfs_mount() {
    CKPTFS_BIN="$1"
    local size="${2:-1G}"
    shift 2 || shift $#
    local -a mopts=("$@")
    local -a extra=()
    read -r -a extra <<<"${CKPTFS_MOUNT_OPTS:-}"
    mopts+=("${extra[@]}")
    # A short name: pjdfstest binds sockets 77 bytes below the mountpoint, and a socket's
    # path has 108 bytes (sun_path), so a mountpoint path over 30 bytes fails its socket
    # tests with ENAMETOOLONG, which says nothing of ckptfs.
    CKPTFS_WORK="$(mktemp -d "${TMPDIR:-/tmp}/ckh.XXXXXX")"
    CKPTFS_BACKING="$CKPTFS_WORK/backing"
    CKPTFS_MNT="$CKPTFS_WORK/mnt"
    if [[ ${#CKPTFS_MNT} -gt 30 ]]; then
        log "WARNING: the mountpoint $CKPTFS_MNT is ${#CKPTFS_MNT} bytes long, over 30:" \
            "pjdfstest's socket tests will fail with ENAMETOOLONG (a shorter TMPDIR avoids it)"
    fi
    # mktemp makes 0700; the unprivileged users pjdfstest switches to must be
    # able to walk down to the mountpoint.
    chmod 0755 "$CKPTFS_WORK"
    mkdir -p "$CKPTFS_BACKING" "$CKPTFS_MNT"
    trap ckptfs_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    log "format: $CKPTFS_BIN format $CKPTFS_BACKING --size $size"
    "$CKPTFS_BIN" format "$CKPTFS_BACKING" --size "$size" \
        || die "ckptfs format failed"
    log "mount: $CKPTFS_BIN mount ${mopts[*]} $CKPTFS_BACKING $CKPTFS_MNT"
    timeout 60 "$CKPTFS_BIN" mount "${mopts[@]}" "$CKPTFS_BACKING" "$CKPTFS_MNT" </dev/null \
        || die "ckptfs mount failed (rc=$?)"
    CKPTFS_MOUNTED=1
    local fstype opts
    fstype="$(findmnt -n -o FSTYPE -M "$CKPTFS_MNT" || true)"
    [[ $fstype == fuse* ]] || die "ckptfs mount returned but $CKPTFS_MNT is not a FUSE mount (fstype='$fstype')"
    opts="$(findmnt -n -o OPTIONS -M "$CKPTFS_MNT" || true)"
    log "mounted: $fstype ($opts)"
}

# Abort the FUSE connection of a (hung) mount.
_fuse_abort() {
    local dev minor
    dev="$(mountpoint -d "$1" 2>/dev/null || true)"
    minor="${dev#*:}"
    if [[ -n $minor && -w /sys/fs/fuse/connections/$minor/abort ]]; then
        log "aborting FUSE connection $minor"
        echo 1 >"/sys/fs/fuse/connections/$minor/abort" || true
    fi
}

ckptfs_umount() {
    [[ $CKPTFS_MOUNTED -eq 1 ]] || return 0
    local rc=0
    log "umount: $CKPTFS_BIN umount $CKPTFS_MNT"
    timeout 120 "$CKPTFS_BIN" umount "$CKPTFS_MNT" </dev/null || rc=$?
    if [[ $rc -ne 0 ]] || mountpoint -q "$CKPTFS_MNT"; then
        log "ERROR: ckptfs umount failed (rc=$rc); forcing"
        _fuse_abort "$CKPTFS_MNT"
        fusermount3 -u -z "$CKPTFS_MNT" 2>/dev/null || umount -l "$CKPTFS_MNT" 2>/dev/null || true
        CKPTFS_MOUNTED=0
        return 1
    fi
    CKPTFS_MOUNTED=0
    return 0
}

ckptfs_cleanup() {
    local rc=$?
    trap - EXIT
    if [[ $CKPTFS_MOUNTED -eq 1 ]]; then
        if ! ckptfs_umount && [[ $rc -eq 0 ]]; then rc=1; fi
    fi
    if [[ -n $CKPTFS_WORK && -d $CKPTFS_WORK ]]; then
        if [[ -n ${KEEP_WORKDIR:-} ]]; then
            log "keeping $CKPTFS_WORK (KEEP_WORKDIR set)"
        elif mountpoint -q "$CKPTFS_MNT" 2>/dev/null; then
            log "not removing $CKPTFS_WORK: $CKPTFS_MNT still mounted"
        else
            rm -rf --one-file-system "$CKPTFS_WORK" || true
        fi
    fi
    exit "$rc"
}

# The arguments both suite scripts take: `[CKPTFS_BIN]` or `--plain DIR`. Sets BIN_ARG and
# PLAIN_DIR; prints the calling script's header comment as usage on anything else.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }

parse_suite_args() {
    PLAIN_DIR=""
    BIN_ARG=""
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --plain) [[ $# -ge 2 ]] || usage; PLAIN_DIR="$2"; shift 2 ;;
            -h|--help) usage ;;
            -*) usage ;;
            *) [[ -z $BIN_ARG ]] || usage; BIN_ARG="$1"; shift ;;
        esac
    done
    [[ -z $PLAIN_DIR || -z $BIN_ARG ]] || usage
}
