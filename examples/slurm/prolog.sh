#!/usr/bin/env bash
# SLURM prolog for ckptfs: mounts the job's checkpoint space on this node before the job's
# tasks start (run as root by slurmd: `Prolog=/etc/slurm/prolog.d/ckptfs.sh`, or by hand).
#
# The space is named after the job name, so a requeued or resubmitted job finds its earlier
# checkpoints: ${CKPTFS_SPACE_ROOT}/${SLURM_JOB_NAME}, formatted on first use with
# ${CKPTFS_SPACE_SIZE}. It is mounted at ${CKPTFS_MOUNT} (default /ckpt/${SLURM_JOB_ID}),
# owned by the job's user, who alone may use it (allow_other, with the mount root 0700).
#
# Until ckptfs shares one space between nodes (slots), one node mounts a space at a time:
# run this on the job's first node (SLURM_NODEID 0); other nodes skip.
#
# Environment: SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_JOB_UID, SLURM_JOB_GID (set by slurmd),
# CKPTFS_SPACE_ROOT (required: a directory on the shared filesystem), CKPTFS_SPACE_SIZE
# (default 64G), CKPTFS_MOUNT, CKPTFS (the binary, default: ckptfs on PATH).
set -euo pipefail

: "${SLURM_JOB_ID:?prolog: SLURM_JOB_ID is not set}"
: "${SLURM_JOB_NAME:?prolog: SLURM_JOB_NAME is not set}"
: "${CKPTFS_SPACE_ROOT:?prolog: set CKPTFS_SPACE_ROOT to a directory on the shared filesystem}"
ckptfs="${CKPTFS:-ckptfs}"
space="$CKPTFS_SPACE_ROOT/$SLURM_JOB_NAME"
mnt="${CKPTFS_MOUNT:-/ckpt/$SLURM_JOB_ID}"

if [[ "${SLURM_NODEID:-0}" != 0 ]]; then
    echo "ckptfs prolog: node $SLURM_NODEID: the space is mounted on node 0 only"
    exit 0
fi

# A mount left by a job whose daemon died answers ENOTCONN (stat fails, mkdir -p too):
# detach it first.
if mountpoint -q "$mnt" 2>/dev/null || { [[ -e "$mnt" || -L "$mnt" ]] && ! stat "$mnt" >/dev/null 2>&1; } \
    || grep -q " $mnt " /proc/self/mountinfo; then
    echo "ckptfs prolog: detaching the mount left at $mnt"
    fusermount3 -uz "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
fi
mkdir -p "$mnt"
if [[ ! -e "$space/superblock" ]]; then
    mkdir -p "$CKPTFS_SPACE_ROOT"
    "$ckptfs" format "$space" --size "${CKPTFS_SPACE_SIZE:-64G}"
fi
"$ckptfs" mount "$space" "$mnt" -o allow_other
if [[ -n "${SLURM_JOB_UID:-}" ]]; then
    chown "$SLURM_JOB_UID:${SLURM_JOB_GID:-$SLURM_JOB_UID}" "$mnt"
fi
chmod 0700 "$mnt"
echo "ckptfs prolog: $space mounted at $mnt"
