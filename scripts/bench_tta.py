"""Time to accuracy: every configuration trains the same model on the same data and seeds in a
network namespace shaped to 1 Gbit/s; accuracy (perplexity for the LSTM) against cumulative
training seconds, and the seconds each needs to reach dense's best minus 1 point (dense's
best perplexity plus 5%).

    python scripts/bench_tta.py [--seeds 0 1 2] [--workloads mlp mlp4 cnn tf-cnn lstm]   (as root)
    python scripts/bench_tta.py --report        (redraw docs/tta.md and docs/tta.png)

Writes docs/tta.json, docs/tta.md and docs/tta.png. Training seconds are rank 0's, summed over
epochs (evaluation excluded); "x compute" divides a run's seconds by the compute-only run's
(same seed): this machine's speed varies between days, the ratio much less.
"""
import argparse
import json
import math
import os
import statistics
import sys

from bench_e2e import DOCS, markdown_table, remove_namespace, saved_run, shaped_namespace

RATE = "1gbit"
DENSE, COMPUTE = "Horovod dense fp32", "compute only"
README = "DeepReduce(), README's settings"
SPARSE = "top-k, error feedback alone"
SPARSE_README = "top-k, README's settings"
# name: (job, ranks, arguments, metric, higher is better)
WORKLOADS = {
    "mlp": ("torch/train_digits.py", 2, ["--model", "mlp", "--epochs", 8], "test_accuracy", True),
    "mlp4": ("torch/train_digits.py", 4, ["--model", "mlp", "--epochs", 8], "test_accuracy", True),
    "cnn": ("torch/train_digits.py", 4, ["--model", "cnn", "--epochs", 6, "--ratio", 0.05],
            "test_accuracy", True),
    "tf-cnn": ("tf/train_digits.py", 4, ["--model", "cnn", "--epochs", 6, "--ratio", 0.05],
               "test_accuracy", True),
    "lstm": ("torch/train_lm.py", 2, ["--epochs", 4, "--steps-per-epoch", 30], "val_perplexity",
             False),
}
TITLES = {"mlp": "wide MLP, 2 ranks", "mlp4": "wide MLP, 4 ranks", "cnn": "digits CNN, 4 ranks (top-k 5%)",
          "tf-cnn": "digits CNN in TensorFlow, 4 ranks (top-k 5%)", "lstm": "LSTM LM, 2 ranks"}
CONFIGS = {
    DENSE: ["--compression", "none"],
    "Horovod fp16": ["--compression", "fp16"],
    "DeepReduce()": ["--compression", "deepreduce"],
    # what the README tells a momentum-SGD user to set (readme_settings adds the warm-up and
    # the clipping bound of each workload): the optimizer (momentum correction)
    README: ["--compression", "deepreduce", "--momentum-correction"],
    # compressed for certain (lossless values: the planner cannot route these dense)
    SPARSE: ["--compression", "deepreduce", "--index", "entropy", "--value", "raw",
             "--fixed-density"],
    SPARSE_README: ["--compression", "deepreduce", "--index", "entropy", "--value", "raw",
                    "--momentum-correction"],
    "DDP PowerSGD r1": ["--peer", "powersgd", "--powersgd-rank", 1],
    "DDP PowerSGD r4": ["--peer", "powersgd", "--powersgd-rank", 4],
    COMPUTE: ["--peer", "compute"],
}
TORCH_ONLY = ("DDP PowerSGD r1", "DDP PowerSGD r4")  # DDP
MOMENTUM_ONLY = (README, SPARSE_README)  # the LSTM trains with plain SGD
DIGITS_TRAIN, BATCH = 1438, 32  # the digits jobs' training images, batch per rank
SHORT_TOPK = ("cnn", "tf-cnn")  # 11 steps an epoch per rank: where the README adds `energy`


def readme_settings(workload):
    """The README's settings for a momentum-SGD job of `ranks` ranks: a density warm-up of
    one epoch of steps, and DGC's local clipping at 2 * sqrt(ranks) (a bound of 2 on the
    averaged gradient of each tensor); for the short top-k runs (the CNN's 66 steps at 5%)
    also an energy share of 0.7."""
    ranks = WORKLOADS[workload][1]
    short = ["--energy", 0.7] if workload in SHORT_TOPK else []
    return ["--warmup-steps", DIGITS_TRAIN // ranks // BATCH,
            "--local-clip-norm", round(2 * math.sqrt(ranks), 3), *short]


def configs_of(workload, chosen=None):
    tf = WORKLOADS[workload][0].startswith("tf/")
    lstm = workload == "lstm"
    return [c for c in chosen or CONFIGS
            if not (tf and c in TORCH_ONLY) and not (lstm and c in MOMENTUM_ONLY)]


