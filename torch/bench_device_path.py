"""Compress time of a ResNet-50-sized set of gradients (161 tensors, 25.6M elements): the torch
wrapper's device path (compensation and top-k as torch ops on the gradient's device, only k
values to the host) against the host path (the whole gradient to the host, then the native
engine), on the CPU and, where present, on CUDA.

    python torch/bench_device_path.py [--ratio 0.01] [--json out.json]
"""
import argparse
import json
import time

import numpy as np
import torch

from deepreduce_hvd import Pipeline
from deepreduce_hvd.adapters.torch_device import DevicePath
from synthetic_benchmark import ResNet50


def gradients(device):
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(p.shape, generator=generator).to(device)
            for name, p in ResNet50().named_parameters()}


def timed_step(compress, grads, device):
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for name, grad in grads.items():
        compress(name, grad)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    report = {"ratio": args.ratio, "rows": []}
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        grads = gradients(device)
        config = dict(ratio=args.ratio, index="golomb", value="fp16", min_size=1000)
        host, on_device = Pipeline(**config), Pipeline(**config)
        path = DevicePath(on_device)
        ways = {"host path": lambda n, g: host.compress(n, g.detach().cpu().numpy()),
                "device path": lambda n, g: path.compress(n, g)}
        for way, compress in ways.items():
            seconds = min(timed_step(compress, grads, device) for _ in range(args.steps))
            report["rows"].append({"device": device, "path": way, "ms": 1e3 * seconds,
                                   "tensors": len(grads),
                                   "elements": int(sum(g.numel() for g in grads.values()))})
            print(f"{device:>4} {way:<11} {1e3 * seconds:8.1f} ms for {len(grads)} tensors",
                  flush=True)
    report["identical_bytes"] = bool(np.array_equal(
        np.frombuffer(host.compress("check", grads["fc.weight"].cpu().numpy())[21:], np.uint8),
        np.frombuffer(path.compress("check", grads["fc.weight"])[21:], np.uint8)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
