"""numpy: one .npy per tensor with np.save; resume reads them as numpy.memmap (np.load with
mmap_mode), so only the pages touched come through the mount.

    python3 numpy_ckpt.py CKPT_DIR STEPS
"""

import os
import sys

import numpy as np

import common


def save(root, step, state):
    tmp = f"step-{step}.tmp"
    os.makedirs(os.path.join(root, tmp))
    for name, t in state.items():
        np.save(os.path.join(root, tmp, name + ".npy"), t)
    common.publish(root, step, tmp, f"step-{step}")


def load(path):
    return {
        f[: -len(".npy")]: np.load(os.path.join(path, f), mmap_mode="r")
        for f in os.listdir(path)
        if f.endswith(".npy")
    }


if __name__ == "__main__":
    common.run(sys.argv[1], int(sys.argv[2]), save, load)
