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
# Tests format fallocated spaces side by side in $TMPDIR: say how much room there is, so a
# "larger than the free space" failure reads at a glance.
echo
echo "==> free disk space (tests reserve their spaces in ${TMPDIR:-/tmp}), $(nproc) cores"
df -h "${TMPDIR:-/tmp}" "$TARGET_DIR" 2>/dev/null || true
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
