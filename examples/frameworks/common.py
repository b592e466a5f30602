"""Shared by the framework examples: a deterministic "training" state and the checkpoint
directory protocol every example follows.

The state is a set of float32 tensors (weights and, for the optimizer examples, moments).
Each step updates a quarter of the tensors (the others are frozen, as in fine-tuning), so a
checkpoint repeats most of the previous one: what ckptfs stores once.

Protocol: step N is written under a temporary name and renamed into place, then `latest`
is switched to it with an atomic rename and the directory is fsynced (in ckptfs renames
become durable at the next close or directory fsync). A resumed run reads `latest` only.
"""

import os
import sys

import numpy as np

TENSORS = 16
ELEMS = 256 * 1024  # 1 MiB of float32 per tensor


def initial_state():
    rng = np.random.default_rng(1234)
    return {
        f"layer{i:02d}.weight": rng.standard_normal(ELEMS, dtype=np.float32)
        for i in range(TENSORS)
    }


def update(state, step):
    """The state after `step`: a quarter of the tensors move a little."""
    rng = np.random.default_rng(step)
    for i, name in enumerate(sorted(state)):
        if (i + step) % 4 == 0:
            state[name] = state[name] + np.float32(1e-3) * rng.standard_normal(
                ELEMS, dtype=np.float32
            )
    return state


def state_at(step):
    s = initial_state()
    for k in range(1, step + 1):
        s = update(s, k)
    return s


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(root, step, tmp_name, final_name):
    """Renames the step's checkpoint into place and points `latest` at it, durably."""
    os.rename(os.path.join(root, tmp_name), os.path.join(root, final_name))
    link = os.path.join(root, "latest.tmp")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(final_name, link)
    os.rename(link, os.path.join(root, "latest"))
    fsync_dir(root)
    print(f"checkpoint {step} written", flush=True)


def latest(root):
    """(step, path) of what `latest` names, or (0, None)."""
    link = os.path.join(root, "latest")
    if not os.path.islink(link):
        return 0, None
    target = os.readlink(link)
    return int(target.split("-")[1].split(".")[0]), os.path.join(root, target)


def check_equal(got, want, what):
    if sorted(got) != sorted(want):
        sys.exit(f"{what}: tensors {sorted(got)} != {sorted(want)}")
    for name in want:
        if not np.array_equal(np.asarray(got[name]), want[name]):
            sys.exit(f"{what}: tensor {name} differs")


def run(root, steps, save, load):
    """Resumes from `latest` (verifying it), then writes steps up to `steps`."""
    start, path = latest(root)
    if path is not None:
        check_equal(load(path), state_at(start), f"resume from {path}")
        print(f"resumed from step {start} ({path} verified)", flush=True)
    state = state_at(start)
    for step in range(start + 1, steps + 1):
        state = update(state, step)
        save(root, step, state)
    print(f"done at step {steps}", flush=True)
