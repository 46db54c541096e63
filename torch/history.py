"""Per-epoch records that the training jobs print on rank 0 and save as JSON (and the
synthetic benchmarks' results)."""
import json
import os

# what makes two runs' final accuracy and bytes comparable
RUN_LENGTH = ("model", "ranks", "epochs", "batch_size", "lr", "seed")


class History:
    """Collects one record per epoch: metrics, megabytes sent against the dense equivalent,
    and seconds; rank 0 prints each and writes them all to `path` (if given) on save()."""

    def __init__(self, rank, path=None, args=None):
        self.rank, self.path, self.args = rank, path, args or {}
        self.records, self.metrics = [], []
        self.totals = {}  # whole-run figures a job adds (saved beside the history)

    def add(self, epoch, metrics, sent_bytes, dense_bytes, seconds):
        record = {"epoch": epoch, **metrics, "mb_sent": sent_bytes / 1e6,
                  "mb_dense": dense_bytes / 1e6, "epoch_s": seconds}
        self.records.append(record)
        self.metrics = list(metrics)
        if self.rank == 0:
            shown = "  ".join(f"{name.replace('_', ' ')} {value:.4f}" for name, value in metrics.items())
            print(f"epoch {epoch:3d}  {shown}  sent {sent_bytes / 1e6:.2f} MB of "
                  f"{dense_bytes / 1e6:.2f} MB dense ({dense_bytes / max(sent_bytes, 1):.1f}x)  "
                  f"{seconds:.1f} s", flush=True)
        return record

    def compare(self, path):
        """Rank 0's closing line: the last epoch against a dense run's saved history at `path`,
        recorded earlier with the same run length, so a run says what compression cost in
        accuracy and saved in bytes without training a dense model again."""
        if self.rank != 0 or not self.records or not path:
            return
        where = os.path.relpath(path)
        if not os.path.exists(path):
            print(f"no dense baseline recorded at {where} to compare with")
            return
        with open(path) as f:
            dense = json.load(f)
        differ = [key for key in RUN_LENGTH if dense["args"].get(key) != self.args.get(key)]
        if differ:
            shown = ", ".join(f"{key} {dense['args'].get(key)}" for key in differ)
            print(f"no comparison: the dense run recorded in {where} has {shown}")
            return
        mine, theirs = self.records[-1], dense["history"][-1]
        shown = ", ".join(f"{name.replace('_', ' ')} {mine[name]:.4f} vs {theirs[name]:.4f}"
                          for name in self.metrics)
        print(f"vs dense fp32 (recorded in {where}, same run length): {shown}, "
              f"{mine['mb_sent']:.2f} MB vs {theirs['mb_sent']:.2f} MB sent "
              f"({theirs['mb_sent'] / max(mine['mb_sent'], 1e-6):.1f}x less)", flush=True)

    def save(self):
        if self.rank == 0 and self.path:
            with open(self.path, "w") as f:
                json.dump({"args": self.args, "history": self.records, "totals": self.totals},
                          f, indent=1)


def save_synthetic(name, rates, parameters, compression, path=None):
    """Rank 0's result of a synthetic benchmark (torch/ and tf/synthetic_benchmark.py):
    img/s from every rank's mean `rates`, the time-aware choices DeepReduce made and its step
    guard's verdict; printed as JSON, and written to `path` if given."""
    result = {"compression": name, "img_per_s_per_rank": sum(rates) / len(rates),
              "img_per_s_total": float(sum(rates)), "ranks": len(rates), "parameters": int(parameters)}
    if hasattr(compression, "stats"):
        stats = compression.stats()
        choices = [t["choice"] for t in stats.get("tensors", {}).values()]
        result["choices"] = {c: choices.count(c) for c in sorted(set(choices))}
        result["guard"] = stats.get("guard", {})
    print(json.dumps(result), flush=True)
    if path:
        with open(path, "w") as f:
            json.dump(result, f)
