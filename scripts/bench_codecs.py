"""Benchmarks of the core codecs on real gradients.

    python scripts/bench_codecs.py codecs --gradients FILE.npz --density 0.01 [--plot P.png]
    python scripts/bench_codecs.py bloom --size 25000000 --density 0.01
    python scripts/bench_codecs.py topk --size 25000000 --density 0.01
    python scripts/bench_codecs.py hotpath --gradients FILE.npz
    python scripts/bench_codecs.py scaling --gradients FILE.npz --plot P.png

`codecs` top-k-sparsifies every gradient of at least --min-size elements (smaller tensors are
sent dense, as in the paper), encodes it with each index codec and real value bytes, and
reports index bits per selected element (the whole payload minus k raw values: headers,
tables and, for Bloom p0, the extra false-positive values included), encode/decode time and
the uniform-subset bound log2 C(N, k) / k. Then whole pipelines (index + value codec): bits
per selected element of the complete payload and the relative L2 error of what arrives
against the dense gradient at the positions sent.
"""
import argparse
import json
import math
import time

import numpy as np

from deepreduce_hvd.codecs import bloom_filter
from deepreduce_hvd.codecs.sparse_codec import SparseCodec, decode
from deepreduce_hvd.comm.sparse_allreduce import Exchange, Ranges
from deepreduce_hvd.compression.pipeline import Pipeline
from deepreduce_hvd.compression.sparsify import topk
from deepreduce_hvd.engine import native

INDEX_ROWS = ["raw", "bitmap", "rle", "huffman", "deflate", "varint", "golomb", "entropy",
              "bloom", {"id": "bloom", "policy": "conflict"}]
PIPELINES = {"top-k raw pairs": ("raw", "raw"), "entropy+raw": ("entropy", "raw"),
             "entropy+fp16": ("entropy", "fp16"), "entropy+qsgd": ("entropy", "qsgd"),
             "entropy+entropy": ("entropy", "entropy"), "entropy+polyfit": ("entropy", "polyfit"),
             "entropy+dexp": ("entropy", "dexp"), "bloom+qsgd": ("bloom", "qsgd"),
             "bloom+polyfit": ("bloom", "polyfit"), "auto+auto": ("auto", "auto")}
PLOTTED = ["top-k raw pairs", "entropy+raw", "entropy+entropy", "bloom+qsgd", "auto+auto"]


def log2_binomial(n, k):
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def load_gradients(path, min_size):
    with np.load(path) as data:
        return {name: data[name].astype(np.float32) for name in data.files
                if data[name].size >= min_size}


def timed_roundtrip(codec, g, values, indices):
    """(payload, decoded values, decoded indices, encode s, decode s)."""
    t0 = time.perf_counter()
    payload = codec.encode(values, indices, g.shape, dense=g)
    t1 = time.perf_counter()
    v2, i2, _ = decode(payload)
    return payload, v2, i2, t1 - t0, time.perf_counter() - t1


def bench_index_codecs(gradients, density, rows=INDEX_ROWS):
    sparse = {name: (g, *topk(g, density)) for name, g in gradients.items()}
    selected = sum(idx.size for _, _, idx in sparse.values())
    bound = sum(log2_binomial(g.size, idx.size) for g, _, idx in sparse.values()) / selected
    results = []
    for config in rows:
        codec = SparseCodec(index=config, value="raw")
        nbytes = encode_s = decode_s = 0.0
        exact = True
        for g, values, indices in sparse.values():
            payload, v2, i2, enc, dec = timed_roundtrip(codec, g, values, indices)
            encode_s, decode_s = encode_s + enc, decode_s + dec
            nbytes += len(payload) - 4 * indices.size
            exact &= bool(np.isin(indices, i2).all() and np.array_equal(v2, g.ravel()[i2]))
        name = config if isinstance(config, str) else f"{config['id']}-{config['policy']}"
        results.append({"index": name, "bits_per_index": 8 * nbytes / selected,
                        "encode_ms": 1e3 * encode_s, "decode_ms": 1e3 * decode_s,
                        "lossless": codec.lossless, "exact": exact})
    return {"tensors": len(sparse), "selected": selected, "density": density,
            "uniform_bound_bits": bound, "rows": results}


def print_index_table(report):
    print(f"{report['tensors']} tensors, {report['selected']:,} selected elements at density "
          f"{report['density']}; uniform-subset bound log2 C(N,k)/k = "
          f"{report['uniform_bound_bits']:.2f} bits")
    print("| index codec | bits/index | encode ms | decode ms | lossless | exact |")
    print("|---|---:|---:|---:|---|---|")
    for row in report["rows"]:
        print(f"| {row['index']} | {row['bits_per_index']:.2f} | {row['encode_ms']:.1f} | "
              f"{row['decode_ms']:.1f} | {row['lossless']} | {row['exact']} |")


