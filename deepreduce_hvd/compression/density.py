"""How many elements each tensor's selection keeps: the ratio, DGC's density warm-up, and
Accordion's critical regimes, and an energy share that a selection must carry.

Accordion (Agarwal et al., MLSys 2021): training has critical phases, where a gradient's
magnitude changes fast, and compressing hard there costs accuracy that later steps do not win
back. Every INTERVAL steps of a tensor, the norm of its delivered gradient summed over the
interval is compared with the previous interval's; a relative change of at least THRESHOLD
marks the tensor critical, and its next interval selects BOOST times as many elements. A
tensor starts critical (early training is). The delivered sum is the same bits on every rank
(payloads are added in rank order), so every rank decides alike and selects the same count.

The energy share (`energy`): where the step's count of largest elements carries less than
this share of the compensated gradient's energy (its squared L2 norm), top-k keeps as many
more of the next largest as the share needs, up to BOOST times the count (in a warm-up's
first steps that can be the whole tensor). A rank's count then follows its own gradient, as
the threshold sparsifier's does. On the 4-rank digits CNN at 5% (66 steps in all) plain top-k
landed up to 4 points short of dense; a share of 0.7 kept seeds 0-6 within 1.7 points (torch)
and 3.0 (TF) at about 1.5x the bytes, where a flat 20% sends 4x the selections.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..errors import DeepReduceError
from . import sparsify

WARMUP_START = 0.25  # the density warm-up starts at DGC's first-epoch density
INTERVAL = 5         # steps between Accordion's checks
THRESHOLD = 0.5      # relative change of the interval's gradient norm that marks a critical phase
BOOST = 4            # how many times more elements a critical tensor selects


class Density:
    """The selection ratio of each named tensor at its next step."""

    def __init__(self, ratio: float, warmup_steps: int = 0, adaptive: bool = False,
                 energy: Optional[float] = None) -> None:
        sparsify.selection_size(1, ratio)  # validates the ratio
        if energy is not None and (isinstance(energy, bool) or not isinstance(energy, (int, float))
                                   or not math.isfinite(energy) or not 0 < energy <= 1):
            raise DeepReduceError(f"energy must be None or a share in (0, 1], not {energy!r}")
        self.base, self.warmup_steps, self.adaptive = ratio, warmup_steps, adaptive
        self.energy = None if energy is None else float(energy)
        self._watch = {}  # name -> [summed delivered gradient, steps in it, last norm, critical]

    def ratio(self, name: Optional[str], step: int) -> float:
        """The ratio of tensor `name`'s selection at its `step` (unnamed: the base ratio).

        The warm-up and a critical phase each ask for more than the base ratio, for the same
        reason (early or fast-changing training), and the tensor selects the larger of the
        two, not their product: stacked, the warm-up's first steps sent a 4x count, the whole
        tensor at DGC's 25%, and made the wide MLP's first epoch 6.9 s instead of 5.1 (seed 1)."""
        ratio = min(1.0, BOOST * self.base) if self.critical(name) else self.base
        if name is not None and step < self.warmup_steps:  # never below a base >= WARMUP_START
            warm = WARMUP_START * (self.base / WARMUP_START) ** (step / self.warmup_steps)
            ratio = max(ratio, warm)
        return ratio

    def energy_cap(self, size: int, count: int) -> int:
        """The most elements a top-k selection of `count` from `size` may grow to for the
        energy share: BOOST times the count (a warm-up's or a critical phase's grows too)."""
        return min(size, BOOST * count)

    def critical(self, name: Optional[str]) -> bool:
        """Whether tensor `name` is in a critical phase (a new named tensor is)."""
        if not self.adaptive or name is None:
            return False
        watch = self._watch.get(name)
        return watch is None or watch[3]

    def observe(self, name: Optional[str], delivered: np.ndarray,
                positions: Optional[np.ndarray] = None) -> None:
        """Tensor `name`'s delivered (decoded, summed) gradient of one step; `positions`: the
        flat positions outside which it is zero (repeats allowed), read alone if given."""
        if not self.adaptive or name is None:
            return
        flat = np.asarray(delivered, dtype=np.float32).reshape(-1)
        arrived = flat if positions is None else flat[positions]
        if not np.isfinite(arrived).all():
            return
        watch = self._watch.get(name)
        if watch is None or watch[0].size != flat.size:
            watch = self._watch[name] = [np.zeros(flat.size, np.float32), 0, None, True]
        if positions is None:
            watch[0] += flat
        else:  # read, then write: a repeated position adds once, as the dense sum does
            watch[0][positions] = watch[0][positions] + arrived
        watch[1] += 1
        if watch[1] < INTERVAL:
            return
        # numpy's own pairwise sum: no BLAS threads, no float64 copy, the same on every rank
        norm = float(np.sqrt(np.add.reduce(watch[0] * watch[0], dtype=np.float64)))
        last = watch[2]
        watch[3] = last is None or abs(norm - last) >= THRESHOLD * last
        watch[0].fill(0.0)
        watch[1], watch[2] = 0, norm

    def decisions(self) -> dict:
        """{name: critical} of every watched tensor (the same on every rank)."""
        return {name: watch[3] for name, watch in self._watch.items()}

    def state_dict(self) -> dict:
        return {name: {"sum": w[0], "steps": w[1], "norm": w[2], "critical": w[3]}
                for name, w in self._watch.items()}

    def load_state_dict(self, state: dict) -> None:
        self._watch = {name: [np.array(w["sum"], dtype=np.float32), int(w["steps"]),
                              None if w["norm"] is None else float(w["norm"]), bool(w["critical"])]
                       for name, w in state.items()}
