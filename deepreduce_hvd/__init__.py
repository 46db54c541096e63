"""deepreduce_hvd: sparse-gradient compression for Horovod (framework-neutral core).

    import deepreduce_hvd as dr
    codec = dr.SparseCodec(index="golomb", value="raw")
    payload = codec.encode(values, indices, shape)
    values, indices, shape = dr.decode(payload)
"""
from . import index, value  # noqa: F401  (registers the codecs)
from .codec import SparseCodec, decode, densify, describe
from .compressor import Pipeline
from .errors import DeepReduceError
from .memory import ResidualMemory
from .native import backend
from .registry import codec_ids
from .sparsify import randomk, threshold, topk

__all__ = ["SparseCodec", "decode", "densify", "describe", "Pipeline", "ResidualMemory", "DeepReduceError",
           "backend", "codec_ids", "topk", "randomk", "threshold"]
__version__ = "0.1.0"
