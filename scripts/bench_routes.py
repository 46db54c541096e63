"""Allgather against the sparse allreduce as ranks grow: the wide MLP on digits (top-k 1%,
golomb+fp16; SGD momentum 0.9; error feedback alone, and with what the README tells a user to
set: momentum correction, warm-up, critical phases) at 2, 4 and 8 ranks in a network namespace shaped to 1 Gbit/s,
beside the default DeepReduce(), Horovod dense and fp16, DDP PowerSGD rank 4 and the
compute-only step of the same job.

    python scripts/bench_routes.py [--ranks 2 4 8] [--seeds 0] [--epochs 8]   (as root)
    python scripts/bench_routes.py --report      (redraw docs/routes.md from docs/routes.json)

Per rank per step (the mean over ranks, whole run): the payload bytes received and the decode
time (DeepReduce's stats), also the median step's decode time (a step whose rank lost its core
mid-decode, common with more ranks than cores, is what the mean also holds); the step time and
its ratio to the compute-only step, the best test accuracy, and whether every rank ended with
identical parameters. Rows saved before the jobs reported every rank hold rank 0's figures and
no median.
"""
import argparse
import json
import os
import sys

import numpy as np

from bench_e2e import DOCS, remove_namespace, saved_run, shaped_namespace, write_table
from bench_tta import spread

RATE = "1gbit"
CODEC = ["--compression", "deepreduce", "--index", "golomb", "--value", "fp16", "--ratio", 0.01]
SPARSE = [*CODEC, "--fixed-density"]  # error feedback alone
README = [*CODEC, "--momentum-correction", "--warmup-steps", 20]  # + critical phases (default)
CONFIGS = {
    "allgather": [*SPARSE, "--collective", "allgather"],
    "sparse allreduce": [*SPARSE, "--collective", "sparse_allreduce"],
    # with what the README tells a momentum-SGD user to set (momentum correction, warm-up)
    "allgather, README's settings": [*README, "--collective", "allgather"],
    "sparse allreduce, README's settings": [*README, "--collective", "sparse_allreduce"],
    "DeepReduce()": ["--compression", "deepreduce"],
    "Horovod dense fp32": ["--compression", "none"],
    "Horovod fp16": ["--compression", "fp16"],
    "DDP PowerSGD r4": ["--peer", "powersgd", "--powersgd-rank", 4],
    "compute only": ["--peer", "compute"],
}


def train(ranks, config, seed, epochs):
    """One run of the wide MLP in the shaped namespace -> rank 0's saved history."""
    return saved_run("torch/train_digits.py", ranks, ["--model", "mlp", "--epochs", epochs,
                                                      *CONFIGS[config], "--seed", seed,
                                                      "--no-progress"], 3600)


def summary(saved):
    """(bytes received / step, decode ms / step, decode ms of the median step, step ms, best
    accuracy, identical) of a run (bytes, decode and the last: DeepReduce's only; each a mean
    over ranks, rank 0's in older rows, which have no median)."""
    history, totals = saved["history"], saved["totals"]
    steps = totals["steps"]
    step_ms = 1e3 * sum(e["epoch_s"] for e in history) / steps
    best = max(e["test_accuracy"] for e in history)
    if "bytes_received" not in totals:
        return None, None, None, step_ms, best, None
    same = totals["parameters_identical"]
    if "decode_s_by_rank_step" not in totals:
        return totals["bytes_received"] / steps, 1e3 * totals["decode_s"] / steps, None, \
            step_ms, best, same
    decode = np.array(totals["decode_s_by_rank_step"])
    return (float(np.mean(totals["bytes_received_by_rank"])) / steps,
            1e3 * float(decode.sum(axis=1).mean()) / steps,
            1e3 * float(np.median(decode, axis=1).mean()), step_ms, best, same)


def report(results):
    rows = []
    for ranks, runs in sorted(results.items(), key=lambda item: int(item[0])):
        compute = {seed: summary(saved)[3] for seed, saved in runs.get("compute only", {}).items()}
        for config in CONFIGS:
            if config not in runs:
                continue
            figures = []
            for seed, saved in runs[config].items():
                received, decode, median, step_ms, best, same = summary(saved)
                figures.append((received, decode, median, step_ms,
                                step_ms / compute[seed] if seed in compute else None, 100 * best, same))
            column = list(zip(*figures))
            rows.append([ranks, config, spread([r and r / 1e3 for r in column[0]], 1),
                         spread(column[1], 2), spread(column[2], 2), spread(column[3], 1),
                         spread(column[4], 2), spread(column[5], 1),
                         "–" if column[6][0] is None else ("yes" if all(column[6]) else "NO"),
                         ", ".join(sorted(runs[config]))])
    write_table("routes", ["ranks", "configuration", "KB received / step", "decode ms / step",
                           "decode ms, median step", "step ms", "x compute", "best accuracy %",
                           "identical params", "seeds"], "rlrrrrrrll", rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--report", action="store_true", help="redraw from docs/routes.json")
    args = parser.parse_args()
    saved = DOCS / "routes.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    if not args.report:
        if os.geteuid() != 0:
            sys.exit("bench-routes needs root (it creates a network namespace and a tc qdisc)")
        try:
            shaped_namespace(RATE)
            for ranks in args.ranks:
                for seed in args.seeds:
                    for config in args.configs:
                        run_saved = train(ranks, config, seed, args.epochs)
                        results.setdefault(str(ranks), {}).setdefault(config, {})[str(seed)] = run_saved
                        print(f"{ranks} ranks seed {seed} | {config:<20} | "
                              f"{summary(run_saved)}", flush=True)
                        saved.write_text(json.dumps(results, indent=1))
        finally:
            remove_namespace()
    report(results)


if __name__ == "__main__":
    main()
