#!/usr/bin/env bash
# Checks and measures the GPU kernels on a GPU machine that has no Rust toolchain.
#
#   scripts/gpu-check.sh pack   (here: builds the kernel tests and the benchmark in release
#                                mode and copies them, stripped, to target/gpu-pack/)
#   scripts/gpu-check.sh run    (on the GPU machine, from the repository root: runs the GPU
#                                tests with CKPTFS_REQUIRE=gpu, so a missing GPU fails
#                                instead of skipping, then `ckptfs-bench gpu`)
#
# With this project's device tool: `scripts/gpu-check.sh pack` here, then
#   run(command="bash scripts/gpu-check.sh run", carry=["target/gpu-pack"])
# Results land in $OUT (or target/gpu-pack/out when OUT is unset).
# Env: CKPTFS_CUDA_LIB_DIR names the directory of libcuda.so.1 / libnvrtc.so.13 if the
# loader cannot find them; GPU_BENCH_ARGS adds benchmark options (default: --bytes 1G);
# GPU_SUB_BATCHES lists the sub-batch sizes to measure (default: 32M 8M 128M).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PACK=target/gpu-pack

case "${1:-}" in
pack)
    rm -rf "$PACK"
    mkdir -p "$PACK"
    cargo build --release --locked -p ckptfs-bench
    cp target/release/ckptfs-bench "$PACK/"
    # The kernel crate's test binaries (gpu: the real GPU; emu: the CPU emulation).
    cargo test --release --locked -p ckptfs-kernels --no-run --message-format=json |
        python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/kernels-" + m["target"]["name"])
' "$PACK"
    strip "$PACK"/*
    ls -la "$PACK"
    ;;
run)
    out="${OUT:-$PACK/out}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/nvidia-smi.txt" || true
    rc=0
    CKPTFS_REQUIRE=gpu "$PACK/kernels-gpu" --test-threads 1 2>&1 | tee "$out/tests-gpu.txt" || rc=1
    "$PACK/kernels-emu" 2>&1 | tail -3 | tee "$out/tests-emu.txt" || rc=1
    # The default sub-batch size, then a sweep around it (the default is not yet measured).
    for sub in ${GPU_SUB_BATCHES:-32M 8M 128M}; do
        # shellcheck disable=SC2086
        "$PACK/ckptfs-bench" gpu --require-gpu --sub-batch "$sub" ${GPU_BENCH_ARGS:---bytes 1G} \
            --json "$out/gpu-bench-$sub.json" 2>&1 | tee "$out/gpu-bench-$sub.txt" || rc=1
    done
    exit $rc
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
