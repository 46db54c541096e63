"""The TensorFlow wrapper's device path (TF ops in the graph) sends the bytes the numpy path
sends, keeps the same residual, and hands only the selected values to the numpy encoder."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import deepreduce_hvd as dr  # noqa: E402
from deepreduce_hvd.adapters.tf_device import DevicePath  # noqa: E402

pytestmark = pytest.mark.tensorflow


def strip(frame):
    return bytes(frame[:13]) + bytes(frame[21:])  # without the two timings


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("config", [dict(sparsifier="topk", ratio=0.01),
                                    dict(sparsifier="topk", ratio=0.2, index="entropy", value="entropy"),
                                    dict(sparsifier="threshold", threshold=0.5, index="golomb", value="fp16"),
                                    dict(sparsifier="topk", ratio=0.05, memory=None),
                                    dict(sparsifier="topk", ratio=0.01, warmup_steps=3)])
def test_same_bytes_and_residual_as_the_host_path(config, traced):
    config = {"index": "golomb", "value": "raw", **config}
    host, in_graph = dr.Pipeline(**config), dr.Pipeline(**config)
    path = DevicePath(in_graph)
    seen = []

    def choose(size):
        seen.append(size)
        return None, None

    def step(grad):
        return path.compress("w", grad, choose)

    run = tf.function(step) if traced else step
    rng = np.random.default_rng(0)
    for i in range(4):
        grad = (rng.standard_normal((256, 300)) * (1 + i)).astype(np.float32)
        grad[0, :7] = grad[0, 7]  # ties: broken by position on both paths
        assert strip(run(tf.constant(grad)).numpy()) == strip(host.compress("w", grad))
    if config.get("memory", "residual"):
        np.testing.assert_array_equal(in_graph.memory.residual("w").numpy(), host.memory.residual("w"))


@pytest.mark.parametrize("half", [False, True])
def test_dense_tensor_matches_the_host_path(half):
    host, in_graph = dr.Pipeline(), dr.Pipeline()
    path, rng = DevicePath(in_graph), np.random.default_rng(1)
    for _ in range(3):
        grad = rng.standard_normal(500).astype(np.float32)
        sent = path.compress_dense("b", tf.constant(grad), half).numpy()
        np.testing.assert_array_equal(sent, host.compress_dense("b", grad, half))
    np.testing.assert_array_equal(in_graph.memory.residual("b").numpy(), host.memory.residual("b"))
