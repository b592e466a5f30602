#!/usr/bin/env bash
# Installs ckptfs for the whole machine: the binary where mount(8)'s helpers look for it (so
# `mount -t fuse.ckptfs BACKING MNT -o ...` and fstab lines of type fuse.ckptfs work; mount(8)
# runs its helpers with a standard PATH, which has /usr/local/bin but not ~/.cargo/bin), the
# man pages and bash, zsh and fish completions, all generated from the binary's own CLI.
#
#   scripts/install.sh [PREFIX]      PREFIX defaults to /usr/local
#
# DESTDIR=DIR stages the files under DIR (for packaging); CKPTFS_BIN=FILE installs that binary
# instead of building target/release/ckptfs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

prefix="${1:-${PREFIX:-/usr/local}}"
root="${DESTDIR:-}$prefix"
bin="${CKPTFS_BIN:-}"
if [[ -z "$bin" ]]; then
    cargo build --release --locked -p ckptfs
    bin=target/release/ckptfs
fi

install -D -m 0755 "$bin" "$root/bin/ckptfs"
"$bin" generate man "$root/share/man/man1"
install -d "$root/share/bash-completion/completions" "$root/share/zsh/site-functions" \
    "$root/share/fish/vendor_completions.d"
"$bin" generate completions bash >"$root/share/bash-completion/completions/ckptfs"
"$bin" generate completions zsh >"$root/share/zsh/site-functions/_ckptfs"
"$bin" generate completions fish >"$root/share/fish/vendor_completions.d/ckptfs.fish"
echo "installed ckptfs into $root (binary, man pages, completions)"
if [[ -z "${DESTDIR:-}" ]] && ! command -v fusermount3 >/dev/null; then
    echo "note: fuse3 is not installed (apt-get install fuse3); mounts need fusermount3 and mount.fuse3"
fi
