#!/usr/bin/env bash
# POSIX conformance run of pjdfstest (Rust rewrite, `cargo install pjdfstest`)
# against a fresh ckptfs mount, or against a plain directory (--plain).
#
# Usage:
#   scripts/pjdfstest.sh [CKPTFS_BIN]     # default CKPTFS_BIN=target/debug/ckptfs
#   scripts/pjdfstest.sh --plain DIR      # same groups in an existing plain dir, no mount
#
# Environment:
#   PJDFSTEST          pjdfstest binary (default: from PATH, then ~/.cargo/bin)
#   PJDFSTEST_GROUPS   space separated groups (default: the 10 below)
#   PJDFSTEST_TIMEOUT  seconds for the whole pjdfstest run (default 1200)
#   CKPTFS_TEST_LOG_DIR  where the full log goes (default target/test-logs)
#   PJDFSTEST_EXCLUDED exclusion list (default tests/pjdfstest/EXCLUDED.md)
#   CKPTFS_SIZE       size for `ckptfs format --size` (default 1G)
#   CKPTFS_MOUNT_OPTS  extra `ckptfs mount` options (--allow-other is always passed)
#   KEEP_WORKDIR=1     keep the temp backing dir/mountpoint for inspection
#
# Exit status: 0 = every failing sub-test is listed in tests/pjdfstest/EXCLUDED.md;
# 1 = unexpected failures (or unmount failure, or pjdfstest crashed/hung);
# 2 = setup error.
set -euo pipefail
# shellcheck disable=SC2034  # used by log() in lib/common.sh
SCRIPT_NAME=pjdfstest
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

CONFIG="$REPO_ROOT/tests/pjdfstest/pjdfstest.toml"
EXCLUDED="${PJDFSTEST_EXCLUDED:-$REPO_ROOT/tests/pjdfstest/EXCLUDED.md}"
GROUPS_DEFAULT="open ftruncate truncate unlink rename mkdir rmdir chmod chown utimensat"
read -r -a TEST_GROUPS <<<"${PJDFSTEST_GROUPS:-$GROUPS_DEFAULT}"
TIMEOUT="${PJDFSTEST_TIMEOUT:-1200}"

parse_suite_args "$@"

require_root
[[ -f $CONFIG ]] || die "missing $CONFIG"
[[ -f $EXCLUDED ]] || die "missing $EXCLUDED"

PJD="${PJDFSTEST:-$(command -v pjdfstest || true)}"
[[ -n $PJD ]] || PJD="$HOME/.cargo/bin/pjdfstest"
[[ -x $PJD ]] || die "pjdfstest not found (cargo install --locked pjdfstest)"

# --- dummy users -----------------------------------------------------------
# pjdfstest switches (seteuid/setegid) to two unprivileged users, each with its
# primary group: `nobody` (group nogroup on Debian) and `tests`.
getent passwd nobody >/dev/null || die "user nobody missing"
NOBODY_GROUP="$(id -gn nobody)"
if ! getent passwd tests >/dev/null; then
    log "creating dummy user/group 'tests' for pjdfstest"
    getent group tests >/dev/null || groupadd --system tests
    useradd --system -g tests --no-create-home --home-dir / \
        --shell /usr/sbin/nologin tests
fi
[[ "$(id -gn tests)" == tests ]] || die "user 'tests' must have primary group 'tests'"

mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/pjdfstest.log"
RUNTIME_DIR="$(mktemp -d "${TMPDIR:-/tmp}/pjdfstest-run.XXXXXX")"
trap 'rm -rf "$RUNTIME_DIR"' EXIT
RUNTIME_CONFIG="$RUNTIME_DIR/pjdfstest.toml"
# Adapt nobody's group name to this distro (nogroup on Debian, nobody elsewhere).
sed "s/\[\"nobody\", \"nogroup\"\]/[\"nobody\", \"$NOBODY_GROUP\"]/" "$CONFIG" >"$RUNTIME_CONFIG"

