#!/usr/bin/env bash
# SLURM epilog for ckptfs: reports what the job's checkpoints cost, applies the retention
# policy, and unmounts (waiting until everything closed is committed). The counterpart of
# prolog.sh, with the same environment.
set -uo pipefail

: "${SLURM_JOB_ID:?epilog: SLURM_JOB_ID is not set}"
ckptfs="${CKPTFS:-ckptfs}"
mnt="${CKPTFS_MOUNT:-/ckpt/$SLURM_JOB_ID}"

if [[ "${SLURM_NODEID:-0}" != 0 ]]; then
    exit 0
fi
if ! mountpoint -q "$mnt"; then
    echo "ckptfs epilog: nothing mounted at $mnt"
    exit 0
fi
status=0
echo "ckptfs epilog: job $SLURM_JOB_ID checkpoint space at $mnt:"
"$ckptfs" stats "$mnt" || status=1
"$ckptfs" gc "$mnt" || status=1
"$ckptfs" umount "$mnt" || status=1
rmdir "$mnt" 2>/dev/null || true
exit $status
