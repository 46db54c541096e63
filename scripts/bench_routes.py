"""Allgather against the sparse allreduce as ranks grow: the wide MLP on digits (top-k 1%,
golomb+fp16; SGD momentum 0.9; error feedback alone, and with what the README tells a user to
set: momentum correction, warm-up, critical phases) at 2, 4 and 8 ranks in a network namespace shaped to 1 Gbit/s,
beside the default DeepReduce(), Horovod dense and fp16, DDP PowerSGD rank 4 and the
compute-only step of the same job.

    python scripts/bench_routes.py [--ranks 2 4 8] [--seeds 0] [--epochs 8]   (as root)
    python scripts/bench_routes.py --report      (redraw docs/routes.md from docs/routes.json)

Per rank per step (rank 0's, whole run): the payload bytes it received and its decode time
(DeepReduce's stats), the step time and its ratio to the compute-only step, the best test
accuracy, and whether every rank ended with identical parameters.
"""
import argparse
import json
import os
import sys

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
    """(bytes received / step, decode ms / step, step ms, best accuracy, identical) of a run
    (the first two and the last: DeepReduce's only)."""
    history, totals = saved["history"], saved["totals"]
    steps = totals["steps"]
    step_ms = 1e3 * sum(e["epoch_s"] for e in history) / steps
    best = max(e["test_accuracy"] for e in history)
    if "bytes_received" not in totals:
        return None, None, step_ms, best, None
    return (totals["bytes_received"] / steps, 1e3 * totals["decode_s"] / steps, step_ms, best,
            totals["parameters_identical"])


def report(results):
    rows = []
    for ranks, runs in sorted(results.items(), key=lambda item: int(item[0])):
        compute = {seed: summary(saved)[2] for seed, saved in runs.get("compute only", {}).items()}
        for config in CONFIGS:
            if config not in runs:
                continue
            figures = []
            for seed, saved in runs[config].items():
                received, decode, step_ms, best, same = summary(saved)
                figures.append((received, decode, step_ms, step_ms / compute[seed] if seed in compute
                                else None, 100 * best, same))
            column = list(zip(*figures))
            rows.append([ranks, config, spread([r and r / 1e3 for r in column[0]], 1),
                         spread(column[1], 2), spread(column[2], 1), spread(column[3], 2),
                         spread(column[4], 1),
                         "–" if column[5][0] is None else ("yes" if all(column[5]) else "NO"),
                         ", ".join(sorted(runs[config]))])
    write_table("routes", ["ranks", "configuration", "KB received / step", "decode ms / step",
                           "step ms", "x compute", "best accuracy %", "identical params", "seeds"],
                "rlrrrrrll", rows)


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
