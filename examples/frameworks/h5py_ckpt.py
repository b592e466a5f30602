"""h5py (HDF5): one .h5 file per step, one dataset per tensor.

    python3 h5py_ckpt.py CKPT_DIR STEPS
"""

import os
import sys

import h5py

import common


def save(root, step, state):
    tmp = f"step-{step}.h5.tmp"
    with h5py.File(os.path.join(root, tmp), "w") as f:
        f.attrs["step"] = step
        for name, t in state.items():
            f.create_dataset(name, data=t)
    common.publish(root, step, tmp, f"step-{step}.h5")


def load(path):
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f}


if __name__ == "__main__":
    common.run(sys.argv[1], int(sys.argv[2]), save, load)
