"""Fuzzing the decoder with corrupted and structurally hostile payloads of every codec.

    python scripts/fuzz.py --mutants 20000 --structural 5000 [--json docs/fuzz.json]

Base payloads: every index codec with every value codec, on a 2-D and a 1-D tensor at two
densities (a pair that cannot encode them is counted and reported, never dropped silently).
Byte mutants flip, cut, insert or rewrite a header varint (half of them resealed with a valid
checksum). Structural mutants parse a payload, set one field to a hostile value (a dimension,
the count, a codec id, the layout, Bloom's h, m, inserted count, policy or fill, a curve's
count) and reseal it, so every mutant reaches the codecs with a lie a parser cannot see.

Each mutant is decoded with max_elements=MAX_ELEMENTS, timed, and its peak resident memory
beyond what the process held before (the C++ engine's buffers included) is measured beside the
size of what it returned. The whole run is a child process, so an abort shows as a dead child.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from deepreduce_hvd.codecs import registry
from deepreduce_hvd.codecs.sparse_codec import SparseCodec, decode
from deepreduce_hvd.compression.sparsify import randomk, topk
from deepreduce_hvd.errors import DeepReduceError
from deepreduce_hvd.wire import payload
from deepreduce_hvd.wire.bytestream import ByteWriter

INDEX = ["raw", "bitmap", "rle", "huffman", "deflate", "varint", "golomb", "entropy", "bloom",
         {"id": "bloom", "policy": "random"}, {"id": "bloom", "policy": "conflict"},
         {"id": "bloom", "policy": "leftmost"}, "seeded", "dense"]
VALUE = ["raw", "fp16", "bf16", "deflate", {"id": "qsgd", "seed": 0}, "polyfit", "dexp",
         "entropy"]
MAX_ELEMENTS = 1 << 22
HOSTILE_SIZES = [0, 1, 2, 255, 3000, 2**16, 2**20, MAX_ELEMENTS, MAX_ELEMENTS + 1, 2**26, 2**31,
                 2**40]


def base_payloads(rng):
    """-> (valid payloads, ["index+value: why not", ...] for the pairs that could not encode)."""
    bases, skipped = [], []
    for shape in ((60, 50), (3000,)):
        dense = rng.standard_normal(shape).astype(np.float32)
        for density in (0.02, 0.3):
            for index in INDEX:
                if index == "seeded":
                    values, indices = randomk(dense, density, 7)
                elif index == "dense":
                    values, indices = dense.ravel(), np.arange(dense.size)
                else:
                    values, indices = topk(dense, density)
                for value in VALUE:
                    try:
                        bases.append(SparseCodec(index=index, value=value).encode(
                            values, indices, shape, dense=dense, seed=7))
                    except DeepReduceError as exc:
                        skipped.append(f"{index}+{value} {shape} {density}: {exc}")
    return bases, skipped


def varint(n):
    return ByteWriter().varint(n).getvalue()


def mutate(data, rng):
    """-> (a corrupted copy, whether it was resealed): flipped bytes, a truncation, an
    insertion or a header byte replaced by a large varint."""
    body = bytearray(data[payload.HEADER:])
    kind = rng.integers(4)
    if kind == 0:
        for _ in range(rng.integers(1, 5)):
            body[rng.integers(len(body))] = rng.integers(256)
    elif kind == 1:
        body = body[:rng.integers(len(body))]
    elif kind == 2:
        at = rng.integers(len(body) + 1)
        body[at:at] = rng.integers(0, 256, rng.integers(1, 9), dtype=np.uint8).tobytes()
    else:
        at = rng.integers(2, min(len(body), 24))
        body[at:at + 1] = varint(int(rng.choice([2**31, 2**28, 2**40, 10**6, 255])))
    sealed = bool(rng.random() < 0.5)
    crc = zlib.crc32(bytes(body)) if sealed else int.from_bytes(data[3:7], "little")
    return data[:3] + crc.to_bytes(4, "little") + bytes(body), sealed


def reseal(p, **fields):
    """The payload of parsed `p` with some fields replaced, under a valid checksum."""
    f = {"dtype": p.dtype, "layout": p.layout, "shape": p.shape, "count": p.count,
         "index": p.index_codec.wire_id, "index_body": bytes(p.index_body),
         "extra": bytes(p.extra or b""), "value": p.value_codec.wire_id,
         "value_body": bytes(p.value_body), **fields}
    return payload.write(f["dtype"], f["layout"], f["shape"], f["count"], SimpleNamespace(wire_id=f["index"]),
                         f["index_body"], f["extra"], SimpleNamespace(wire_id=f["value"]), f["value_body"])


def hostile_bloom(p, rng):
    """A Bloom body with one or more hostile fields (h, m, inserted, policy, fill)."""
    count = p.count if rng.random() < 0.7 else int(rng.choice(HOSTILE_SIZES))
    h = int(rng.choice([0, 1, 2, 3, 7, 16, 32, 33, 64, 255]))
    m = int(rng.choice([0, 7, 8, 9, 64, 4096, 2**20, 2**32 - 1, 2**32]))
    inserted = count if rng.random() < 0.6 else int(rng.choice(HOSTILE_SIZES))
    policy = int(rng.integers(0, 6))
    nbytes = min((m + 7) // 8, 1 << 16) + int(rng.choice([0, 0, 0, -1, 1]))
    fill = rng.choice(["ones", "zeros", "random", "sparse"])
    filt = {"ones": b"\xff" * max(nbytes, 0), "zeros": bytes(max(nbytes, 0)),
            "random": rng.integers(0, 256, max(nbytes, 0), dtype=np.uint8).tobytes(),
            "sparse": (rng.random(max(nbytes, 0)) < 0.05).astype(np.uint8).tobytes()}[fill]
    body = (ByteWriter().u8(policy).u8(h).varint(m).varint(int(rng.integers(0, 2**32)))
            .varint(inserted).raw(filt).getvalue())
    shape = p.shape if rng.random() < 0.5 else (int(rng.choice(HOSTILE_SIZES)),)
    what = (f"bloom policy={policy} h={h} m={m} inserted={inserted} count={count} fill={fill} "
            f"shape={shape}")
    return reseal(p, index=registry.codec_class("index", "bloom").wire_id, index_body=body,
                  count=count, shape=shape), what


def hostile_curve(p, rng):
    """A dexp or polyfit body that expands to a hostile count."""
    count = int(rng.choice(HOSTILE_SIZES))
    if rng.random() < 0.5:
        params = rng.choice([0.0, 1.0, -1.0, 80.0, 1e30], 8).astype("<f4").tobytes()
        body = ByteWriter().varint(int(rng.integers(0, count + 1))).raw(params).getvalue()
        value = "dexp"
    else:
        pieces = int(rng.integers(1, 5))
        lengths = [count // pieces] * (pieces - 1) + [count - count // pieces * (pieces - 1)]
        body = (ByteWriter().u8(int(rng.integers(0, 16))).varint(pieces)
                .section(b"".join(varint(n) for n in lengths))
                .raw(rng.standard_normal(16 * pieces).astype("<f4").tobytes()).getvalue())
        value = "polyfit"
    fields = {}
    if rng.random() < 0.5:  # positions that cost nothing either: every one, or seeded
        index = str(rng.choice(["dense", "seeded"]))
        fields = {"shape": (count,), "index": registry.codec_class("index", index).wire_id,
                  "index_body": b"" if index == "dense" else varint(7)}
        value = f"{index}+{value}"
    return reseal(p, value=registry.codec_class("value", value.split("+")[-1]).wire_id,
                  value_body=body, count=count, **fields), f"curve {value} count={count}"


def structural(data, rng):
    """-> (a resealed payload with one hostile field, what was changed)."""
    p = payload.parse(data, max_elements=2**63)
    kind = rng.choice(["shape", "count", "codec", "layout", "bloom", "curve"])
    if kind == "shape":
        shape = list(p.shape)
        if rng.random() < 0.2:
            shape = shape + [int(rng.choice(HOSTILE_SIZES))]
        else:
            shape[rng.integers(len(shape))] = int(rng.choice(HOSTILE_SIZES))
        return reseal(p, shape=tuple(shape)), f"shape {tuple(shape)}"
    if kind == "count":
        count = int(rng.choice(HOSTILE_SIZES + [p.count - 1, p.count + 1, p.size]))
        return reseal(p, count=max(count, 0)), f"count {count}"
    if kind == "codec":
        side = rng.choice(["index", "value"])
        new = int(rng.integers(0, 16))
        return reseal(p, **{side: new}), f"codec {side} #{new}"
    if kind == "layout":
        layout = int(rng.integers(0, 4))
        return reseal(p, layout=layout, extra=varint(int(rng.choice(HOSTILE_SIZES)))), \
            f"layout {layout}"
    if kind == "bloom":
        return hostile_bloom(p, rng)
    return hostile_curve(p, rng)


def rss_kb(field):
    """A /proc/self/status field in kB (VmRSS: now; VmHWM: the peak since clear_refs)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def measured_decode(data):
    """-> (outcome, seconds, peak MB beyond what the process held before, output MB, values):
    outcome is "decoded", "refused" (DeepReduceError) or "escaped: ..." (anything else)."""
    Path("/proc/self/clear_refs").write_text("5")  # the peak restarts from the current size
    before = rss_kb("VmRSS")
    start = time.perf_counter()
    values, output = None, 0.0
    try:
        values, indices, _ = decode(data, max_elements=MAX_ELEMENTS)
        outcome, output = "decoded", (values.nbytes + indices.nbytes) / 2**20
    except DeepReduceError:
        outcome = "refused"
    except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
        outcome = f"escaped: {type(exc).__name__}: {exc}"[:300]
    seconds = time.perf_counter() - start
    return outcome, seconds, (rss_kb("VmHWM") - before) / 1024, output, values


