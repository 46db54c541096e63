"""Benchmarks of the core codecs on real gradients.

    python -m deepreduce_hvd.bench codecs --gradients FILE.npz --density 0.01
    python -m deepreduce_hvd.bench bloom --size 25000000 --density 0.01

`codecs` top-k-sparsifies every gradient of at least --min-size elements (smaller tensors are
sent dense, as in the paper), encodes it with each index codec and real value bytes, and
reports index bits per selected element (the whole payload minus k raw values: headers,
tables and, for Bloom p0, the extra false-positive values included), encode/decode time and
the uniform-subset bound log2 C(N, k) / k.
"""
import argparse
import json
import math
import time

import numpy as np
from scipy.special import gammaln

from . import bloom_filter, native
from .codec import SparseCodec, decode
from .sparsify import topk

INDEX_ROWS = ["raw", "bitmap", "rle", "huffman", "deflate", "varint", "golomb", "entropy",
              "bloom", {"id": "bloom", "policy": "conflict"}]


def log2_binomial(n, k):
    return (gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)) / math.log(2)


def load_gradients(path, min_size):
    with np.load(path) as data:
        return {name: data[name].astype(np.float32) for name in data.files
                if data[name].size >= min_size}


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
            t0 = time.perf_counter()
            payload = codec.encode(values, indices, g.shape, dense=g)
            t1 = time.perf_counter()
            v2, i2, _ = decode(payload)
            t2 = time.perf_counter()
            encode_s, decode_s = encode_s + t1 - t0, decode_s + t2 - t1
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
    print(f"| index codec | bits/index | encode ms | decode ms | lossless | exact |")
    print("|---|---:|---:|---:|---|---|")
    for row in report["rows"]:
        print(f"| {row['index']} | {row['bits_per_index']:.2f} | {row['encode_ms']:.1f} | "
              f"{row['decode_ms']:.1f} | {row['lossless']} | {row['exact']} |")


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
    if native.bloom is not None:
        report["native_query_ms"], fast = best(lambda: bloom_filter.query(filt, m, h, 0, size))
        report["native_insert_ms"], _ = best(lambda: bloom_filter.insert(indices, m, h, 0))
        report["native_query_ms"] *= 1e3
        report["native_insert_ms"] *= 1e3
    slow_s, slow = best(lambda: bloom_filter.query_numpy(filt, m, h, 0, size))
    report["numpy_query_ms"] = 1e3 * slow_s
    if native.bloom is not None:
        assert np.array_equal(fast, slow)
        report["speedup"] = report["numpy_query_ms"] / report["native_query_ms"]
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepreduce_hvd.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    codecs = sub.add_parser("codecs", help="index codecs on real gradients")
    codecs.add_argument("--gradients", required=True, help=".npz of named dense arrays")
    codecs.add_argument("--density", type=float, default=0.01)
    codecs.add_argument("--min-size", type=int, default=1000)
    codecs.add_argument("--json", help="also write the report here")
    bloom = sub.add_parser("bloom", help="C++ vs numpy Bloom query over a whole tensor")
    bloom.add_argument("--size", type=int, default=25_000_000)
    bloom.add_argument("--density", type=float, default=0.01)
    bloom.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.command == "codecs":
        report = bench_index_codecs(load_gradients(args.gradients, args.min_size), args.density)
        print_index_table(report)
    else:
        report = bench_bloom(args.size, args.density, args.repeats)
        print(json.dumps(report, indent=1))
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
