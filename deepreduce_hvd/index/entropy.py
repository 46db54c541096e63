"""entropy: the smallest of several exact index coders, chosen per tensor.

Candidates, each best somewhere on real gradients:
- Huffman-coded gap lengths with 0..3 modelled top bits (clustered gaps, small tensors);
- Golomb-Rice (uniform random subsets; tiny tensors where a table does not pay);
- LZMA over fixed-width gaps, and LZMA over the selection bitmap (2-D weight gradients, whose
  rows repeat each other's column patterns: a context model finds what a gap model cannot).
One mode byte says which won.
"""
import numpy as np

from ..bits import pack_bits, unpack_bits
from ..codec_base import IndexCodec
from ..errors import DeepReduceError
from ..registry import register
from ..streams import lzma_pack, lzma_unpack
from ..wire import ByteReader
from .gaps import check_gap_width, from_gaps, gap_bytes, to_gaps
from .golomb import decode_rice, encode_rice
from .huffman import MAX_EXTRA_BITS, decode_gaps, encode_gaps

_HUFFMAN, _RICE, _LZMA_GAPS, _LZMA_BITMAP = 0, 1, 2, 3
BITMAP_MAX_SPARSITY = 1024  # try the bitmap candidate when size <= 1024 * count


@register("index")
class EntropyIndex(IndexCodec):
    codec_id = "entropy"
    wire_id = 10

    def encode(self, indices, size, dense=None, seed=None):
        gaps = to_gaps(indices)
        width, data = gap_bytes(gaps)
        candidates = [bytes([_RICE]) + encode_rice(gaps),
                      bytes([_LZMA_GAPS, width]) + lzma_pack(data)]
        candidates += [bytes([_HUFFMAN]) + encode_gaps(gaps, e) for e in range(MAX_EXTRA_BITS + 1)]
        if indices.size and size <= BITMAP_MAX_SPARSITY * indices.size:
            bitmap = np.zeros(size, dtype=np.uint8)
            bitmap[indices] = 1
            candidates.append(bytes([_LZMA_BITMAP]) + lzma_pack(pack_bits(bitmap)))
        return min(candidates, key=len), indices

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
