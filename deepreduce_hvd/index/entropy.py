"""entropy: the smallest of several exact index coders, chosen per tensor.

Candidates, each best somewhere on real gradients:
- Huffman-coded gap lengths with 0..3 modelled top bits (clustered gaps, small tensors);
- Golomb-Rice (uniform random subsets; tiny tensors where a table does not pay);
- LZMA over fixed-width gaps, and LZMA over the selection bitmap (2-D weight gradients, whose
  rows repeat each other's column patterns: a context model finds what a gap model cannot).
One mode byte says which won.
"""
import numpy as np

from ..bits import bit_length, pack_bits, unpack_bits
from ..codec_base import IndexCodec
from ..errors import DeepReduceError
from ..registry import register
from ..streams import lzma_pack, lzma_unpack
from ..wire import ByteReader
from .gaps import check_gap_width, from_gaps, gap_bytes, to_gaps
from .golomb import decode_rice, encode_rice, rice_parameter
from .huffman import MAX_EXTRA_BITS, GapPlan, decode_gaps

_HUFFMAN, _RICE, _LZMA_GAPS, _LZMA_BITMAP = 0, 1, 2, 3
BITMAP_MAX_SPARSITY = 1024  # try the bitmap candidate when size <= 1024 * count


@register("index")
class EntropyIndex(IndexCodec):
    codec_id = "entropy"
    wire_id = 10

    def encode(self, indices, size, dense=None, seed=None):
        """Exact sizes decide: the gap coders' sizes follow from their code lengths, so only
        the winner is written out; the LZMA candidates are compressed for real."""
        gaps = to_gaps(indices)
        r, rice_bytes = rice_parameter(gaps)
        best = (1 + rice_bytes, lambda: bytes([_RICE]) + encode_rice(gaps, r))
        length = bit_length(gaps + np.uint64(1))
        for extra in range(MAX_EXTRA_BITS + 1):
            plan = GapPlan(gaps, extra, length)
            if 1 + plan.nbytes < best[0]:
                best = (1 + plan.nbytes, lambda plan=plan: bytes([_HUFFMAN]) + plan.encode())
        width, data = gap_bytes(gaps)
        lzma_bodies = [bytes([_LZMA_GAPS, width]) + lzma_pack(data)]
        if indices.size and size <= BITMAP_MAX_SPARSITY * indices.size:
            bitmap = np.zeros(size, dtype=np.uint8)
            bitmap[indices] = 1
            lzma_bodies.append(bytes([_LZMA_BITMAP]) + lzma_pack(pack_bits(bitmap)))
        smallest = min(lzma_bodies, key=len)
        return (smallest if len(smallest) < best[0] else best[1]()), indices

    def decode(self, body, size, count):
        reader = ByteReader(body, "entropy indices")
        mode = reader.u8()
        if mode == _HUFFMAN:
            return from_gaps(decode_gaps(reader, count), size)
        if mode == _RICE:
            return from_gaps(decode_rice(reader, count, size), size)
        if mode == _LZMA_GAPS:
            width = check_gap_width(reader.u8())
            raw = lzma_unpack(reader.rest(), count * width)
            return from_gaps(np.frombuffer(raw, dtype=f"<u{width}"), size)
        if mode == _LZMA_BITMAP:
            if size > BITMAP_MAX_SPARSITY * count:
                raise DeepReduceError("entropy: bitmap mode for a sparser tensor than allowed")
            bits = unpack_bits(lzma_unpack(reader.rest(), (size + 7) // 8), size)
            return np.flatnonzero(bits).astype(np.int64)
        raise DeepReduceError(f"entropy: unknown mode {mode}")
