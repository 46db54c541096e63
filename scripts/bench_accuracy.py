"""Accuracy against the number of ranks: the digits CNNs trained dense and compressed, on 2 and
4 real Horovod ranks, several seeds, the same way (6 epochs, SGD momentum 0.9, top-k 5%,
residual memory); writes docs/accuracy_ranks.{json,md}.

    python scripts/bench_accuracy.py [--seeds 3] [--frameworks torch tf] [--ranks 2 4]

Every rank trains on an equal shard of the training set, so at 4 ranks each rank takes half
the steps it takes at 2 ranks: the regime where a sparsified run lags most.
"""
import argparse
import json
import statistics

from bench_e2e import DOCS, saved_run

TOPK = ["--compression", "deepreduce", "--ratio", "0.05"]
CONFIGS = {
    "dense fp32": ["--compression", "none"],
    "bloom+qsgd": [*TOPK, "--index", "bloom", "--value", "qsgd"],
    "entropy+raw": [*TOPK, "--index", "entropy", "--value", "raw"],
    "bloom+qsgd, warm-up": [*TOPK, "--index", "bloom", "--value", "qsgd", "--warmup-steps", "44"],
    "DeepReduce default": ["--compression", "deepreduce"],
}
SCRIPTS = {"torch": ["torch/train_digits.py", "--model", "lenet"], "tf": ["tf/train_digits.py"]}


def train(framework, ranks, config, seed, epochs, batch_size):
    script, *extra = SCRIPTS[framework]
    saved = saved_run(script, ranks, [*extra, "--no-progress", "--epochs", epochs, "--batch-size",
                                      batch_size, "--seed", seed, *CONFIGS[config]], 1800,
                      netns=False)
    return saved["history"][-1]["test_accuracy"]


def report(results):
    lines = ["| framework | ranks | configuration | test accuracy (mean of seeds) | vs dense | seeds |",
             "|---|---:|---|---:|---:|---|"]
    for framework, by_ranks in results.items():
        for ranks, by_config in by_ranks.items():
            dense = statistics.mean(by_config["dense fp32"])
            for config, accuracies in by_config.items():
                mean = statistics.mean(accuracies)
                lines.append(f"| {framework} | {ranks} | {config} | {100 * mean:.1f}% | "
                             f"{100 * (mean - dense):+.1f} | "
                             f"{', '.join(f'{100 * a:.1f}' for a in accuracies)} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--frameworks", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    args = parser.parse_args()
    saved = DOCS / "accuracy_ranks.json"  # runs of other frameworks, ranks or configs are kept
    previous = json.loads(saved.read_text()) if saved.exists() else {}
    same = (previous.get("epochs"), previous.get("batch_size")) == (args.epochs, args.batch_size)
    results = previous.get("results", {}) if same else {}
    for framework in args.frameworks:
        for ranks in args.ranks:
            for config in args.configs:
                accuracies = [train(framework, ranks, config, seed, args.epochs, args.batch_size)
                              for seed in range(args.seeds)]
                results.setdefault(framework, {}).setdefault(str(ranks), {})[config] = accuracies
                print(f"{framework} {ranks} ranks {config}: {accuracies}", flush=True)
    DOCS.mkdir(exist_ok=True)
    saved.write_text(json.dumps(
        {"epochs": args.epochs, "batch_size": args.batch_size, "results": results}, indent=1))
    table = report(results)
    (DOCS / "accuracy_ranks.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
