import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

# the job scripts and their helpers (torch/ has no __init__.py: it must not shadow torch)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "torch"))

settings.register_profile("ci", max_examples=60, deadline=None)
settings.load_profile("ci")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def on_both_engines(decode):
    """decode() with the C++ engine, then with the numpy path -> (native, numpy) results,
    each None where that path raised DeepReduceError (skips without the engine)."""
    import deepreduce_hvd as dr
    from deepreduce_hvd.engine import native
    if native.engine is None:
        pytest.skip("C++ engine not built")
    engine, results = native.engine, []
    for current in (engine, None):
        native.engine = current
        try:
            results.append(decode())
        except dr.DeepReduceError:
            results.append(None)
        finally:
            native.engine = engine
    return results


def damage(data, body):
    """A body as a hostile sender might leave it: intact, a byte changed, cut short or
    lengthened (the choice drawn by hypothesis' data)."""
    from hypothesis import strategies as st
    kind = data.draw(st.sampled_from(["intact", "byte", "cut", "longer"]))
    if kind == "intact" or not body:
        return body
    at = data.draw(st.integers(0, len(body) - 1))
    if kind == "byte":
        return body[:at] + bytes([data.draw(st.integers(0, 255))]) + body[at + 1:]
    return body[:at] if kind == "cut" else body + bytes([data.draw(st.integers(0, 255))])
