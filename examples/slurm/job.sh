#!/usr/bin/env bash
#SBATCH --job-name=ckpt-demo
#SBATCH --requeue
# A batch job that checkpoints into ckptfs and, when started again after a failure (a
# requeue, a resubmission), resumes from the newest complete checkpoint.
#
# Each step writes its checkpoint into step-N.tmp/ (here: RANKS files of CKPT_MIB MiB
# standing in for model and optimizer state, and a manifest of their sha256), closes it (a
# close in ckptfs returns once the data is durable), renames it to step-N and then points
# `latest` at it with an atomic rename, and fsyncs the directory. A step-N.tmp/ left by a
# crash is never read: only what `latest` names counts. On start the job verifies `latest`
# against its manifest before resuming from it.
#
# Environment: CKPTFS_MOUNT (default /ckpt/$SLURM_JOB_ID, as prolog.sh mounts it), STEPS
# (default 10), RANKS (default 4), CKPT_MIB (default 8), STEP_SECS (default 1: the
# "training" between checkpoints).
set -euo pipefail

ckpt="${CKPTFS_MOUNT:-/ckpt/${SLURM_JOB_ID:?job: SLURM_JOB_ID is not set}}"
steps="${STEPS:-10}" ranks="${RANKS:-4}" mib="${CKPT_MIB:-8}"

start=0
if [[ -L "$ckpt/latest" ]]; then
    dir="$ckpt/$(readlink "$ckpt/latest")"
    (cd "$dir" && sha256sum --quiet -c manifest) || {
        echo "job: $dir does not match its manifest; refusing to resume from it" >&2
        exit 1
    }
    start=$(<"$dir/step")
    echo "job: resuming from step $start ($dir verified)"
else
    echo "job: no checkpoint yet; starting from step 0"
fi

for ((step = start + 1; step <= steps; step++)); do
    sleep "${STEP_SECS:-1}"
    tmp="$ckpt/step-$step.tmp"
    rm -rf "$tmp"
    mkdir "$tmp"
    for ((r = 0; r < ranks; r++)); do
        # Most of a model changes little from step to step: the first half of each rank's
        # state stays the same (ckptfs stores it once), the rest is new.
        {
            head -c $((mib / 2 * 1048576)) < <(yes "rank $r state that did not change")
            head -c $(((mib - mib / 2) * 1048576)) /dev/urandom
        } >"$tmp/rank-$r.bin"
    done
    echo "$step" >"$tmp/step"
    (cd "$tmp" && sha256sum rank-*.bin step >manifest)
    mv "$tmp" "$ckpt/step-$step"
    ln -sfn "step-$step" "$ckpt/latest.tmp"
    mv -T "$ckpt/latest.tmp" "$ckpt/latest"
    # The renames become durable with the next close or directory fsync (README, "Durability
    # contract"): fsync the directory before calling the step done.
    sync "$ckpt"
    echo "job: checkpoint $step written"
done
echo "job: done at step $steps"
