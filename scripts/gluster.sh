#!/usr/bin/env bash
# A GlusterFS volume on this machine, mounted twice: two clients with their own caches, as
# two nodes of a cluster see one shared filesystem. The multi-node tests put a space on it
# and mount each node through its own client (tests/tests/gluster.rs).
#
# Usage: scripts/gluster.sh start [DIR]   starts glusterd, makes and starts the volume
#                                         (default options), mounts it at DIR/c0 and DIR/c1,
#                                         and prints CKPTFS_GLUSTER_CLIENTS=DIR/c0:DIR/c1
#        scripts/gluster.sh stop [DIR]    unmounts both clients and stops the volume
# DIR defaults to /var/tmp/ckptfs-gluster. Needs root and Debian's glusterfs-server and
# glusterfs-client. Idempotent: a volume already there is reused. Exits non-zero, saying
# why, when the volume cannot be had (the tests then skip, naming the reason).
set -euo pipefail

cmd=${1:-start}
dir=${2:-/var/tmp/ckptfs-gluster}
vol=ckptfs-test
host=$(hostname)

die() { echo "gluster.sh: $*" >&2; exit 1; }

case "$cmd" in
start)
    command -v glusterd >/dev/null || die "glusterd is not installed (apt-get install glusterfs-server)"
    command -v gluster >/dev/null || die "the gluster CLI is not installed"
    [[ $(id -u) -eq 0 ]] || die "needs root"
    # A client left mounted after its glusterd went away answers nothing ("Transport endpoint
    # is not connected"): detach it, so it is mounted afresh below.
    for c in c0 c1; do
        if findmnt -n "$dir/$c" >/dev/null 2>&1 && ! stat -t "$dir/$c" >/dev/null 2>&1; then
            umount -l "$dir/$c" 2>/dev/null || true
        fi
    done
    mkdir -p "$dir/brick" "$dir/c0" "$dir/c1"
    if ! gluster --mode=script volume list >/dev/null 2>&1; then
        glusterd || die "glusterd did not start"
        for _ in $(seq 1 100); do
            gluster --mode=script volume list >/dev/null 2>&1 && break
            sleep 0.1
        done
        gluster --mode=script volume list >/dev/null 2>&1 || die "glusterd does not answer"
    fi
    if ! gluster --mode=script volume info "$vol" >/dev/null 2>&1; then
        gluster --mode=script volume create "$vol" "$host:$dir/brick" force >/dev/null \
            || die "cannot create volume $vol on $host:$dir/brick"
    fi
    if ! gluster --mode=script volume info "$vol" | grep -q '^Status: Started'; then
        gluster --mode=script volume start "$vol" >/dev/null || die "cannot start volume $vol"
    elif ! gluster --mode=script volume status "$vol" 2>/dev/null | grep -q '^Brick.* Y '; then
        # Started, but its brick process is gone (glusterd restarted): start it again.
        gluster --mode=script volume start "$vol" force >/dev/null \
            || die "cannot restart the brick of volume $vol"
    fi
    for c in c0 c1; do
        if ! findmnt -n "$dir/$c" >/dev/null 2>&1; then
            mount -t glusterfs "$host:/$vol" "$dir/$c" || die "cannot mount $host:/$vol at $dir/$c"
        fi
    done
    echo "CKPTFS_GLUSTER_CLIENTS=$dir/c0:$dir/c1"
    ;;
stop)
    for c in c0 c1; do
        findmnt -n "$dir/$c" >/dev/null 2>&1 && umount "$dir/$c"
    done
    gluster --mode=script volume stop "$vol" >/dev/null 2>&1 || true
    ;;
*)
    die "usage: scripts/gluster.sh start|stop [DIR]"
    ;;
esac
