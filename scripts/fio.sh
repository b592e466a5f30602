#!/usr/bin/env bash
# fio against a fresh ckptfs mount (or a plain directory, --plain, to compare): N-N
# (8 jobs, one file each), N-1 segmented (8 jobs, disjoint contiguous regions of one
# shared file) and N-1 strided (8 jobs interleaving blocks of one shared file). Each
# pattern is a write pass, then an unmount + mount, then a read pass that checks every
# block's crc32c (fio --verify_only, verify_fatal=1). Job definitions: tests/fio/ckptfs.fio.
#
# Usage:
#   scripts/fio.sh [CKPTFS_BIN]      # default CKPTFS_BIN=target/debug/ckptfs
#   scripts/fio.sh --plain DIR       # same passes in a fresh subdirectory of DIR, no mount
#
# Environment:
#   FIO              fio binary (default: from PATH)
#   FIO_JOB_MIB      MiB each job writes (default 8: 64 MiB per pattern)
#   FIO_STRIDE_KIB   block of the strided pattern (default 64)
#   FIO_TIMEOUT      seconds per fio run (default 300)
#   CKPTFS_SIZE      size for `ckptfs format --size` (default 1G)
#   CKPTFS_MOUNT_OPTS  extra `ckptfs mount` options, e.g. "--threads 8"
#   CKPTFS_TEST_LOG_DIR  where logs go (default target/test-logs); fio's output per pass is
#                    in fio/<pattern>-{write,verify}.log there
#   KEEP_WORKDIR=1   keep the temp backing dir/mountpoint for inspection
#
# Reproduce one pass: export FIO_DIR FIO_JOB_BYTES FIO_STRIDE_BS FIO_STRIDE_SKIP
# FIO_STRIDE_SPAN as printed, then fio --section=<pattern> [--verify_only] tests/fio/ckptfs.fio
#
# Exit status: 0 = every pass ran and verified; 1 = a fio error or miscompare, or an
# unmount failure; 2 = setup error.
set -euo pipefail
# shellcheck disable=SC2034  # used by log() in lib/common.sh
SCRIPT_NAME=fio
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

JOBFILE="$REPO_ROOT/tests/fio/ckptfs.fio"
PATTERNS=(n-n n-1-segmented n-1-strided)
JOB_MIB="${FIO_JOB_MIB:-8}"
STRIDE_KIB="${FIO_STRIDE_KIB:-64}"
TIMEOUT="${FIO_TIMEOUT:-300}"

parse_suite_args "$@"
[[ -f $JOBFILE ]] || die "missing $JOBFILE"
FIO_BIN="${FIO:-$(command -v fio || true)}"
[[ -n $FIO_BIN && -x $FIO_BIN ]] || die "fio not found (apt-get install fio)"
[[ $JOB_MIB =~ ^[1-9][0-9]*$ && $STRIDE_KIB =~ ^[1-9][0-9]*$ ]] \
    || die "FIO_JOB_MIB and FIO_STRIDE_KIB must be positive integers"
((JOB_MIB * 1024 % STRIDE_KIB == 0)) || die "FIO_STRIDE_KIB must divide FIO_JOB_MIB x 1024"

# The job file reads these (see its header).
export FIO_JOB_BYTES=$((JOB_MIB << 20))
export FIO_STRIDE_BS=$((STRIDE_KIB << 10))
export FIO_STRIDE_SKIP=$((7 * FIO_STRIDE_BS))
export FIO_STRIDE_SPAN=$((8 * FIO_JOB_BYTES - FIO_STRIDE_SKIP))
export FIO_DIR

