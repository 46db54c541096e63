"""The public API is typed (PEP 561): every parameter and return of what users call is
annotated, the annotations resolve, and py.typed ships with the package."""
import inspect
import tomllib
import typing
from pathlib import Path

import deepreduce_hvd as dr

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = [dr.decode, dr.describe, dr.densify, dr.topk, dr.randomk, dr.threshold,
          dr.SparseCodec.__init__, dr.SparseCodec.encode, dr.SparseCodec.encode_full,
          dr.SparseCodec.get_config, dr.SparseCodec.from_config,
          dr.Pipeline.__init__, dr.Pipeline.compress, dr.Pipeline.decompress,
          dr.Pipeline.compress_dense, dr.Pipeline.get_config]


def _unannotated(function):
    signature = inspect.signature(function)
    missing = [name for name, parameter in signature.parameters.items()
               if name not in ("self", "cls") and parameter.annotation is inspect.Parameter.empty]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_every_public_function_is_annotated_and_resolves():
    for function in PUBLIC:
        assert _unannotated(function) == [], function.__qualname__
        typing.get_type_hints(function)  # raises if an annotation does not resolve


def test_wrapper_base_is_annotated():
    from deepreduce_hvd.comm.base import DeepReduceBase
    from deepreduce_hvd.comm.config import Options
    for function in (DeepReduceBase.__init__, DeepReduceBase.stats, DeepReduceBase.reset_stats,
                     DeepReduceBase.state_dict, DeepReduceBase.load_state_dict, Options.__init__):
        assert _unannotated(function) == [], function.__qualname__
        typing.get_type_hints(function)


def test_py_typed_ships_with_the_package():
    assert (Path(dr.__file__).parent / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["deepreduce_hvd"]


def test_bad_wrapper_options_raise_deepreduce_error():
    import pytest
    from deepreduce_hvd.comm.config import Options
    for bad in (dict(hierarchy=True), dict(objective="speed"), dict(ratio=0), dict(warmup_steps=-1),
                dict(bandwidth="fast"), dict(index="nope"), dict(device_path="gpu"),
                dict(hierarchical="yes")):
        with pytest.raises(dr.DeepReduceError):
            Options(**bad)
