#!/usr/bin/env bash
# Measures the write and read paths on a many-core node that has no Rust toolchain (the
# GPU nodes the device tool lends: 16 cores, root, no fuse3), within one short device call.
#
#   scripts/node-bench.sh pack   (here: builds ckptfs, ckptfs-bench and the engine's and the
#                                 GPU kernels' test binaries in release mode, stripped, into
#                                 target/node-pack/)
#   scripts/node-bench.sh run    (on the node, from the repository root: the engine's tests,
#                                 which run the AVX-512 cutter where the CPU has it; the cutter
#                                 and codecs per core; checkpoint steps at 1/4/8/16 writers in
#                                 the three layouts on the CPU path; the limits; cold restart,
#                                 through the page cache and with CKPTFS_DIRECT_READS=1; the
#                                 GPU kernel tests if there is a GPU)
#
# With this project's device tool: `scripts/node-bench.sh pack` here, then
#   run(command="bash scripts/node-bench.sh run", carry=["target/node-pack"], timeout_s=420)
# Results land in $OUT (at most 8 files: the tool's limit), or target/node-pack/out.
# Each step has a time limit, and a step that would end past NODE_DEADLINE seconds (default
# 380) is skipped and said so. Env: NODE_SIZE, bytes per step (default 2G); NODE_WRITERS
# (default 1,4,8,16); NODE_SKIP, steps to leave out (any of tests,codec,steps,limits,restart,gpu);
# NODE_BASE, a second pack (say of the commit before a change, `NODE_PACK=DIR ... pack` made
# it) whose codec (into codec.txt, after this pack's) and steps (steps-base.txt) run in the
# same call, as the same-machine baseline: the eighth file back (NODE_BOTH_ORDERS=1: then
# the baseline's steps again and this pack's, each file one run in each position; the JSON
# is the first run's). NODE_ALT_ENV, assignments
# (say CKPTFS_CUT_HERE=0): this pack's steps once more with them in the daemon's environment
# (steps-alt.txt), to measure one switch on the same machine (leave out codec to stay within
# eight files). NODE_ALT_ARGS, extra `ckptfs-bench steps` arguments for that run, with or
# without NODE_ALT_ENV (say --mount-arg=--cuts=content: changed bytes cut by content, not at
# the previous revision's boundaries). NODE_ALT_FUSE_PAGES, a value of the kernel's
# fs.fuse.max_pages_limit (say 1024, the 4 MiB requests the daemon asks for) set for that
# run only and set back after it, alone or with the two above: at the default 256 pages a
# 1 MiB write from a buffer that is not page-aligned reaches the daemon as two requests.
# Every bench file's header says the value its run had (`fuse requests`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PACK=${NODE_PACK:-target/node-pack}

case "${1:-}" in
pack)
    rm -rf "$PACK"
    mkdir -p "$PACK"
    cargo build --release --locked -p ckptfs -p ckptfs-bench
    cp target/release/ckptfs target/release/ckptfs-bench "$PACK/"
    # The engine's unit tests (the cutter's among them) and the GPU kernels' tests.
    for target in "-p ckptfs-engine --lib:engine-tests" "-p ckptfs-kernels --test gpu:kernels-gpu"; do
        # shellcheck disable=SC2086  # the selection is several words on purpose
        cargo test --release --locked ${target%%:*} --no-run --message-format=json |
            python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        shutil.copy(m["executable"], sys.argv[1])