ART_DIR="$LOG_DIR/fio"
mkdir -p "$ART_DIR"
rm -f "$ART_DIR"/*.log

PLAIN_WORK=""
if [[ -n $PLAIN_DIR ]]; then
    [[ -d $PLAIN_DIR ]] || die "--plain: not a directory: $PLAIN_DIR"
    PLAIN_WORK="$(mktemp -d "$(cd "$PLAIN_DIR" && pwd)/ckptfs-fio.XXXXXX")"
    trap 'rm -rf "$PLAIN_WORK"' EXIT
    TARGET="$PLAIN_WORK"
    MODE="plain directory $TARGET ($(stat -f -c %T "$TARGET"))"
else
    require_fuse
    BIN="$(resolve_ckptfs_bin "$BIN_ARG")"
    ckptfs_mount "$BIN" "${CKPTFS_SIZE:-1G}"   # sets CKPTFS_MNT, EXIT trap unmounts
    TARGET="$CKPTFS_MNT"
    MODE="ckptfs mount $TARGET ($BIN)"
fi

# Everything the read pass sees comes from the backing space, not from the daemon's memory.
remount() {
    [[ -z $PLAIN_DIR ]] || return 0
    ckptfs_umount || die "ckptfs umount failed"
    timeout 60 "$BIN" mount "$CKPTFS_BACKING" "$CKPTFS_MNT" </dev/null \
        || die "ckptfs mount failed (rc=$?)"
    CKPTFS_MOUNTED=1
}

# "bw=58.9MiB/s, io=64.0MiB, run=1087msec" from fio's group summary line (READ: or WRITE:).
summary() {
    sed -n "s/^ *$1: bw=\([^ ]*\) ([^)]*), [^,]*, io=\([^ ]*\) ([^)]*), run=\([0-9]*\)-.*/bw=\1, io=\2, \3 ms/p" "$2"
}

# run_pass PATTERN write|verify: one fio run; fails on a nonzero exit, any job error or a
# verify failure in the log.
run_pass() {
    local pattern=$1 pass=$2 out="$ART_DIR/$1-$2.log" rc=0
    local -a extra=(--do_verify=0)
    [[ $pass == write ]] || extra=(--verify_only)
    timeout -k 15 "$TIMEOUT" "$FIO_BIN" --section="$pattern" "${extra[@]}" "$JOBFILE" \
        >"$out" 2>&1 </dev/null || rc=$?
    if [[ $rc -ne 0 ]] || grep -q 'verify failed\|err= *[1-9]\|fio: pid=' "$out"; then
        echo "fio $pattern $pass pass: FAIL (rc=$rc); log $out"
        grep -m 10 'verify failed\|err=\|fio: \|error' "$out" | sed 's/^/    | /' || true
        return 1
    fi
    local dir=READ
    [[ $pass == write ]] && dir=WRITE
    PASS_SUMMARY="$(summary "$dir" "$out")"
    [[ -n $PASS_SUMMARY ]] || { echo "fio $pattern $pass pass: no $dir summary in $out"; return 1; }
}

log "target: $MODE; 8 jobs x $JOB_MIB MiB per pattern, strided blocks of $STRIDE_KIB KiB; $FIO_BIN"
log "FIO_JOB_BYTES=$FIO_JOB_BYTES FIO_STRIDE_BS=$FIO_STRIDE_BS FIO_STRIDE_SKIP=$FIO_STRIDE_SKIP FIO_STRIDE_SPAN=$FIO_STRIDE_SPAN"
VERIFY_LABEL="verify-read after remount"
[[ -z $PLAIN_DIR ]] || VERIFY_LABEL="verify-read (plain dir, no remount)"
failed=()
total_start=$SECONDS
for pattern in "${PATTERNS[@]}"; do
    FIO_DIR="$TARGET/$pattern"
    mkdir -p "$FIO_DIR"
    start=$SECONDS
    if run_pass "$pattern" write; then
        write_summary=$PASS_SUMMARY
        remount
        if run_pass "$pattern" verify; then
            echo "fio $pattern: write $write_summary; $VERIFY_LABEL $PASS_SUMMARY; OK ($((SECONDS - start))s)"
        else
            failed+=("$pattern")
        fi
    else
        failed+=("$pattern")
    fi
    # Independent patterns: leave nothing behind.
    rm -rf "$FIO_DIR"
done

status=0
[[ ${#failed[@]} -eq 0 ]] || status=1
if [[ -z $PLAIN_DIR ]] && ! ckptfs_umount; then
    echo "fio: FAIL (ckptfs umount failed)"; status=1
fi
if [[ $status -eq 0 ]]; then
    echo "fio: PASS (${#PATTERNS[@]} patterns x 8 jobs x $JOB_MIB MiB on $MODE, $((SECONDS - total_start))s)"
else
    echo "fio: FAIL (patterns failed: ${failed[*]}; logs in $ART_DIR)"
fi
exit "$status"
