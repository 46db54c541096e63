"""entropy: the smallest of several exact index coders, chosen per tensor by exact sizes.

Candidates, each best somewhere on real gradients:
- Huffman-coded gap lengths with 0..3 modelled top bits (clustered gaps, small tensors);
- Golomb-Rice (uniform random subsets; tiny tensors where a table does not pay);
- the matrix model (matrix.py), rows or columns ranked: 2-D weight gradients, whose rows
  select mostly the same columns (it replaced LZMA over the bitmap: fewer bits, O(k log k)).
One mode byte (and for the matrix model an orientation byte) says which won.
"""
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader
from ..base import IndexCodec, IndexEncoding
from ..registry import register
from . import golomb, huffman, matrix
from .gaps import to_gaps

_HUFFMAN, _RICE, _MATRIX = 0, 1, 2


@register("index")
class EntropyIndex(IndexCodec):
    codec_id = "entropy"
    wire_id = 10

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        """Every candidate's size follows from its code lengths before anything is packed, so
        only the winner is written out."""
        gaps = to_gaps(indices)
        r, rice_bytes = golomb.rice_parameter(gaps)
        stats = huffman.GapStats(gaps)
        plan_bytes, extra = stats.smallest()
        nbytes = 1 + min(plan_bytes, rice_bytes)  # the mode byte, and the smaller gap code
        dims = matrix.grid(shape, size)
        if dims and indices.size >= matrix.MIN_COUNT:
            sizes = matrix.sizes(indices, *dims)
            transpose = min((0, 1), key=lambda t: sizes[t][0])
            if sizes[transpose][0] + 2 < nbytes:
                plan = matrix.MatrixPlan(indices, *dims, transpose, sizes[transpose][1])
                return IndexEncoding(bytes([_MATRIX, transpose]) + plan.body(),
                                     indices[plan.order], plan.order)
        if plan_bytes < rice_bytes:
            return IndexEncoding(bytes([_HUFFMAN]) + stats.encode(extra), indices)
        return IndexEncoding(bytes([_RICE]) + golomb.encode_rice(gaps, r), indices)

    def max_count(self, body, size):
        return 8 * len(body)  # every position costs at least one bit

    def decode(self, body, size, count, shape=None):
        reader = ByteReader(body, "entropy indices")
        mode = reader.u8()
        if mode == _HUFFMAN:
            return huffman.decode_positions(reader.rest(), count, size)
        if mode == _RICE:
            return golomb.decode_positions(reader.rest(), count, size)
        if mode == _MATRIX:
            transpose = reader.u8()
            dims = matrix.grid(shape, size)
            if transpose > 1 or dims is None:
                raise DeepReduceError("entropy: matrix mode for a tensor that is not 2-D")
            return matrix.decode(reader.rest(), count, *dims, transpose)
        raise DeepReduceError(f"entropy: unknown mode {mode}")