def bench_pipelines(gradients, density, names=tuple(PIPELINES)):
    sparse = {name: (g, *topk(g, density)) for name, g in gradients.items()}
    selected = sum(idx.size for _, _, idx in sparse.values())
    rows = []
    for name in names:
        index, value = PIPELINES[name]
        codec = SparseCodec(index=index, value=value)
        nbytes = encode_s = decode_s = err2 = ref2 = 0.0
        for g, values, indices in sparse.values():
            payload, v2, i2, enc, dec = timed_roundtrip(codec, g, values, indices)
            encode_s, decode_s, nbytes = encode_s + enc, decode_s + dec, nbytes + len(payload)
            sent = np.union1d(indices, i2)
            got = np.zeros(g.size, np.float64)
            got[i2] = v2
            err2 += float(((got[sent] - g.ravel()[sent]) ** 2).sum())
            ref2 += float((g.ravel()[sent].astype(np.float64) ** 2).sum())
        rows.append({"pipeline": name, "bits_per_element": 8 * nbytes / selected,
                     "relative_l2_error": math.sqrt(err2 / ref2) if ref2 else 0.0,
                     "encode_ms": 1e3 * encode_s, "decode_ms": 1e3 * decode_s})
    return {"density": density, "selected": selected, "rows": rows}


def print_pipeline_table(report):
    print(f"\nwhole payloads at density {report['density']} (raw top-k pairs cost 64 bits):")
    print("| pipeline | bits/element | rel. L2 error | encode ms | decode ms |")
    print("|---|---:|---:|---:|---:|")
    for row in report["rows"]:
        print(f"| {row['pipeline']} | {row['bits_per_element']:.2f} | "
              f"{row['relative_l2_error']:.4f} | {row['encode_ms']:.1f} | {row['decode_ms']:.1f} |")


