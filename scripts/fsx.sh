#!/usr/bin/env bash
# Data-integrity run of fsx (Rust rewrite, `cargo install fsx`) against a fresh
# ckptfs mount, or against a plain directory (--plain).  Fixed seeds, so every
# run is reproducible; config in tests/fsx/fsx.toml (16 MiB file, ops up to
# 1 MiB, close/reopen, fsync, fdatasync, mmap, truncate, ...).
#
# Usage:
#   scripts/fsx.sh [CKPTFS_BIN]      # default CKPTFS_BIN=target/debug/ckptfs
#   scripts/fsx.sh --plain DIR       # same runs in an existing plain dir, no mount
#
# Environment:
#   FSX             fsx binary (default: from PATH, then ~/.cargo/bin)
#   FSX_SEEDS       space separated seeds (default "1 2 3")
#   FSX_NUMOPS      operations per seed (default 10000)
#   FSX_TIMEOUT     seconds per seed (default 1200)
#   CKPTFS_TEST_LOG_DIR  where logs/artifacts go (default target/test-logs)
#   CKPTFS_SIZE       size for `ckptfs format --size` (default 3G). Each seed gets a freshly
#                     formatted space: until `ckptfs gc` exists (issue 3) every fsync/close
#                     keeps a revision and nothing is reclaimed, and 10,000 fsx ops with
#                     fsync and close/reopen store about 1.6 GiB of changed chunks.
#   CKPTFS_MOUNT_OPTS  extra `ckptfs mount` options, e.g. "--threads 8"
#   KEEP_WORKDIR=1  keep the temp backing dir/mountpoint for inspection
#
# Reproduce a failure: fsx -f tests/fsx/fsx.toml -N <numops> -S <seed> -vv <file>
# (-b <opnum> starts real I/O at that op; the failing op number is in the log).
#
# Exit status: 0 = all seeds completed "All operations completed A-OK!";
# 1 = a miscompare / error / crash / timeout in any seed, or unmount failure;
# 2 = setup error.
set -euo pipefail
# shellcheck disable=SC2034  # used by log() in lib/common.sh
SCRIPT_NAME=fsx
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

CONFIG="$REPO_ROOT/tests/fsx/fsx.toml"
read -r -a SEEDS <<<"${FSX_SEEDS:-1 2 3}"
NUMOPS="${FSX_NUMOPS:-10000}"
TIMEOUT="${FSX_TIMEOUT:-1200}"

parse_suite_args "$@"
[[ -f $CONFIG ]] || die "missing $CONFIG"

FSX_BIN="${FSX:-$(command -v fsx || true)}"
[[ -n $FSX_BIN ]] || FSX_BIN="$HOME/.cargo/bin/fsx"
[[ -x $FSX_BIN ]] || die "fsx not found (cargo install --locked fsx)"