def train(workload, config, seed):
    """One run in the shaped namespace -> its per-epoch history (rank 0's)."""
    job, ranks, args, _, _ = WORKLOADS[workload]
    extra = ["--seed", seed, *(["--no-progress"] if job.endswith("train_digits.py") else [])]
    if config in MOMENTUM_ONLY:
        extra += readme_settings(workload)
    return saved_run(job, ranks, [*args, *CONFIGS[config], *extra], 1800)["history"]


def seconds_to(history, metric, goal, higher):
    """Cumulative training seconds at the first epoch whose metric reaches goal (None: never)."""
    total = 0.0
    for epoch in history:
        total += epoch["epoch_s"]
        if (epoch[metric] >= goal) if higher else (epoch[metric] <= goal):
            return total
    return None


def spread(values, digits):
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    text = f"{statistics.mean(values):.{digits}f}"
    return text + (f" ({min(values):.{digits}f}–{max(values):.{digits}f})" if len(values) > 1 else "")


def report(results):
    """docs/tta.md (a table per workload) and docs/tta.png (curves, mean over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sections = []
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.2), squeeze=False)
    for ax, (workload, runs) in zip(axes[0], results.items()):
        _, ranks, _, metric, higher = WORKLOADS[workload]
        seeds = sorted(runs[DENSE], key=int)
        best = {c: {s: (max if higher else min)(e[metric] for e in h) for s, h in per.items()}
                for c, per in runs.items()}
        goals = {s: best[DENSE][s] - 0.01 if higher else best[DENSE][s] * 1.05 for s in seeds}
        rows = []
        for config, per in sorted(runs.items(), key=lambda item: list(CONFIGS).index(item[0])):
            reach = [seconds_to(per[s], metric, goals[s], higher) if s in per else None for s in seeds]
            total = [sum(e["epoch_s"] for e in per[s]) for s in seeds if s in per]
            floor = [sum(e["epoch_s"] for e in runs[COMPUTE][s]) for s in seeds
                     if COMPUTE in runs and s in runs[COMPUTE] and s in per]
            shown_best = [best[config][s] for s in seeds if s in per] if config != COMPUTE else []
            rows.append([config, spread([100 * b for b in shown_best] if higher else shown_best, 1),
                         " / ".join("never" if r is None else f"{r:.1f}" for r in reach)
                         if config != COMPUTE else "–",
                         spread(total, 1),
                         f"{statistics.mean(total) / statistics.mean(floor):.2f}" if floor else "–"])
            cumulative = [sum(e["epoch_s"] for e in per[s][:i + 1]) for s in per
                          for i in range(len(per[s]))]
            if config != COMPUTE:
                epochs = len(next(iter(per.values())))
                xs = [statistics.mean(cumulative[i::epochs]) for i in range(epochs)]
                ys = [statistics.mean(per[s][i][metric] for s in per) for i in range(epochs)]
                ax.plot(xs, ys, marker="o", markersize=3, label=config)
        what = "best test accuracy %" if higher else "best val. perplexity"
        goal = "dense's best − 1 point" if higher else "dense's best perplexity + 5%"
        sections.append(f"**{TITLES[workload]}** (seeds {', '.join(seeds)}; goal: {goal}, per seed)\n\n"
                        + markdown_table(["configuration", f"{what}, mean (min–max)",
                                 "s to goal, per seed", "training s, mean (min–max)",
                                 "x compute"], "lrrrr", rows))
        ax.set(title=TITLES[workload], xlabel="cumulative training seconds (mean over seeds)",
               ylabel="test accuracy" if higher else "validation perplexity")
        if not higher:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "tta.png", dpi=110)
    (DOCS / "tta.md").write_text("\n\n".join(sections) + "\n")
    print("\n\n".join(sections))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS),
                        help="run only these (the others' saved runs are kept)")
    parser.add_argument("--report", action="store_true", help="redraw from docs/tta.json")
    args = parser.parse_args()
    saved = DOCS / "tta.json"
    if args.report:
        results = json.loads(saved.read_text())
        report({w: results[w] for w in WORKLOADS if w in results})
        return
    if os.geteuid() != 0:
        sys.exit("bench-tta needs root (it creates a network namespace and a tc qdisc)")
    results = json.loads(saved.read_text()) if saved.exists() else {}
    try:
        shaped_namespace(RATE)
        for workload in args.workloads:
            runs = results.setdefault(workload, {})
            for seed in args.seeds:
                for config in configs_of(workload, args.configs):
                    history = train(workload, config, seed)
                    runs.setdefault(config, {})[str(seed)] = history
                    last = history[-1]
                    print(f"{workload:<6} seed {seed} | {config:<34} | "
                          f"{WORKLOADS[workload][3]} {last[WORKLOADS[workload][3]]:.4f} | "
                          f"{sum(e['epoch_s'] for e in history):6.1f} s", flush=True)
            saved.write_text(json.dumps(results, indent=1))
    finally:
        remove_namespace()
    report({w: results[w] for w in WORKLOADS if w in results})


if __name__ == "__main__":
    main()