# --- target directory ------------------------------------------------------
SECONDARY=""
if [[ -n $PLAIN_DIR ]]; then
    [[ -d $PLAIN_DIR ]] || die "--plain: not a directory: $PLAIN_DIR"
    TARGET="$(cd "$PLAIN_DIR" && pwd)"
    MODE="plain directory $TARGET ($(stat -f -c %T "$TARGET"))"
    # rename::exdev_target wants a directory on another file system.
    for cand in /dev/shm /tmp /var/tmp; do
        if [[ -d $cand && "$(stat -c %d "$cand")" != "$(stat -c %d "$TARGET")" ]]; then
            SECONDARY="$(mktemp -d "$cand/pjdfstest-secondary.XXXXXX")"
            trap 'rm -rf "$RUNTIME_DIR" "$SECONDARY"' EXIT
            break
        fi
    done
else
    require_fuse
    BIN="$(resolve_ckptfs_bin "$BIN_ARG")"
    # --allow-other: pjdfstest seteuid()s to nobody/tests; without allow_other
    # FUSE denies every access by a uid other than the mounter's.
    ckptfs_mount "$BIN" "${CKPTFS_SIZE:-1G}" --allow-other   # sets CKPTFS_WORK/CKPTFS_MNT, EXIT trap unmounts
    TARGET="$CKPTFS_MNT"
    MODE="ckptfs mount $TARGET ($BIN)"
    if [[ "$(findmnt -n -o OPTIONS -M "$TARGET")" != *allow_other* ]]; then
        log "WARNING: mount lacks allow_other: the nobody/tests users get EACCES on every access"
    fi
    SECONDARY="$CKPTFS_WORK/secondary"   # on the host fs, not on the mount
    mkdir -p "$SECONDARY"
    mv "$RUNTIME_CONFIG" "$CKPTFS_WORK/pjdfstest.toml"
    RUNTIME_CONFIG="$CKPTFS_WORK/pjdfstest.toml"
    rmdir "$RUNTIME_DIR"
fi

PATTERNS=()
for g in "${TEST_GROUPS[@]}"; do PATTERNS+=("$g::"); done
ARGS=(-c "$RUNTIME_CONFIG" -p "$TARGET")
[[ -z $SECONDARY ]] || ARGS+=(-s "$SECONDARY")

log "target: $MODE"
log "groups: ${TEST_GROUPS[*]}"
log "running: $PJD ${ARGS[*]} ${PATTERNS[*]}  (log: $LOG)"
start=$SECONDS
prc=0
( cd / && NO_COLOR=1 CLICOLOR=0 RUST_BACKTRACE=0 \
    timeout -k 15 "$TIMEOUT" "$PJD" "${ARGS[@]}" "${PATTERNS[@]}" ) >"$LOG" 2>&1 || prc=$?
elapsed=$((SECONDS - start))

# --- evaluate ---------------------------------------------------------------
# Output lines: "<name> <pad> ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY",
# followed (FAILED/skipped) by message lines, then "Summary: ...".
RES="$(mktemp)"; MSG="$(mktemp)"
sed 's/\x1b\[[0-9;]*m//g' "$LOG" | awk -v res="$RES" -v msg="$MSG" '
    function flush() { if (cur != "") { gsub(/\t/, " ", buf); print cur "\t" buf > msg }; cur = ""; buf = "" }
    match($0, /^[A-Za-z0-9_]+(::[A-Za-z0-9_]+)+ +(ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY)$/) {
        flush()
        name = $1; st = $0; sub(/^[^ ]+ +/, "", st)
        print st "\t" name > res
        if (st == "FAILED" || st == "PASSED UNEXPECTEDLY") cur = name
        next
    }
    /^Summary:/ { flush(); next }
    cur != "" { line = $0; sub(/^[ \t]+/, "", line); if (line != "") buf = buf (buf == "" ? "" : " | ") line }
    END { flush() }'

