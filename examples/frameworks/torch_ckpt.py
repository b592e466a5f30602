"""PyTorch: torch.save of the model and optimizer state each step (temporary name, then
rename), resumed with torch.load(mmap=True); and torch.distributed.checkpoint (DCP) with
several ranks on the gloo backend, each rank writing its own shard files into a step
directory.

    python3 torch_ckpt.py CKPT_DIR STEPS                 torch.save / torch.load(mmap=True)
    python3 torch_ckpt.py --dcp RANKS CKPT_DIR STEPS     torch.distributed.checkpoint

Needs PyTorch >= 2.1 (pip install torch; see README "Using ckptfs in a job").
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import common


def tensors(state, prefix=""):
    return {prefix + n: torch.from_numpy(t.copy()) for n, t in state.items()}


def with_optimizer(state):
    # Optimizer state that follows the weights, as Adam's moments do.
    return {
        "model": tensors(state),
        "optimizer": {
            "exp_avg": {n: 0.1 * t for n, t in tensors(state).items()},
            "exp_avg_sq": {n: 0.01 * t * t for n, t in tensors(state).items()},
        },
    }


def save(root, step, state):
    tmp = f"step-{step}.pt.tmp"
    torch.save(with_optimizer(state), os.path.join(root, tmp))
    common.publish(root, step, tmp, f"step-{step}.pt")


def load(path):
    ck = torch.load(path, mmap=True, weights_only=True)
    want = with_optimizer({n: t.numpy() for n, t in ck["model"].items()})
    for part in ("exp_avg", "exp_avg_sq"):
        for n, t in want["optimizer"][part].items():
            if not torch.equal(ck["optimizer"][part][n], t):
                sys.exit(f"{path}: optimizer {part} of {n} differs")
    return {n: t.numpy() for n, t in ck["model"].items()}


def rank_state(state, rank, ranks):
    """This rank's shard: every ranks-th tensor, under names that say whose it is."""
    names = sorted(state)[rank::ranks]
    return {f"rank{rank}.{n}": state[n] for n in names}


def dcp_rank(rank, ranks, root, steps, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    start, path = common.latest(root)
    if path is not None:
        want = tensors(rank_state(common.state_at(start), rank, ranks))
        got = {n: torch.empty_like(t) for n, t in want.items()}
        dcp.load(got, checkpoint_id=path)
        for n, t in want.items():
            if not torch.equal(got[n], t):
                sys.exit(f"rank {rank}: {n} in {path} differs")
        if rank == 0:
            print(f"resumed from step {start} ({path} verified by {ranks} ranks)", flush=True)
    state = common.state_at(start)
    for step in range(start + 1, steps + 1):
        state = common.update(state, step)
        tmp = f"step-{step}.dcp.tmp"
        dcp.save(tensors(rank_state(state, rank, ranks)), checkpoint_id=os.path.join(root, tmp))
        dist.barrier()
        if rank == 0:
            common.publish(root, step, tmp, f"step-{step}.dcp")
        dist.barrier()
    if rank == 0:
        print(f"done at step {steps}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "--dcp":
        ranks, root, steps = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
        port = 29500 + os.getpid() % 1000
        mp.spawn(dcp_rank, args=(ranks, root, steps, port), nprocs=ranks, join=True)
    else:
        common.run(sys.argv[1], int(sys.argv[2]), save, load)
