"""A GPT-2-shaped checkpoint with AdamW state, as training writes it: the model's float32
weights (GPT-2's initialisation: N(0, 0.02), residual projections scaled by
1/sqrt(2 * layers), LayerNorm weights 1, biases 0) after a few AdamW steps on random
gradients, and the optimizer's two moments, saved as safetensors (or with torch.save when
`--torch` is given and PyTorch is there).

    python3 gpt2_adamw.py OUT_DIR [--layers N] [--vocab V] [--steps S] [--torch]

GPT-2 small is 12 layers and a 50257-token vocabulary (124M parameters, 1.5 GB with its
optimizer state); the defaults keep its layer shapes with fewer layers and tokens so that a
test writes about 130 MB. Used by tests/tests/frameworks.rs to measure the float codec.
"""

import argparse
import math
import os

import numpy as np

N_EMBD = 768
N_POS = 1024


def shapes(layers, vocab):
    s = {"wte.weight": (vocab, N_EMBD), "wpe.weight": (N_POS, N_EMBD)}
    for i in range(layers):
        p = f"h.{i}."
        s.update(
            {
                p + "ln_1.weight": (N_EMBD,),
                p + "ln_1.bias": (N_EMBD,),
                p + "attn.c_attn.weight": (N_EMBD, 3 * N_EMBD),
                p + "attn.c_attn.bias": (3 * N_EMBD,),
                p + "attn.c_proj.weight": (N_EMBD, N_EMBD),
                p + "attn.c_proj.bias": (N_EMBD,),
                p + "ln_2.weight": (N_EMBD,),
                p + "ln_2.bias": (N_EMBD,),
                p + "mlp.c_fc.weight": (N_EMBD, 4 * N_EMBD),
                p + "mlp.c_fc.bias": (4 * N_EMBD,),
                p + "mlp.c_proj.weight": (4 * N_EMBD, N_EMBD),
                p + "mlp.c_proj.bias": (N_EMBD,),
            }
        )
    s.update({"ln_f.weight": (N_EMBD,), "ln_f.bias": (N_EMBD,)})
    return s


def init(rng, layers, vocab):
    params = {}
    for name, shape in shapes(layers, vocab).items():
        if name.endswith(".bias"):
            params[name] = np.zeros(shape, np.float32)
        elif ".ln_" in name or name.startswith("ln_"):
            params[name] = np.ones(shape, np.float32)
        else:
            std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
            params[name] = (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return params


def adamw(rng, params, steps, lr=6e-4, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    for t in range(1, steps + 1):
        for k, p in params.items():
            g = (1e-3 * rng.standard_normal(p.shape, dtype=np.float32)).astype(np.float32)
            m[k] = (b1 * m[k] + (1 - b1) * g).astype(np.float32)
            v[k] = (b2 * v[k] + (1 - b2) * g * g).astype(np.float32)
            mh = m[k] / (1 - b1**t)
            vh = v[k] / (1 - b2**t)
            params[k] = (p - lr * (mh / (np.sqrt(vh) + eps) + wd * p)).astype(np.float32)
    return params, m, v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--torch", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(124)
    params, m, v = adamw(rng, init(rng, a.layers, a.vocab), a.steps)
    os.makedirs(a.out, exist_ok=True)
    if a.torch:
        import torch

        t = {k: torch.from_numpy(x) for k, x in params.items()}
        state = {
            "model": t,
            "optimizer": {
                "state": {
                    i: {"step": torch.tensor(float(a.steps)), "exp_avg": torch.from_numpy(m[k]),
                        "exp_avg_sq": torch.from_numpy(v[k])}
                    for i, k in enumerate(params)
                },
                "param_groups": [{"lr": 6e-4, "betas": (0.9, 0.95), "weight_decay": 0.1,
                                  "params": list(range(len(params)))}],
            },
        }
        torch.save(state, os.path.join(a.out, "ckpt.pt"))
    else:
        from safetensors.numpy import save_file

        save_file(params, os.path.join(a.out, "model.safetensors"))
        opt = {f"{k}.exp_avg": m[k] for k in params}
        opt.update({f"{k}.exp_avg_sq": v[k] for k in params})
        save_file(opt, os.path.join(a.out, "optimizer.safetensors"))
    n = sum(x.size for x in params.values())
    print(f"wrote {n} parameters and their AdamW state to {a.out}", flush=True)


if __name__ == "__main__":
    main()
