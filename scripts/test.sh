#!/usr/bin/env bash
# The single test entry point (README, .ci/run): formatting, lints, build,
# unit/integration tests, then POSIX (pjdfstest), data-integrity (fsx) and
# parallel-pattern (fio) runs against a real ckptfs mount of the freshly built
# debug binary.
#
# Usage: scripts/test.sh          (as root: FUSE mount, pjdfstest user switching)
# Env:   CKPTFS_SKIP_FS_TESTS=1   skip the pjdfstest/fsx/fio steps (e.g. no /dev/fuse
#                                 or not root); the final line then says SKIPPED.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
CKPTFS_BIN="$TARGET_DIR/debug/ckptfs"

STEP="(setup)"
T0=$SECONDS
TIMINGS=()
on_exit() {
    local rc=$?
    # The memory-backed disk the tests ran on when the machine's was short (use_test_disk).
    if [[ -n ${TEST_DISK[0]:-} ]]; then
        umount -l "${TEST_DISK[0]}" 2>/dev/null || true
        losetup -d "${TEST_DISK[1]}" 2>/dev/null || true
        rmdir "${TEST_DISK[0]}" 2>/dev/null || true
        rm -f "${TEST_DISK[2]}"
    fi
    echo
    if [[ ${#TIMINGS[@]} -gt 0 ]]; then printf '  %s\n' "${TIMINGS[@]}"; fi
    if [[ $rc -ne 0 ]]; then
        echo "test.sh: FAIL in step: $STEP (rc=$rc, after $((SECONDS - T0))s)"
    else
        echo "test.sh: $RESULT in $((SECONDS - T0))s"
    fi
}
RESULT="PASS"
trap on_exit EXIT

step() {
    STEP="$*"
    echo
    echo "==> $STEP"
    local s=$SECONDS
    "$@"
    TIMINGS+=("$(printf '%4ds  %s' $((SECONDS - s)) "$STEP")")
}

step cargo fmt --all -- --check
step cargo clippy --workspace --all-targets --locked -- -D warnings
step cargo build --workspace --locked
# Tests format fallocated spaces side by side in $TMPDIR (and fsx.sh a 3G one): say how much
# room there is, so a "larger than the free space" failure reads at a glance.
echo
echo "==> free disk space (tests reserve their spaces in ${TMPDIR:-/tmp}), $(nproc) cores"
df -h "${TMPDIR:-/tmp}" "$TARGET_DIR" 2>/dev/null || true
# CI machines share their disk and have been seen with about 1 GiB free once the build is
# done, too little for the tests' spaces side by side. Where TMPDIR has less than
# CKPTFS_TEST_MIN_FREE_GIB free (default 8; 0 turns this off) and this runs as root with the
# memory to spare, the tests run in an ext4 filesystem of that size on a loop device over a
# sparse file in /dev/shm instead, said here: the suite checks ckptfs, not the machine's disk,
# on the filesystem kind a disk has (tmpfs differs: no FALLOC_FL_ZERO_RANGE, for one). It
# holds memory only for what the tests keep on it (mounted with discard, so deleted files give
# theirs back), and goes when the script exits.
TEST_DISK=() # mountpoint, loop device, image
use_test_disk() {
    local need_gib=${CKPTFS_TEST_MIN_FREE_GIB:-8} tmp=${TMPDIR:-/tmp} free_kib avail_kib
    local img dev mnt
    [[ $need_gib -gt 0 ]] || return 0
    free_kib=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
    [[ $free_kib -lt $((need_gib << 20)) ]] || return 0
    avail_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    if [[ $(id -u) -ne 0 ]] || [[ $avail_kib -lt $(((need_gib + 8) << 20)) ]]; then
        echo "WARNING: $tmp has $((free_kib >> 10)) MiB free, less than the ${need_gib} GiB the" \
            "tests may reserve at once, and no memory-backed disk can stand in (needs root and" \
            "$((need_gib + 8)) GiB of available memory): expect 'larger than the free space' failures"
        return 0
    fi
    # Every step may fail (no /dev/shm, no loop devices, no mkfs.ext4): then the tests run
    # where they were, with the warning below, and nothing is left behind.
    # A short mountpoint path: pjdfstest's under it must stay within 30 bytes (lib/common.sh).
    if img="$(mktemp /dev/shm/ckptfs-test-disk.XXXXXX)" && mnt="$(mktemp -d /run/ck.XXXXXX)" \
        && truncate -s "${need_gib}G" "$img" && dev="$(losetup --find --show "$img")" \
        && mkfs.ext4 -q -F -m 0 -E nodiscard "$dev" && mount -o discard "$dev" "$mnt" \
        && chmod 1777 "$mnt"; then
        TEST_DISK=("$mnt" "$dev" "$img")
        export TMPDIR="$mnt"
        echo "==> NOTE: $tmp has only $((free_kib >> 10)) MiB free; the tests run in a" \
            "${need_gib} GiB ext4 on $dev (memory-backed, $img) at $TMPDIR instead"
    else
        echo "WARNING: $tmp has $((free_kib >> 10)) MiB free and no loop-device ext4 could" \
            "stand in: expect 'larger than the free space' failures"
        if [[ -n ${mnt:-} ]]; then
            umount "$mnt" 2>/dev/null || true
            rmdir "$mnt" 2>/dev/null || true
        fi
        if [[ -n ${dev:-} ]]; then losetup -d "$dev" 2>/dev/null || true; fi
        if [[ -n ${img:-} ]]; then rm -f "$img"; fi
    fi
    return 0
}
use_test_disk
step cargo nextest run --workspace --locked --no-tests=fail

if [[ -n ${CKPTFS_SKIP_FS_TESTS:-} ]]; then
    RESULT="PASS (fmt, clippy, build, nextest), pjdfstest/fsx/fio SKIPPED (CKPTFS_SKIP_FS_TESTS set)"
    exit 0
fi
[[ $(id -u) -eq 0 ]] || { STEP="(pjdfstest needs root)"; echo "pjdfstest/fsx need root (or set CKPTFS_SKIP_FS_TESTS=1)"; exit 1; }

# Run every file system suite even if one fails, then fail.
FS_FAILED=()
step_soft() {
    local s=$SECONDS rc=0
    STEP="$*"
    echo
    echo "==> $STEP"
    "$@" || rc=$?
    TIMINGS+=("$(printf '%4ds  %s%s' $((SECONDS - s)) "$STEP" "$([[ $rc -eq 0 ]] || echo "  FAILED rc=$rc")")")
    [[ $rc -eq 0 ]] || FS_FAILED+=("${1##*/}")
}
step_soft scripts/pjdfstest.sh "$CKPTFS_BIN"
step_soft scripts/fsx.sh "$CKPTFS_BIN"
step_soft scripts/fio.sh "$CKPTFS_BIN"
if [[ ${#FS_FAILED[@]} -gt 0 ]]; then
    STEP="${FS_FAILED[*]}"
    exit 1
fi

RESULT="PASS (fmt, clippy, build, nextest, pjdfstest, fsx, fio)"
