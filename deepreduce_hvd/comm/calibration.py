"""Where the time-aware planner starts from: CPU costs on this host and the link's latency and
bandwidth, measured with the job's own collectives, agreed across the ranks of a process set.

Every rank runs the same collectives in the same order, and the set's first rank broadcasts
its measurements, so every rank predicts, and decides, the same.
"""
import time

import numpy as np

from ..compression.pipeline import Pipeline
from .planner import ALLREDUCE, ALLREDUCE_FP16, LOWRANK, Costs, LinkModel, option_label


def _fit_line(points):
    """(intercept, slope) through two (x, seconds) points, both non-negative."""
    (x0, y0), (x1, y1) = points
    slope = max((y1 - y0) / (x1 - x0), 0.0)
    return max(y0 - slope * x0, 0.0), slope


def calibrate_cpu(pipeline, candidates, sizes=(1 << 14, 1 << 20), repeats=3, denser=4):
    """Costs of each option on this host, from a synthetic gradient (normal values): for the
    sparse candidates, compress and decompress at two sizes, and compress the larger at
    `denser` times the ratio (encoding grows with the count a warm-up or a critical phase
    selects, the selection pass with the size); for the dense options, the compensation and
    fp16 cast; for low-rank factors (where the pipeline has a rank), the three rounds on
    square matrices of both sizes. -> {label: Costs}."""
    rng = np.random.default_rng(0)
    grads = {n: rng.standard_normal(n).astype(np.float32) for n in sizes}
    # at the base ratio: the costs are per selected element, and the planner scales them by
    # each tensor's count (a warm-up or a critical phase selects more)
    config = {**pipeline.get_config(), "warmup_steps": 0, "adaptive_density": False}
    costs = {}

    def best(fn):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - start)
        return min(times), out

    for index, value in candidates:  # scratch pipelines: the job's residuals stay clean
        scratch = Pipeline(**{**config, "index": index, "value": value, "memory": "residual"})
        enc, dec, bits = [], [], []
        for n in sizes:
            seconds, frame = best(lambda: scratch.compress(f"calibration.{n}", grads[n]))
            enc.append((n, seconds))
            dec.append((n, best(lambda: scratch.decompress(frame, (n,), "float32", 1))[0]))
            k = max(scratch.selection_count(n), 1)
            bits.append(8 * len(frame) / k)
        k_large = max(scratch.selection_count(sizes[1]), 1)
        enc_fixed, enc_slope = _fit_line(enc)
        dec_fixed, dec_slope = _fit_line(dec)
        per_selected = 0.0
        busier = Pipeline(**{**scratch.get_config(), "ratio": min(1.0, denser * pipeline.ratio)})
        k_dense = busier.selection_count(sizes[1])
        if k_dense > k_large:
            seconds = best(lambda: busier.compress(f"calibration.{sizes[1]}", grads[sizes[1]]))[0]
            per_selected = max(seconds - enc[1][1], 0.0) / (k_dense - k_large)
            enc_slope = max(enc_slope - per_selected * k_large / sizes[1], 0.0)
        costs[option_label(index, value)] = Costs(enc_fixed, enc_slope, per_selected, dec_fixed,
                                                  0.0, dec_slope * sizes[1] / k_large, bits[1])
    scratch = Pipeline(**{**config, "memory": "residual"})
    for label, half in ((ALLREDUCE, False), (ALLREDUCE_FP16, True)):
        points = [(n, best(lambda: scratch.compress_dense(f"calibration.{n}", grads[n], half))[0])
                  for n in sizes]
        scratch.memory.reset()
        fixed, slope = _fit_line(points)
        costs[label] = Costs(fixed, slope, 0.0, 0.0, 0.0, 0.0, 16.0 if half else 32.0)
    if scratch.factors.rank:
        enc, dec = [], []
        for n in sizes:
            side = int(n ** 0.5)
            name, matrix = f"calibration.{n}", grads[n].reshape(side, side)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                q_own = scratch.settle(name, scratch.project(name, matrix), 1)[0]
                settled = time.perf_counter()
                scratch.reconstruct(name, q_own, (side, side))
                times.append((settled - start, time.perf_counter() - settled))
            enc.append((n, min(t[0] for t in times)))
            dec.append((n, min(t[1] for t in times)))
        (enc_fixed, enc_slope), (dec_fixed, dec_slope) = _fit_line(enc), _fit_line(dec)
        costs[LOWRANK] = Costs(enc_fixed, enc_slope, 0.0, dec_fixed, dec_slope, 0.0, 0.0)
    return costs


def measure_links(adapter, process_set, small=1 << 10, repeats=3, long_enough=0.03,
                  largest=1 << 23, growth=4):
    """Latency and bandwidth of allreduce (fp32 and fp16) and allgather from timed collectives:
    a small one, and one grown `growth`-fold until it takes `long_enough` seconds (so a link's
    burst allowance does not pass for its rate); the median of a few tries each. The tries of a
    size repeat one name, as a training step repeats its tensors' names: the first pays
    Horovod's negotiation of a new name (about 15 ms over Gloo here), the others are served
    from its response cache, and the median is what a step pays. Sizes grow on agreed times,
    so every rank runs the same collectives; a kind starts at the size the one before ended
    at (the sizes between took 0.2 s of about 1 s at 1 Gbit/s)."""
    size = adapter.set_size(process_set)
    links, large = {}, small * 16
    for kind, timer, moved in (
            ("allreduce", lambda n, name: adapter.time_allreduce(n, False, process_set, name),
             lambda n: 2 * (size - 1) / size * 4 * n),
            ("allreduce_fp16", lambda n, name: adapter.time_allreduce(n, True, process_set, name),
             lambda n: 2 * (size - 1) / size * 2 * n),
            ("allgather", lambda n, name: adapter.time_allgather(n, process_set, name),
             lambda n: (size - 1) * 4 * n)):
        def median_time(n):
            return sorted(timer(n, f"{kind}.{n}") for _ in range(repeats))[repeats // 2]

        def agreed_time(n):  # the slowest rank's
            return float(adapter.allgather_numbers([median_time(n)], process_set,
                                                   f"DeepReduce.agree.{kind}.{n}").max())
        small_time = median_time(small)
        large_time = agreed_time(large)
        while large_time < long_enough and large < largest:
            large *= growth
            large_time = agreed_time(large)
        links[kind] = LinkModel.fit((max(moved(small), 1.0), small_time), (moved(large), large_time))
    return links


def calibrate(adapter, process_set, pipeline, candidates, bandwidth=None):
    """(link models, CPU priors) for a process set, identical on its ranks (its first rank's)."""
    priors = calibrate_cpu(pipeline, candidates)
    if bandwidth is not None:
        link = LinkModel(latency=1e-4, bandwidth=bandwidth / 8)
        links = {"allreduce": link, "allgather": link}
    else:
        links = measure_links(adapter, process_set)
    return adapter.broadcast_object((links, priors), process_set, "DeepReduce.calibration")
