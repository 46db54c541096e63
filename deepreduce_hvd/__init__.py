"""deepreduce_hvd: sparse-gradient compression for Horovod (framework-neutral core).

    import deepreduce_hvd as dr
    codec = dr.SparseCodec(index="golomb", value="raw")
    payload = codec.encode(values, indices, shape)
    values, indices, shape = dr.decode(payload)
"""
from .codecs import index, value  # noqa: F401  (registers the codecs)
from .codecs.registry import codec_ids
from .codecs.sparse_codec import SparseCodec, decode, densify, describe
from .compression.memory import ResidualMemory
from .compression.pipeline import Pipeline
from .compression.sparsify import randomk, threshold, topk
from .engine.native import backend
from .errors import DeepReduceError

__all__ = ["SparseCodec", "decode", "densify", "describe", "Pipeline", "ResidualMemory", "DeepReduceError",
           "backend", "codec_ids", "topk", "randomk", "threshold"]
__version__ = "0.1.0"
