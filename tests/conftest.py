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
