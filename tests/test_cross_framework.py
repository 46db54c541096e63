"""One wire format: PyTorch's and TensorFlow's paths produce and read the same bytes."""
import numpy as np
import pytest

import deepreduce_hvd as dr


@pytest.mark.torch
@pytest.mark.tensorflow
def test_same_payload_from_torch_and_tensorflow():
    import tensorflow as tf  # here, not at the top: the core-only run collects this file too
    import torch

    rng = np.random.default_rng(7)
    dense = rng.standard_normal((64, 48)).astype(np.float32)
    config = dict(ratio=0.05, index="entropy", value="qsgd")
    # the wrappers hand the core exactly what these conversions give; qsgd's rounding is
    # seeded so both sides draw the same random numbers
    config["value"] = {"id": "qsgd", "seed": 3}
    from_torch = dr.Pipeline(**config).compress("w", torch.from_numpy(dense).numpy())
    pipeline = dr.Pipeline(**config)
    from_tf = tf.numpy_function(lambda x: np.frombuffer(pipeline.compress("w", x), np.uint8),
                                [tf.constant(dense)], tf.uint8).numpy().tobytes()
    strip = lambda frame: frame[:13] + frame[21:]  # noqa: E731 - without the two timings
    assert strip(from_torch) == strip(from_tf)
    # and what one framework sent, the other decodes to the same sparse tensor
    got_tf, _ = dr.Pipeline(**config).decompress(from_torch, dense.shape, "float32", ranks=1)
    got_torch, _ = dr.Pipeline(**config).decompress(from_tf, dense.shape, "float32", ranks=1)
    np.testing.assert_array_equal(got_tf, got_torch)
    values, indices = dr.topk(dense, 0.05)
    assert np.count_nonzero(got_tf) <= indices.size
    assert set(np.flatnonzero(got_tf)) <= set(indices)