ART_DIR="$LOG_DIR/fsx"
mkdir -p "$ART_DIR"
rm -f "$ART_DIR"/*

if [[ -n $PLAIN_DIR ]]; then
    [[ -d $PLAIN_DIR ]] || die "--plain: not a directory: $PLAIN_DIR"
    TARGET="$(cd "$PLAIN_DIR" && pwd)"
    MODE="plain directory $TARGET ($(stat -f -c %T "$TARGET"))"
else
    require_fuse
    BIN="$(resolve_ckptfs_bin "$BIN_ARG")"
    SPACE_SIZE="${CKPTFS_SIZE:-3G}"
    ckptfs_mount "$BIN" "$SPACE_SIZE"   # sets CKPTFS_MNT, EXIT trap unmounts
    TARGET="$CKPTFS_MNT"
    MODE="ckptfs mount $TARGET ($BIN)"
fi

# One-line space accounting from `ckptfs stats --json` (diagnostics only).
space_report() {
    local j
    j="$(timeout 30 "$BIN" stats --json "$TARGET" 2>/dev/null)" || return 0
    jget() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" <<<"$j"; }
    printf '    space %s: stored %s MiB, free %s MiB, revisions %s, chunks %s\n' "$1" \
        "$(( $(jget stored_bytes) / 1048576 ))" "$(( $(jget free_bytes) / 1048576 ))" \
        "$(jget revisions)" "$(jget chunks)"
}

log "target: $MODE; seeds: ${SEEDS[*]}; $NUMOPS ops each; config $CONFIG"
failed=()
total_start=$SECONDS
# Unmount, reformat and remount, so each seed starts with an empty space (see CKPTFS_SIZE).
fresh_space() {
    ckptfs_umount || die "ckptfs umount failed"
    "$BIN" format --force "$CKPTFS_BACKING" --size "$SPACE_SIZE" >/dev/null \
        || die "ckptfs format --force failed"
    timeout 60 "$BIN" mount "$CKPTFS_BACKING" "$CKPTFS_MNT" </dev/null \
        || die "ckptfs mount failed (rc=$?)"
    CKPTFS_MOUNTED=1
}

first=1
for seed in "${SEEDS[@]}"; do
    if [[ -z $PLAIN_DIR && $first -eq 0 ]]; then fresh_space; fi
    first=0
    file="$TARGET/fsx.seed$seed"
    out="$ART_DIR/seed$seed.log"
    start=$SECONDS
    rc=0
    # -v: one info line per operation, so a panic (syscall error, rc=101) still
    # shows the operations leading up to it; a miscompare also dumps fsx's oplog.
    RUST_BACKTRACE=0 timeout -k 15 "$TIMEOUT" "$FSX_BIN" -v -f "$CONFIG" -N "$NUMOPS" -S "$seed" \
        -P "$ART_DIR" "$file" >"$out" 2>&1 </dev/null || rc=$?
    secs=$((SECONDS - start))
    if [[ $rc -eq 0 ]] && grep -q 'All operations completed A-OK' "$out"; then
        echo "fsx seed $seed: OK ($NUMOPS ops, ${secs}s)"
        rm -f "$out"
    else
        case $rc in
            124|137) why="TIMEOUT after ${TIMEOUT}s" ;;
            1) why="miscompare/error (rc=1)" ;;
            101) why="panic, probably a syscall error (rc=101)" ;;
            *) why="rc=$rc" ;;
        esac
        echo "fsx seed $seed: FAIL: $why after ${secs}s; log $out"
        if grep -q 'LOG DUMP' "$out"; then
            # fsx's own report: the error, then its dump of the recent operations.
            sed -n '/\(ERROR\|WARN\)/,/LOG DUMP/p' "$out" | head -n 30 | sed 's/^/    | /'
            echo "    | ... last operations:"
            sed '1,/LOG DUMP/d' "$out" | tail -n 15 | sed 's/^/    | /'
        else
            # Panic (a syscall failed) or kill: the last operations logged, then the panic.
            grep -v '^\s*$' "$out" | tail -n 12 | sed 's/^/    | /'
        fi
        timeout 60 cp "$file" "$ART_DIR/seed$seed.fsxbad" 2>/dev/null || true
        if [[ -z $PLAIN_DIR ]]; then
            timeout 30 "$BIN" stats "$TARGET" 2>&1 | sed 's/^/    stats: /' || true
        fi
        echo "    reproduce: $FSX_BIN -f $CONFIG -N $NUMOPS -S $seed -vv <file on the fs>"
        failed+=("$seed")
    fi
    if [[ -z $PLAIN_DIR ]]; then space_report "after seed $seed"; fi
    # Independent seeds: never leave a file (or a full file system) behind.
    rm -f "$file"
    if [[ -z $PLAIN_DIR ]]; then space_report "after unlink"; fi
done

status=0
[[ ${#failed[@]} -eq 0 ]] || status=1
if [[ -z $PLAIN_DIR ]] && ! ckptfs_umount; then
    echo "fsx: FAIL (ckptfs umount failed)"; status=1
fi
if [[ $status -eq 0 ]]; then
    echo "fsx: PASS (${#SEEDS[@]} seeds x $NUMOPS ops on $MODE, $((SECONDS - total_start))s)"
else
    echo "fsx: FAIL (seeds failed: ${failed[*]:-none}; logs in $ART_DIR)"
fi
exit "$status"
