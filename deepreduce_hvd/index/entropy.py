"""entropy: the smallest of several exact gap coders, chosen per tensor.

Candidates: Huffman-coded gap lengths with 0..3 modelled top bits (clustered top-k gaps), and
Golomb-Rice (uniform random subsets, tiny tensors where a table does not pay). One mode byte
says which won.
"""
from ..codec_base import IndexCodec
from ..errors import DeepReduceError
from ..registry import register
from ..wire import ByteReader
from .gaps import from_gaps, to_gaps
from .golomb import decode_rice, encode_rice
from .huffman import MAX_EXTRA_BITS, decode_gaps, encode_gaps

_HUFFMAN, _RICE = 0, 1


@register("index")
class EntropyIndex(IndexCodec):
    codec_id = "entropy"
    wire_id = 10

    def encode(self, indices, size, dense=None, seed=None):
        gaps = to_gaps(indices)
        candidates = [bytes([_RICE]) + encode_rice(gaps)]
        candidates += [bytes([_HUFFMAN]) + encode_gaps(gaps, e) for e in range(MAX_EXTRA_BITS + 1)]
        return min(candidates, key=len), indices

    def decode(self, body, size, count):
        reader = ByteReader(body, "entropy indices")
        mode = reader.u8()
        if mode == _HUFFMAN:
            return from_gaps(decode_gaps(reader, count), size)
        if mode != _RICE:
            raise DeepReduceError(f"entropy: unknown mode {mode}")
        return from_gaps(decode_rice(reader, count, size), size)