summary="$(sed 's/\x1b\[[0-9;]*m//g' "$LOG" | grep '^Summary:' || true)"
# shellcheck disable=SC2016  # literal backticks
mapfile -t excluded < <(sed -n 's/^- `\([^`]*\)`.*/\1/p' "$EXCLUDED")
count() { awk -F'\t' -v s="$1" '$1 == s' "$RES" | wc -l; }
n_ok=$(count ok); n_fail=$(count FAILED); n_skip=$(count skipped)

is_excluded() { local t; for t in "${excluded[@]}"; do [[ $t == "$1" ]] && return 0; done; return 1; }
unexpected=(); excl_failed=0; excl_passed=()
while IFS=$'\t' read -r st name; do
    case "$st" in
        FAILED) if is_excluded "$name"; then excl_failed=$((excl_failed + 1)); else unexpected+=("$name"); fi ;;
        "PASSED UNEXPECTEDLY") unexpected+=("$name") ;;
        ok) if is_excluded "$name"; then excl_passed+=("$name"); fi ;;
    esac
done <"$RES"

echo "=== pjdfstest on $MODE: ${elapsed}s, pjdfstest rc=$prc"
echo "=== ${summary:-NO SUMMARY LINE (pjdfstest crashed, hung or was killed)}"
echo "=== parsed: $n_ok ok, $n_fail failed ($excl_failed excluded, ${#unexpected[@]} unexpected), $n_skip skipped"
if [[ $n_skip -gt 0 ]]; then
    echo "--- skip reasons:"
    sed 's/\x1b\[[0-9;]*m//g' "$LOG" | awk '/ skipped$/ { getline r; sub(/^[ \t]+/, "", r); print r }' \
        | sort | uniq -c | sed 's/^/    /'
fi
if [[ ${#excl_passed[@]} -gt 0 ]]; then
    if [[ -n $PLAIN_DIR ]]; then
        echo "--- ${#excl_passed[@]} sub-tests listed in EXCLUDED.md passed (expected on a plain directory)"
    else
        echo "--- listed in EXCLUDED.md but passed on ckptfs (${#excl_passed[@]}; consider pruning the list):"
        printf '    %s\n' "${excl_passed[@]}" | sort
    fi
fi
not_run=()
for t in "${excluded[@]}"; do
    awk -F'\t' -v t="$t" '$2 == t { f = 1 } END { exit !f }' "$RES" || not_run+=("$t")
done
if [[ ${#not_run[@]} -gt 0 && ${#TEST_GROUPS[@]} -eq 10 ]]; then
    echo "--- WARNING: ${#not_run[@]} names in EXCLUDED.md did not run (typo, or renamed in this pjdfstest version):"
    printf '    %s\n' "${not_run[@]}"
fi
if [[ ${#unexpected[@]} -gt 0 ]]; then
    echo "--- UNEXPECTED FAILURES (${#unexpected[@]}):"
    printf '%s\n' "${unexpected[@]}" | sort | while read -r t; do
        m="$(awk -F'\t' -v t="$t" '$1 == t { print $2; exit }' "$MSG")"
        echo "  $t"
        echo "      ${m:-(no message)}" | cut -c1-400
    done
fi
rm -f "$RES" "$MSG"

status=0
if [[ -z $summary ]]; then
    echo "pjdfstest: FAIL (no summary; see $LOG; last lines:)"; tail -n 20 "$LOG" | sed 's/^/    /'
    status=1
elif [[ ${#unexpected[@]} -gt 0 ]]; then
    status=1
fi
if [[ -z $PLAIN_DIR ]] && ! ckptfs_umount; then
    echo "pjdfstest: FAIL (ckptfs umount failed)"; status=1
fi
if [[ $status -eq 0 ]]; then
    echo "pjdfstest: PASS ($n_ok passed, $excl_failed excluded failures, $n_skip skipped; full log $LOG)"
else
    echo "pjdfstest: FAIL (${#unexpected[@]} unexpected failures; full log $LOG)"
fi
exit "$status"
