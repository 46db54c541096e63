"""The framework-neutral DeepReduce pipeline: memory -> sparsifier -> codec, and back.

The PyTorch and TensorFlow wrappers only move tensors to and from numpy and call Horovod;
everything that decides what goes on the wire is here. Each rank's payload is framed with a
fingerprint of (shape, dtype, pipeline config), so ranks that disagree fail loudly instead of
summing mismatched tensors.
"""
import json
import math
import time
import zlib

import numpy as np

from . import sparsify
from .codec import SparseCodec, decode, densify
from .errors import DeepReduceError
from .memory import ResidualMemory

SPARSIFIERS = ("topk", "randomk", "threshold", "none")
FRAME_MAGIC = b"DRF1"
FRAME_HEADER = 12  # magic, fingerprint u32, payload length u32


class Stats:
    """Counters a training job can log: bytes_sent, dense_bytes, ratio, tensors_compressed,
    tensors_passed_through, encode_s, decode_s."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.bytes_sent = self.dense_bytes = 0
        self.tensors_compressed = self.tensors_passed_through = 0
        self.encode_s = self.decode_s = 0.0

    def as_dict(self):
        return {"bytes_sent": self.bytes_sent, "dense_bytes": self.dense_bytes,
                "ratio": self.dense_bytes / self.bytes_sent if self.bytes_sent else 0.0,
                "tensors_compressed": self.tensors_compressed,
                "tensors_passed_through": self.tensors_passed_through,
                "encode_s": self.encode_s, "decode_s": self.decode_s}


class Pipeline:
    """sparsifier + SparseCodec + optional residual memory, on numpy arrays.

    sparsifier: "topk" / "randomk" (keep `ratio` of the elements), "threshold" (magnitude
    above `threshold`; 0 keeps the non-zeros) or "none" (every element).
    index, value, arrangement: as for SparseCodec. memory: None or "residual".
    min_size: tensors with fewer elements are sent dense (default 1000, as in the paper).
    """

    def __init__(self, sparsifier="topk", ratio=0.01, threshold=0.0, index="entropy",
                 value="raw", arrangement="auto", memory=None, min_size=1000, seed=0):
        if sparsifier not in SPARSIFIERS:
            raise DeepReduceError(f"sparsifier must be one of {SPARSIFIERS}, not {sparsifier!r}")
        if sparsifier in ("topk", "randomk"):
            sparsify.selection_size(1, ratio)  # validates the ratio
        if memory not in (None, "none", "residual"):
            raise DeepReduceError(f"memory must be None or 'residual', not {memory!r}")
        if not isinstance(min_size, int) or min_size < 0:
            raise DeepReduceError(f"min_size must be a non-negative int, not {min_size!r}")
        self.sparsifier, self.ratio, self.threshold = sparsifier, ratio, threshold
        self.codec = SparseCodec(index=index, value=value, arrangement=arrangement)
        self.memory = ResidualMemory() if memory == "residual" else None
        self.min_size, self.seed = min_size, seed
        self.stats = Stats()
        self._steps = {}

    def get_config(self):
        return {"sparsifier": self.sparsifier, "ratio": self.ratio, "threshold": self.threshold,
                **self.codec.get_config(), "memory": "residual" if self.memory else None,
                "min_size": self.min_size}

    def compresses(self, size, is_float):
        """Whether a tensor goes through the codec (else it is passed through unchanged)."""
        return is_float and size >= max(self.min_size, 1)

    def fingerprint(self, shape, dtype_name):
        text = json.dumps([list(shape), dtype_name, self.get_config()], sort_keys=True)
        return zlib.crc32(text.encode())

    def sparsify(self, name, dense):
        if self.sparsifier == "topk":
            return sparsify.topk(dense, self.ratio) + (None,)
        if self.sparsifier == "randomk":
            step = self._steps[name] = self._steps.get(name, -1) + 1
            seed = zlib.crc32(f"{name}:{step}".encode()) ^ self.seed
            return sparsify.randomk(dense, self.ratio, seed) + (seed,)
        if self.sparsifier == "threshold":
            return sparsify.threshold(dense, self.threshold) + (None,)
        flat = dense.ravel()
        return flat, np.arange(flat.size, dtype=np.int64), None

    def compress(self, name, dense):
        """dense numpy gradient -> framed payload bytes. The residual memory, if any, is
        keyed by name; tensors without a name (None) get no error feedback."""
        start = time.perf_counter()
        dtype_name = dense.dtype.name
        work = dense.astype(np.float32) if dtype_name == "bfloat16" else dense
        memory = self.memory if name is not None else None
        if memory is not None:
            work = memory.compensate(name, work.astype(np.float32, copy=False))
        values, indices, seed = self.sparsify(name, work)
        if dtype_name != values.dtype.name:
            values = values.astype(dense.dtype)
        if memory is None:
            payload = self.codec.encode(values, indices, dense.shape, dense=work, seed=seed)
        else:  # the residual is what receivers will not reconstruct from this payload
            payload, (v, i) = self.codec.encode(values, indices, dense.shape, dense=work,
                                                seed=seed, delivered=True)
            memory.update(name, work, densify(v.astype(np.float32), i, dense.shape))
        frame = (FRAME_MAGIC + self.fingerprint(dense.shape, dtype_name).to_bytes(4, "little")
                 + len(payload).to_bytes(4, "little") + payload)
        self.stats.encode_s += time.perf_counter() - start
        self.stats.bytes_sent += len(frame)
        self.stats.dense_bytes += 4 * dense.size
        self.stats.tensors_compressed += 1
        return frame

    def decompress(self, gathered, shape, dtype_name, ranks):
        """The concatenated frames of every rank (an allgather's output) -> their sum, dense
        float32, added in rank order so that every rank computes the same bits."""
        start = time.perf_counter()
        expected = self.fingerprint(shape, dtype_name)
        total = np.zeros(math.prod(shape), dtype=np.float32)
        view, at = memoryview(gathered).cast("B"), 0
        for rank in range(ranks):
            if len(view) - at < FRAME_HEADER or bytes(view[at:at + 4]) != FRAME_MAGIC:
                raise DeepReduceError(f"rank {rank} sent no DeepReduce frame (a rank without "
                                      "DeepReduce compression, or a corrupted buffer)")
            got = int.from_bytes(view[at + 4:at + 8], "little")
            length = int.from_bytes(view[at + 8:at + 12], "little")
            if got != expected:
                raise DeepReduceError(
                    f"rank {rank} sent a tensor with another shape, dtype or DeepReduce config "
                    f"(fingerprint {got:08x}, expected {expected:08x} for shape {tuple(shape)}, "
                    f"{dtype_name}); every rank must use the same compression and model")
            payload = view[at + FRAME_HEADER:at + FRAME_HEADER + length]
            if len(payload) != length:
                raise DeepReduceError(f"rank {rank}'s frame is truncated")
            values, indices, _ = decode(payload, max_elements=max(total.size, 1),
                                        expect_shape=tuple(shape))
            total[indices] += values.astype(np.float32)
            at += FRAME_HEADER + length
        if at != len(view):
            raise DeepReduceError(f"{len(view) - at} bytes left after {ranks} ranks' frames")
        self.stats.decode_s += time.perf_counter() - start
        return total.reshape(shape)

    def passed_through(self, size, itemsize):
        self.stats.tensors_passed_through += 1
        self.stats.bytes_sent += size * itemsize
        self.stats.dense_bytes += size * 4


class PipelineOwner:
    """What the framework wrappers share: a Pipeline built from their keyword arguments, and
    its stats.

    Arguments are those of `Pipeline`: sparsifier ("topk", "randomk", "threshold", "none"),
    ratio, threshold, index, value, arrangement, memory (None or "residual"), min_size
    (default 1000 elements), seed.
    """

    def __init__(self, **config):
        self.pipeline = Pipeline(**config)

    def stats(self):
        """bytes_sent, dense_bytes, ratio, tensors_compressed, tensors_passed_through,
        encode_s, decode_s (this rank, since the last reset)."""
        return self.pipeline.stats.as_dict()

    def reset_stats(self):
        self.pipeline.stats.reset()
