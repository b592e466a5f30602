#!/usr/bin/env bash
# The README's main job: install what a fresh machine lacks, build ckptfs, and mount a
# working ckptfs at MOUNTPOINT (default /ckpt) on the default backing space, which is
# formatted on first use (see README: "Default backing space").
#
# Usage: scripts/mount.sh [MOUNTPOINT]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MNT="${1:-/ckpt}"
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

if ! command -v fusermount3 >/dev/null; then
    echo "==> installing fuse3"
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fuse3 >/dev/null
fi
echo "==> building ckptfs (release)"
cargo build --release --locked -p ckptfs
BIN="$PWD/target/release/ckptfs"
mkdir -p "$MNT"
"$BIN" mount "$MNT"
echo "==> ckptfs is mounted at $MNT; try: df -h $MNT; $BIN stats $MNT; $BIN umount $MNT"
