"""safetensors: weights and optimizer state (Adam's two moments) as two .safetensors files
per step, each written to a temporary name and renamed.

    python3 safetensors_ckpt.py CKPT_DIR STEPS      (pip install safetensors)
"""

import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

import common


def moments(state):
    # Optimizer state that follows the weights: first and second moment per tensor.
    return {
        **{f"{n}.exp_avg": np.float32(0.1) * t for n, t in state.items()},
        **{f"{n}.exp_avg_sq": np.float32(0.01) * t * t for n, t in state.items()},
    }


def save(root, step, state):
    tmp = f"step-{step}.tmp"
    os.makedirs(os.path.join(root, tmp))
    for what, tensors in (("model", state), ("optimizer", moments(state))):
        part = os.path.join(root, tmp, f"{what}.safetensors")
        save_file(tensors, part + ".partial", metadata={"step": str(step)})
        os.rename(part + ".partial", part)
    common.publish(root, step, tmp, f"step-{step}")


def load(path):
    state = load_file(os.path.join(path, "model.safetensors"))
    opt = load_file(os.path.join(path, "optimizer.safetensors"))
    common.check_equal(opt, moments(state), f"optimizer state in {path}")
    return state


if __name__ == "__main__":
    common.run(sys.argv[1], int(sys.argv[2]), save, load)
