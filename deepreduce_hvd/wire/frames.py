"""Frames: what one rank puts into the allgather for one tensor.

    magic "DRF2" | fingerprint u32 | payload length u32 | kind u8 | encode us u32 |
    decode us u32 | payload

The fingerprint hashes (shape, dtype, pipeline config), so ranks that disagree fail loudly
instead of summing mismatched tensors. `kind` says what the payload is: a DeepReduce payload,
nothing (the gradient held NaN or Inf), or an error message (the rank could not encode: every
rank raises it, none waits forever). The two timings are the sender's measured encode time
for this tensor and its last decode time, so every rank sees every rank's costs and the
time-aware planner decides identically everywhere.
"""
import struct
from typing import NamedTuple

from ..errors import DeepReduceError
from .payload import byte_view

MAGIC = b"DRF2"
_HEAD = struct.Struct("<4sIIBII")
HEADER = _HEAD.size
PAYLOAD, NONFINITE, ERROR = 0, 1, 2
_MAX_US = 2**32 - 1


class Frame(NamedTuple):
    rank: int
    kind: int
    payload: memoryview
    encode_s: float
    decode_s: float


def write(fingerprint, kind, payload, encode_s=0.0, decode_s=0.0):
    us = lambda s: min(_MAX_US, max(0, int(round(s * 1e6))))  # noqa: E731
    return _HEAD.pack(MAGIC, fingerprint, len(payload), kind, us(encode_s), us(decode_s)) + payload


def read_one(view, at, rank, fingerprint, describe):
    """(rank's frame starting at byte `at` of `view`, the offset after it), checked against
    the fingerprint (`describe` says what was expected, for the error message)."""
    if len(view) - at < HEADER or bytes(view[at:at + 4]) != MAGIC:
        raise DeepReduceError(f"rank {rank} sent no DeepReduce frame (a rank without "
                              "DeepReduce compression, or a corrupted buffer)")
    _, got, length, kind, enc, dec = _HEAD.unpack_from(view, at)
    if got != fingerprint:
        raise DeepReduceError(
            f"rank {rank} sent a tensor with another shape, dtype or DeepReduce config "
            f"(fingerprint {got:08x}, expected {fingerprint:08x} for {describe}); every rank "
            "must use the same compression and model")
    payload = view[at + HEADER:at + HEADER + length]
    if len(payload) != length or kind not in (PAYLOAD, NONFINITE, ERROR):
        raise DeepReduceError(f"rank {rank}'s frame is truncated or malformed")
    return Frame(rank, kind, payload, enc / 1e6, dec / 1e6), at + HEADER + length


def read_all(gathered, ranks, fingerprint, describe):
    """The frames of every rank in an allgather's output, checked against the fingerprint."""
    view = byte_view(gathered)
    at, frames = 0, []
    for rank in range(ranks):
        frame, at = read_one(view, at, rank, fingerprint, describe)
        frames.append(frame)
    if at != len(view):
        raise DeepReduceError(f"{len(view) - at} bytes left after {ranks} ranks' frames")
    return frames