def run(mutants, structural_mutants, seed):
    """Decodes every mutant in this process -> the report."""
    rng = np.random.default_rng(seed)
    bases, skipped = base_payloads(rng)
    report = {"payloads": len(bases), "skipped": len(skipped), "skipped_pairs": skipped[:50],
              "max_elements": MAX_ELEMENTS}
    for mode, n in (("bytes", mutants), ("structural", structural_mutants)):
        stats = {"mutants": n, "sealed": 0, "decoded": 0, "refused": 0, "escapes": [],
                 "slowest_s": 0.0, "slowest": None, "peak_mb": 0.0, "peak": None,
                 "peak_output_mb": 0.0, "largest_output_mb": 0.0}
        for _ in range(n):
            base = bases[rng.integers(len(bases))]
            if mode == "bytes":
                data, sealed = mutate(base, rng)
                what = "bytes"
            else:
                (data, what), sealed = structural(base, rng), True
            stats["sealed"] += sealed
            outcome, seconds, peak, output, _ = measured_decode(data)
            if outcome in ("decoded", "refused"):
                stats[outcome] += 1
            else:
                stats["escapes"].append(f"{what}: {outcome}")
            if seconds > stats["slowest_s"]:
                stats["slowest_s"], stats["slowest"] = seconds, f"{what} ({outcome[:80]})"
            if peak - output > stats["peak_mb"] - stats["peak_output_mb"]:
                stats["peak_mb"], stats["peak_output_mb"] = peak, output
                stats["peak"] = f"{what} ({outcome[:80]})"
            stats["largest_output_mb"] = max(stats["largest_output_mb"], output)
        stats["escape_count"] = len(stats["escapes"])
        stats["escapes"] = stats["escapes"][:20]
        report[mode] = stats
    return report


def in_child(mutants, structural_mutants, seed):
    """The run in a child process: an abort (a C++ terminate, a crash) is reported, not fatal."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        proc = subprocess.run([sys.executable, __file__, "--child", out.name, "--mutants",
                               str(mutants), "--structural", str(structural_mutants),
                               "--seed", str(seed)], capture_output=True, text=True)
        if proc.returncode:
            return {"aborted": True, "returncode": proc.returncode, "stderr": proc.stderr[-2000:]}
        return {**json.loads(Path(out.name).read_text()), "aborted": False}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python scripts/fuzz.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutants", type=int, default=20_000, help="byte mutants")
    parser.add_argument("--structural", type=int, default=5_000, help="structural mutants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.child).write_text(json.dumps(run(args.mutants, args.structural, args.seed)))
        return
    report = in_child(args.mutants, args.structural, args.seed)
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
