"""Per-epoch records that the training jobs print on rank 0 and save as JSON."""
import json


class History:
    """Collects one record per epoch: metrics, megabytes sent against the dense equivalent,
    and seconds; rank 0 prints each and writes them all to `path` (if given) on save()."""

    def __init__(self, rank, path=None, args=None):
        self.rank, self.path, self.args = rank, path, args
        self.records = []

    def add(self, epoch, metrics, sent_bytes, dense_bytes, seconds):
        record = {"epoch": epoch, **metrics, "mb_sent": sent_bytes / 1e6,
                  "mb_dense": dense_bytes / 1e6, "epoch_s": seconds}
        self.records.append(record)
        if self.rank == 0:
            shown = "  ".join(f"{name.replace('_', ' ')} {value:.4f}" for name, value in metrics.items())
            print(f"epoch {epoch:3d}  {shown}  sent {sent_bytes / 1e6:.2f} MB of "
                  f"{dense_bytes / 1e6:.2f} MB dense ({dense_bytes / max(sent_bytes, 1):.1f}x)  "
                  f"{seconds:.1f} s", flush=True)
        return record

    def save(self):
        if self.rank == 0 and self.path:
            with open(self.path, "w") as f:
                json.dump({"args": self.args, "history": self.records}, f, indent=1)
