"""DeepReduce's options, validated once: every bad option is a DeepReduceError at construction."""
from __future__ import annotations

from typing import Any, Optional, Union

from ..codecs.choice import is_auto
from ..codecs.sparse_codec import CodecSpec
from ..compression.pipeline import Pipeline
from ..errors import DeepReduceError
from .planner import COLLECTIVES, parse_bandwidth

OBJECTIVES = ("time", "bytes")
DEVICE_PATHS = ("auto", True, False)


class Options:
    """The options of `DeepReduce` (both frameworks).

      sparsifier: "topk" (default), "randomk", "threshold" or "none"; ratio (0.01), threshold.
      index, value: codec ids or configs (see deepreduce_hvd.SparseCodec); "auto" (the default
        for both) lets the planner choose per tensor; value {"id": "auto", "max_error": e}
        bounds the relative L2 error of lossy value codecs (default 0.05).
      memory: "residual" (error feedback, the default) or None.
      min_size: tensors with fewer elements are never sparsified (default 1000).
      warmup_steps: density warm-up: each tensor starts at 25% density, decaying
        geometrically to `ratio` over this many steps (default 0: off; see Pipeline).
      adaptive_density: Accordion's critical regimes (default True): a tensor whose delivered
        gradient changes fast selects 4x `ratio` until it settles (compression/density.py).
      momentum: the momentum of the job's SGD optimizer, turning on DGC's momentum correction
        (compression/momentum.py; default 0: off). The PyTorch class reads it from the
        optimizer: name_parameters(..., optimizer=opt). momentum_masking: DGC's momentum
        factor masking (default False). Needs memory="residual"; runs on the host.
      energy: a share of each compensated gradient's energy (squared L2 norm) that top-k must
        carry (default None: off): where the step's count of largest elements carries less,
        the selection keeps as many more as the share needs, up to 4x that count, so a
        rank's count follows its gradient (compression/density.py). Runs on the host.
      local_clip_norm: DGC's local gradient clipping (default None: off): each rank scales its
        gradient of a tensor to at most this L2 norm before error feedback (and the momentum
        correction's velocity) take it in; to match clipping the averaged gradient of N ranks
        at C, DGC's rule is C * sqrt(N). Runs on the host.
      objective: "time" (default): with an "auto" codec, each tensor takes the way with the
        least predicted time, Horovod's own fp32 or fp16 allreduce included, and the step
        guard runs every tensor by Horovod's allreduce, or every tensor that may go sparse
        sparse, where whole steps measure faster that way (comm/step_guard.py; in a traced
        graph: fp32 for the tensors traced sparse); "bytes": the smallest payload every time.
      bandwidth: the link's bits per second (a number or "1gbit", "100mbit"); by default it is
        measured once with the job's own collectives.
      process_set: the Horovod process set the gradients are reduced over (default: the
        optimizer's or allreduce's own, else the global set).
      device_path: where error feedback and selection run. "auto" (default): on the tensor's
        device when it is not the host CPU (only the selected values and positions cross to
        the host); True: always as framework ops (top-k and threshold); False: never.
      collective: how sparse payloads travel. "auto" (default): the planner chooses per
        tensor between the allgather and, from 16 ranks on, the sparse allreduce (fixed
        codecs: the allgather); "allgather": every rank receives and decodes every rank's
        payload (bytes and decoding grow with the ranks); "sparse_allreduce": each rank
        owns a range of the index space, sums the pieces it receives, keeps the top k/P of
        the sum and the survivors are allgathered (about k values per rank whatever the
        ranks; the rest goes back into error feedback; comm/sparse_allreduce.py).
      hierarchical: for jobs that span hosts: dense sums inside each host, payloads between
        one leader per host (needs Horovod's dynamic process sets).
      lowrank: the rank of the low-rank factors (PowerSGD's subspace iteration, two
        allreduces; compression/lowrank.py) of a named matrix (a conv kernel: output channels
        by fan-in) whose factors hold 8x fewer numbers than it: the time-aware planner sends
        it as factors, or by Horovod's dense allreduce where that is predicted faster, never
        by top-k (default 4; 0: never). Error feedback keeps what the factors miss on the
        rank it came from.
      seed: for random-k, and the factors' first warm start.
    """

    def __init__(self, sparsifier: str = "topk", ratio: float = 0.01, threshold: float = 0.0,
                 index: CodecSpec = "auto", value: CodecSpec = "auto", arrangement: str = "auto",
                 memory: Optional[str] = "residual", min_size: int = 1000, seed: int = 0,
                 objective: str = "time", bandwidth: Union[None, float, str] = None,
                 process_set: Any = None, warmup_steps: int = 0,
                 device_path: Union[str, bool] = "auto", hierarchical: bool = False,
                 adaptive_density: bool = True, momentum: float = 0.0,
                 momentum_masking: bool = False, local_clip_norm: Optional[float] = None,
                 collective: str = "auto", lowrank: int = 4, energy: Optional[float] = None,
                 **unknown: Any) -> None:
        if unknown:
            raise DeepReduceError(f"DeepReduce got unknown options {sorted(unknown)}")
        if objective not in OBJECTIVES:
            raise DeepReduceError(f"objective must be one of {OBJECTIVES}, not {objective!r}")
        if device_path not in DEVICE_PATHS:
            raise DeepReduceError(f"device_path must be 'auto', True or False, not {device_path!r}")
        if collective not in COLLECTIVES:
            raise DeepReduceError(f"collective must be one of {COLLECTIVES}, not {collective!r}")
        if not isinstance(hierarchical, bool):
            raise DeepReduceError(f"hierarchical must be True or False, not {hierarchical!r}")
        self.pipeline = dict(sparsifier=sparsifier, ratio=ratio, threshold=threshold, index=index,
                             value=value, arrangement=arrangement, memory=memory,
                             min_size=min_size, seed=seed, warmup_steps=warmup_steps,
                             adaptive_density=adaptive_density, momentum=momentum,
                             momentum_masking=momentum_masking, local_clip_norm=local_clip_norm,
                             lowrank=lowrank, energy=energy)
        Pipeline(**self.pipeline)  # validates the pipeline's options
        self.index, self.value = index, value
        self.objective, self.bandwidth = objective, parse_bandwidth(bandwidth)
        self.process_set, self.device_path, self.hierarchical = process_set, device_path, hierarchical
        self.collective = collective
        self.time_aware = objective == "time" and (is_auto(index) or is_auto(value))