def plot_densities(gradients, path, densities=(0.001, 0.01, 0.1)):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves = {name: [] for name in PLOTTED}
    for density in densities:
        for row in bench_pipelines(gradients, density, PLOTTED)["rows"]:
            curves[row["pipeline"]].append(row["bits_per_element"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, bits in curves.items():
        ax.plot([100 * d for d in densities], bits, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("density (% of elements selected by top-k)")
    ax.set_ylabel("bits per selected element (whole payload)")
    ax.set_title("DeepReduce payload size on real gradients")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return curves


def bench_topk(size, density, repeats):
    import torch
    dense = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    tensor = torch.from_numpy(dense)
    k = max(1, int(round(size * density)))

    def best(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1e3 * min(times)

    ours = best(lambda: topk(dense, density))
    theirs = best(lambda: torch.topk(tensor.abs(), k, sorted=False))
    return {"size": size, "k": k, "deepreduce_topk_ms": ours, "torch_topk_ms": theirs,
            "speedup": theirs / ours}


def bench_bloom(size, density, repeats):
    rng = np.random.default_rng(0)
    count = max(1, int(size * density))
    indices = np.sort(rng.choice(size, count, replace=False))
    m, h = bloom_filter.parameters(count, size)
    filt = bloom_filter.insert(indices, m, h, 0)

    def best(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return min(times), out

    report = {"size": size, "count": count, "m_bits": m, "hashes": h}
    if native.engine is not None:
        report["native_query_ms"], fast = best(lambda: bloom_filter.query(filt, m, h, 0, size))
        report["native_insert_ms"], _ = best(lambda: bloom_filter.insert(indices, m, h, 0))
        report["native_query_ms"] *= 1e3
        report["native_insert_ms"] *= 1e3
    slow_s, slow = best(lambda: bloom_filter.query_numpy(filt, m, h, 0, size))
    report["numpy_query_ms"] = 1e3 * slow_s
    if native.engine is not None:
        assert np.array_equal(fast, slow)
        report["speedup"] = report["numpy_query_ms"] / report["native_query_ms"]
    return report


HOTPATH_PIPELINES = [("entropy", "entropy"), ("golomb", "fp16"), ("golomb", "qsgd"), ("raw", "raw")]


def best_of(fn, repeats):
    """Fastest of `repeats` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def largest_gradient(gradients):
    name = max(gradients, key=lambda n: gradients[n].size)
    return name, gradients[name]


def beside(fn, reference, repeats):
    """Fastest of `repeats` calls of fn and of reference, in seconds, called alternately: this
    shared machine's speed drifts within seconds, and a ratio between two figures taken at
    different moments drifted with it (the copy measured 0.65 to 1.26 ms within a minute)."""
    times, reference_times = [], []
    for _ in range(repeats):
        reference_times.append(best_of(reference, 1))
        times.append(best_of(fn, 1))
    return min(times), min(reference_times)


def bench_hotpath(gradients, density, ranks=32, repeats=15):
    """One large real gradient, residual memory on: Pipeline.compress and the decoding of
    `ranks` payloads into one sum, each beside a plain copy of the tensor, alternately (and
    the copy repeated alone, its 16 MB source left in the cache, for reference). The sum is
    decoded into a new array (as the TensorFlow wrapper receives it) and into one buffer
    used again (`decode_into`: the torch wrapper writes it into the gradient itself)."""
    name, grad = largest_gradient(gradients)
    copy_alone_s = best_of(grad.copy, repeats)
    rows = []
    for index, value in HOTPATH_PIPELINES:
        pipeline = Pipeline(ratio=density, index=index, value=value)
        frames = [pipeline.compress(name, grad) for _ in range(ranks)]  # residual warms up too
        compress_s, compress_copy_s = beside(lambda: pipeline.compress(name, grad), grad.copy,
                                             repeats)
        gathered = b"".join(frames)
        decode_s, decode_copy_s = beside(
            lambda: pipeline.decompress(gathered, grad.shape, "float32", ranks), grad.copy,
            max(3, repeats // 2))
        buffer = np.empty_like(grad)
        into_s, into_copy_s = beside(
            lambda: pipeline.decompress(gathered, grad.shape, "float32", ranks, out=buffer),
            grad.copy, max(3, repeats // 2))
        rows.append({"pipeline": f"{index}+{value}", "compress_ms": 1e3 * compress_s,
                     "compress_copy_ms": 1e3 * compress_copy_s,
                     "compress_x_copy": compress_s / compress_copy_s, "decode_ms": 1e3 * decode_s,
                     "decode_copy_ms": 1e3 * decode_copy_s, "decode_x_copy": decode_s / decode_copy_s,
                     "decode_into_ms": 1e3 * into_s, "decode_into_x_copy": into_s / into_copy_s,
                     "bits_per_element": 8 * (len(frames[-1]) - 21) / max(1, round(density * grad.size))})
    return {"tensor": name, "shape": list(grad.shape), "density": density, "ranks": ranks,
            "copy_alone_ms": 1e3 * copy_alone_s, "rows": rows}


SCALING_RANKS = (2, 4, 8, 16, 32, 64)
SCALING_PIPELINES = [("golomb", "fp16"), ("entropy", "entropy")]
LINK_RATES = {"1 Gbit/s": 1e9, "10 Gbit/s": 1e10, "100 Gbit/s": 1e11}


def sparse_allreduce_decode(pipeline_args, sources, ranks, repeats):
    """Seconds one rank spends decoding in a sparse allreduce of P ranks' gradients (the
    owner's decoding and sum of its range's pieces, then the survivors into the total: the
    Exchange's decode_s; the owner's selection and encoding of its survivors are encode
    time; the slowest rank, best of `repeats` steps), the alltoall and allgather done by
    slicing bytes in-process."""
    pipelines = [Pipeline(**pipeline_args) for _ in range(ranks)]
    ranges = [Ranges() for _ in range(ranks)]
    codec = pipelines[0].codec
    out = np.zeros(sources[0].size, np.float32)
    best = float("inf")
    for _ in range(repeats + 1):  # the first step rebalances the ranges
        bounds = ranges[0].bounds("g", out.size, ranks, pipelines[0].selection_count(out.size, "g"))
        exchanges = [Exchange(p, "g", "float32") for p in pipelines]
        sent = [e.scatter(sources[r % len(sources)] * (1 + 0.01 * r), bounds.copy(), r, codec, None)
                for r, e in enumerate(exchanges)]
        offsets = [np.concatenate([[0], np.cumsum(e.splits)]) for e in exchanges]
        gathered = np.concatenate([
            e.reduce(np.concatenate([sent[r][offsets[r][owner]:offsets[r][owner + 1]]
                                     for r in range(ranks)]))
            for owner, e in enumerate(exchanges)])
        for r, e in enumerate(exchanges):
            e.gather(gathered, ranges[r], "g", out=out)
        best = min(best, max(e.decode_s for e in exchanges))
    return best


def allgather_decode(pipeline, source, others, repeats):
    """Seconds one rank spends decoding an allgather: the other ranks' frames `others`, and its
    own (encoded from `source` each step: its encoder's values are added, not decoded); best
    of `repeats` steps."""
    ranks, best = len(others) + 1, float("inf")
    for _ in range(repeats):
        gathered = pipeline.compress("own", source) + b"".join(others)
        start = time.perf_counter()
        pipeline.decompress(gathered, source.shape, "float32", ranks, name="own", own=0)
        best = min(best, time.perf_counter() - start)
    return best


def bench_scaling(gradients, density, repeats=3):
    """Per-rank cost of receiving and decoding the payloads of P ranks (real gradients: every
    captured step and layer of the model of the largest tensor, at its size) for P = 2..64,
    by allgather and by the sparse allreduce, and the model of where each stops beating a
    ring allreduce of fp32 / fp16."""
    name, grad = largest_gradient(gradients)
    family = name.rsplit("/", 1)[-1]
    sources = [g for n, g in gradients.items() if n.endswith(family) and g.shape == grad.shape]
    rows = []
    for index, value in SCALING_PIPELINES:
        pipeline = Pipeline(ratio=density, index=index, value=value)
        frames = [pipeline.compress(f"r{i}", sources[i % len(sources)] * (1 + 0.01 * i))
                  for i in range(max(SCALING_RANKS))]
        payload_bytes = float(np.mean([len(f) for f in frames]))
        for ranks in SCALING_RANKS:
            seconds = allgather_decode(pipeline, sources[0], frames[1:ranks], repeats)
            sparse = sparse_allreduce_decode(dict(ratio=density, index=index, value=value),
                                             sources, ranks, repeats)
            rows.append({"pipeline": f"{index}+{value}", "ranks": ranks, "decode_ms": 1e3 * seconds,
                         "sparse_allreduce_decode_ms": 1e3 * sparse, "payload_bytes": payload_bytes})
    model = crossover_model(rows, grad.size)
    return {"tensor": name, "elements": grad.size, "density": density, "rows": rows, "model": model}


def decode_fits(mine):
    """{"decode_ms": (slope, intercept), "sparse_allreduce_decode_ms": ...}: one pipeline's
    measured decode seconds per tensor, fitted linear in the ranks P."""
    ranks = [r["ranks"] for r in mine]
    return {key: np.polyfit(ranks, [r[key] / 1e3 for r in mine], 1)
            for key in ("decode_ms", "sparse_allreduce_decode_ms")}


def route_models(mine, bandwidth):
    """{"" (the allgather), "sparse allreduce ": P -> predicted seconds} for one pipeline's
    rows: bytes over the link + decoding (decode_fits)."""
    payload, fits = mine[0]["payload_bytes"], decode_fits(mine)
    (slope, intercept), (sparse_slope, sparse_intercept) = (
        fits["decode_ms"], fits["sparse_allreduce_decode_ms"])
    return {"": lambda p: (p - 1) * payload / bandwidth + intercept + slope * p,
            "sparse allreduce ": lambda p: 2 * (p - 1) / p * payload / bandwidth
            + sparse_intercept + sparse_slope * p}


def crossover_model(rows, elements, most_ranks=1024):
    """Predicted seconds per tensor and rank: allgather = (P-1) payloads / B + decoding P
    payloads (measured, linear in P); sparse allreduce (comm/sparse_allreduce.py) = 2 (P-1)/P
    payloads / B (pieces of 1/P of a payload to each owner, survivors of 1/P back from each)
    + its decoding (measured: the owner's P pieces, then the P survivors; linear in P);
    ring allreduce = 2 (P-1)/P x bytes / B (fp32: 4 bytes per element, fp16: 2). Latencies
    are left out (the sparse allreduce pays two rounds, the others one). Per link, pipeline
    and route, the largest P up to `most_ranks` at which the route is still faster than the
    ring (None: never)."""
    out = {}
    for pipeline in dict.fromkeys(r["pipeline"] for r in rows):
        mine = [r for r in rows if r["pipeline"] == pipeline]
        for link, rate in LINK_RATES.items():
            bandwidth = rate / 8
            for route, predict in route_models(mine, bandwidth).items():
                for dense, width in (("fp32", 4), ("fp16", 2)):
                    limit = None
                    for ranks in range(2, most_ranks + 1):
                        if predict(ranks) >= 2 * (ranks - 1) / ranks * width * elements / bandwidth:
                            break
                        limit = ranks
                    out[f"{pipeline} {route}vs {dense} at {link}"] = limit
        fits = decode_fits(mine)
        out[f"{pipeline} decode ms per payload"] = 1e3 * fits["decode_ms"][0]
        out[f"{pipeline} sparse allreduce decode ms per rank"] = \
            1e3 * fits["sparse_allreduce_decode_ms"][0]
    return out


def plot_scaling(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for pipeline in dict.fromkeys(r["pipeline"] for r in report["rows"]):
        mine = [r for r in report["rows"] if r["pipeline"] == pipeline]
        line, = axes[0].plot([r["ranks"] for r in mine], [r["decode_ms"] for r in mine],
                             marker="o", label=f"{pipeline} allgather")
        axes[0].plot([r["ranks"] for r in mine], [r["sparse_allreduce_decode_ms"] for r in mine],
                     marker="s", linestyle="--", color=line.get_color(),
                     label=f"{pipeline} sparse allreduce")
    axes[0].set(xscale="log", xlabel="ranks P",
                ylabel="decode + sum (ms, one rank)", title=f"decoding {report['tensor']}")
    axes[0].legend()
    ranks = np.arange(2, 129)
    elements = report["elements"]
    for link, rate in LINK_RATES.items():
        bandwidth = rate / 8
        line, = axes[1].plot(ranks, 1e3 * 2 * (ranks - 1) / ranks * 2 * elements / bandwidth,
                             linestyle="--", label=f"ring fp16, {link}")
        models = route_models([r for r in report["rows"] if r["pipeline"] == "golomb+fp16"],
                              bandwidth)
        axes[1].plot(ranks, 1e3 * models[""](ranks), color=line.get_color(),
                     label=f"golomb+fp16 allgather, {link}")
        axes[1].plot(ranks, 1e3 * models["sparse allreduce "](ranks), color=line.get_color(),
                     linestyle=":", label=f"golomb+fp16 sparse allreduce, {link}")
    axes[1].set(xscale="log", yscale="log", xlabel="ranks P", ylabel="predicted ms per tensor",
                title="payloads (allgather, sparse allreduce) vs ring allreduce")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python scripts/bench_codecs.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    codecs = sub.add_parser("codecs", help="index codecs on real gradients")
    codecs.add_argument("--gradients", required=True, help=".npz of named dense arrays")
    codecs.add_argument("--density", type=float, default=0.01)
    codecs.add_argument("--min-size", type=int, default=1000)
    codecs.add_argument("--json", help="also write the report here")
    codecs.add_argument("--plot", help="PNG of bits per element against density")
    bloom = sub.add_parser("bloom", help="C++ vs numpy Bloom query over a whole tensor")
    bloom.add_argument("--size", type=int, default=25_000_000)
    bloom.add_argument("--density", type=float, default=0.01)
    bloom.add_argument("--repeats", type=int, default=5)
    top = sub.add_parser("topk", help="sampled-threshold top-k against torch.topk")
    top.add_argument("--size", type=int, default=25_000_000)
    top.add_argument("--density", type=float, default=0.01)
    top.add_argument("--repeats", type=int, default=5)
    hot = sub.add_parser("hotpath", help="compress and 32-rank decode of one large gradient vs a copy")
    hot.add_argument("--gradients", required=True)
    hot.add_argument("--density", type=float, default=0.01)
    hot.add_argument("--json", help="also write the report here")
    scale = sub.add_parser("scaling", help="decode cost against the number of ranks, crossover model")
    scale.add_argument("--gradients", required=True)
    scale.add_argument("--density", type=float, default=0.01)
    scale.add_argument("--json", help="also write the report here")
    scale.add_argument("--plot", help="PNG of decode cost and predicted times against ranks")
    args = parser.parse_args(argv)
    if args.command == "codecs":
        gradients = load_gradients(args.gradients, args.min_size)
        report = bench_index_codecs(gradients, args.density)
        print_index_table(report)
        report["pipelines"] = bench_pipelines(gradients, args.density)
        print_pipeline_table(report["pipelines"])
        if args.plot:
            report["plot"] = plot_densities(gradients, args.plot)
            print(f"\nplot written to {args.plot}")
    elif args.command == "hotpath":
        report = bench_hotpath(load_gradients(args.gradients, 1000), args.density)
        print(json.dumps(report, indent=1))
    elif args.command == "scaling":
        report = bench_scaling(load_gradients(args.gradients, 1000), args.density)
        if args.plot:
            plot_scaling(report, args.plot)
        print(json.dumps(report, indent=1))
    else:
        bench = bench_bloom if args.command == "bloom" else bench_topk
        report = bench(args.size, args.density, args.repeats)
        print(json.dumps(report, indent=1))
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