' "$PACK/${target##*:}"
    done
    strip "$PACK"/*
    ls -la "$PACK"
    ;;
run)
    out="${OUT:-$PACK/out}"
    mkdir -p "$out"
    deadline=${NODE_DEADLINE:-380}
    size=${NODE_SIZE:-2G}
    dir=/var/tmp/ckptfs-node-bench
    b="$PACK/ckptfs-bench"
    {
        echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
        grep -o -m1 -w 'avx512f' /proc/cpuinfo || echo "no avx512f"
        # Hyperthreads share a core's units: CPU time per GiB grows when siblings are busy.
        lscpu 2>/dev/null | grep -E '^(Thread|Core|Socket|NUMA node\(s\)|L3)' || true
        df -h /var/tmp | tail -1
    } > "$out/env.txt" 2>&1
    rc=0
    took=-1 # seconds the last step took; -1: it was skipped
    step() { # output-file time-limit command...
        local name=$1 limit=$2
        shift 2
        took=-1
        if [[ ,${NODE_SKIP:-}, == *,${name%-base},* ]]; then  # steps-base: with steps
            return
        fi
        if ((SECONDS + limit > deadline)); then
            echo "SKIPPED at ${SECONDS}s (would pass ${deadline}s): $*" | tee -a "$out/env.txt"
            return
        fi
        echo "== ${SECONDS}s: $*" | tee -a "$out/env.txt"
        local r=0 t0=$SECONDS
        timeout -k 5 "$limit" "$@" >> "$out/$name.txt" 2>&1 || r=$?
        took=$((SECONDS - t0))
        echo "== ${SECONDS}s: exit $r" | tee -a "$out/env.txt"
        ((r == 0)) || rc=1
    }
    common=(--dir "$dir" --ckptfs "$PACK/ckptfs" --reps 1 --size "$size")
    # Where the CPU lists AVX-512F, its cutter tests must run, not skip.
    require=
    grep -q -w avx512f /proc/cpuinfo && require=avx512
    step tests 90 env CKPTFS_REQUIRE="$require" "$PACK/engine-tests" --test-threads "$(nproc)"
    # The cutter's search as measured at start (the header says which won, and by what), then
    # each candidate forced.
    step codec 40 "$b" codec --size 128M
    step codec 40 env CKPTFS_GEAR=scalar "$b" codec --size 128M
    [[ -n $require ]] && step codec 40 env CKPTFS_GEAR=avx512 "$b" codec --size 128M
    writers=${NODE_WRITERS:-1,4,8,16}
    step steps 200 "$b" steps "${common[@]}" --data field --writers "$writers" \
        --mount-arg=--gpu=off --json "$out/steps.json"
    steps_took=$took
    base=${NODE_BASE:-}
    # The baseline only beside this pack's figures (not where its steps were skipped).
    if [[ -n $base && -x $base/ckptfs ]] && ((steps_took >= 0)); then
        step codec 40 "$base/ckptfs-bench" codec --size 128M
        # Limited by what this pack's steps took (and a margin), not their own 200 s: a
        # fixed limit skipped the baseline where it would have fitted.
        base_steps=("$base/ckptfs-bench" steps --dir "$dir" --ckptfs "$base/ckptfs" \
            --reps 1 --size "$size" --data field --writers "$writers" --mount-arg=--gpu=off)
        step steps-base $((steps_took * 3 / 2 + 20)) "${base_steps[@]}"
        # Position in a call matters (a build run second measured 0.1-0.15 CPU-s/GiB more on
        # full steps): NODE_BOTH_ORDERS=1 runs the baseline again and then this pack, so each
        # file holds one run in each position (appended: first the earlier run).
        if [[ ${NODE_BOTH_ORDERS:-} == 1 ]] && ((took >= 0)); then
            step steps-base $((steps_took * 3 / 2 + 20)) "${base_steps[@]}"
            if ((took >= 0)); then
                step steps $((steps_took * 3 / 2 + 20)) "$b" steps "${common[@]}" \
                    --data field --writers "$writers" --mount-arg=--gpu=off
            fi
        fi
    fi
    if [[ -n ${NODE_ALT_ENV:-}${NODE_ALT_ARGS:-}${NODE_ALT_FUSE_PAGES:-} ]] && ((steps_took >= 0)); then
        pages_file=/proc/sys/fs/fuse/max_pages_limit
        pages_before=
        if [[ -n ${NODE_ALT_FUSE_PAGES:-} ]]; then
            if pages_before=$(cat "$pages_file" 2>/dev/null) &&
                echo "$NODE_ALT_FUSE_PAGES" >"$pages_file"; then
                echo "steps-alt: fs.fuse.max_pages_limit $pages_before -> $NODE_ALT_FUSE_PAGES" |
                    tee -a "$out/env.txt"
            else
                echo "steps-alt: cannot set fs.fuse.max_pages_limit (kernel without it, or not root); the run has the default" |
                    tee -a "$out/env.txt" >&2
                pages_before=
            fi
        fi
        # shellcheck disable=SC2086  # several assignments and arguments on purpose
        step steps-alt $((steps_took * 3 / 2 + 20)) env ${NODE_ALT_ENV:-} "$b" steps \
            "${common[@]}" --data field --writers "$writers" --mount-arg=--gpu=off \
            ${NODE_ALT_ARGS:-}
        if [[ -n $pages_before ]]; then
            echo "$pages_before" >"$pages_file"
        fi
    fi
    step limits 40 "$b" limits "${common[@]}"
    step restart 90 "$b" restart "${common[@]}"
    # The same cold reads with the data file read past the page cache (engine/src/device.rs
    # `direct_reads`): which way the restart goes on a many-core node decides the default.
    step restart 90 env CKPTFS_DIRECT_READS=1 "$b" restart "${common[@]}"
    if command -v nvidia-smi >/dev/null && [[ ,${NODE_SKIP:-}, != *,gpu,* ]]; then
        step tests 60 env CKPTFS_REQUIRE=gpu "$PACK/kernels-gpu" --test-threads 1
    fi
    exit $rc
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
