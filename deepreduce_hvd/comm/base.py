"""What the PyTorch and TensorFlow `DeepReduce` classes share: options, the communicator that
does the work, stats and checkpointable state. A framework's class adds only its adapter and
the `compress`/`decompress` faces Horovod calls."""
from __future__ import annotations

from typing import Any

from .communicator import Communicator
from .config import Options


class DeepReduceBase:
    """Sparsify, encode and exchange gradients (options: see comm.config.Options)."""

    def __init__(self, adapter: Any, **options: Any) -> None:
        self.options = Options(**options)
        self.comm = Communicator(adapter, self.options)

    @property
    def pipeline(self):
        """The pipeline (residuals, steps, stats) of the default process set."""
        return self.comm.pipeline

    @property
    def time_aware(self) -> bool:
        return self.options.time_aware

    def stats(self) -> dict[str, Any]:
        """See Communicator.stats (bytes_sent, ratio, encode_s, decode_s, "tensors", ...)."""
        return self.comm.stats()

    def reset_stats(self) -> None:
        self.comm.reset_stats()

    def state_dict(self) -> dict[str, Any]:
        """Residuals, steps, planner state and calibration of every process set, for a
        checkpoint (this rank's: save it on every rank). Restoring it with the model and
        optimizer resumes training as if it had never stopped."""
        return self.comm.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.comm.load_state_dict(state)
