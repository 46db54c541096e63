"""Writes real gradients to an .npz for `python scripts/bench_codecs.py codecs --gradients`.

Trains each model on scikit-learn's digits with SGD and saves every parameter's gradient at a
few steps, named "<model>/step<N>/<parameter>".
"""
import argparse
import os

import numpy as np
import torch
from torch.nn import functional as F

from digits import MODELS, digits_split


def capture(model_name, steps, batch, seed):
    torch.manual_seed(seed)
    x, y, _, _ = digits_split()
    model = MODELS[model_name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = {}
    for step in range(1, max(steps) + 1):
        pick = torch.randint(0, len(y), (batch,))
        opt.zero_grad()
        F.cross_entropy(model(x[pick]), y[pick]).backward()
        if step in steps:
            for name, p in model.named_parameters():
                out[f"{model_name}/step{step}/{name}"] = p.grad.detach().numpy().copy()
        opt.step()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="data/digits_gradients.npz")
    parser.add_argument("--models", default="resnet20,mlp")
    parser.add_argument("--steps", default="20,100,300")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    steps = {int(s) for s in args.steps.split(",")}
    arrays = {}
    for name in args.models.split(","):
        arrays.update(capture(name, steps, args.batch, args.seed))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    total = sum(a.size for a in arrays.values())
    print(f"wrote {len(arrays)} gradients ({total:,} elements) to {args.out}")


if __name__ == "__main__":
    main()
