"""The hierarchical mode on 2 hosts x 2 ranks (horovodrun -H localhost:2,127.0.0.1:2: Horovod
sees two hosts), in PyTorch or TensorFlow (DEEPREDUCE_FRAMEWORK=torch|tf); run by
tests/test_hierarchical.py. With DEEPREDUCE_STATIC_SETS=1 Horovod runs without dynamic
process sets, which the mode needs: `refused_without_dynamic_process_sets` runs so.
"""
import os

import numpy as np

import deepreduce_hvd as dr
import harness
from shims import shim_for

FRAMEWORK = os.environ.get("DEEPREDUCE_FRAMEWORK", "torch")
STATIC = os.environ.get("DEEPREDUCE_STATIC_SETS") == "1"
shim = shim_for(FRAMEWORK, dynamic=not STATIC)
hvd = shim.hvd
harness.bind(hvd)
rank, size = hvd.rank(), hvd.size()
assert (size, hvd.local_size(), hvd.cross_size()) == (4, 2, 2), (size, hvd.local_size())
LEADER = rank in (0, 2)


def check_lossless_sum_is_exact():
    """Integer-valued gradients: the host sums, the leaders' exchange and the broadcast add
    up exactly to the dense sum and average."""
    assert not STATIC, "needs dynamic process sets"
    compression = shim.DeepReduce(sparsifier="none", index="golomb", value="raw",
                                  hierarchical=True, objective="bytes")
    for step in range(3):
        grad = (np.arange(3000) % 17 + rank * 100 + step).astype(np.float32)
        want = sum((np.arange(3000) % 17 + r * 100 + step).astype(np.float32) for r in range(size))
        np.testing.assert_array_equal(shim.allreduce(grad, "exact", compression, op_sum=True), want)
        np.testing.assert_array_equal(shim.allreduce(grad, "exact.avg", compression), want / size)
    stats = compression.stats()
    assert (stats["tensors_compressed"] > 0) == LEADER, stats  # only leaders send payloads


def check_error_feedback_conserves_the_sum():
    """Top-k of each host's sum with residual memory: what every rank received over the steps
    plus the leaders' residuals is the sum of every rank's gradients."""
    compression = shim.DeepReduce(ratio=0.02, index="golomb", value="raw", hierarchical=True,
                                  objective="bytes")
    generator = np.random.default_rng(rank)
    received = np.zeros(5000, np.float32)
    sent = np.zeros(5000, np.float32)
    for _ in range(5):
        grad = generator.standard_normal(5000).astype(np.float32)
        sent += grad
        received += shim.allreduce(grad, "ef", compression, op_sum=True)
    harness.same_within(received, "received")
    residual = compression.pipeline.memory.residual("ef")
    assert (residual is not None) == LEADER
    leftover = np.zeros(5000, np.float32) if residual is None else np.array(residual)
    total_sent = shim.allreduce(sent, "ef.sent", None, op_sum=True)
    total_left = shim.allreduce(leftover, "ef.left", None, op_sum=True)
    np.testing.assert_allclose(received + total_left, total_sent, rtol=1e-4, atol=1e-4)
    assert float(np.abs(total_left).sum()) > 0


def check_training_keeps_parameters_identical():
    params = shim.train(shim.DeepReduce(ratio=0.05, hierarchical=True, bandwidth="1gbit"))
    harness.same_within(params, "parameters")


def check_refused_without_dynamic_process_sets():
    assert STATIC, "run with DEEPREDUCE_STATIC_SETS=1"
    try:
        shim.allreduce(np.ones(2000, np.float32), "x",
                       shim.DeepReduce(hierarchical=True, objective="bytes"))
    except Exception as exc:  # noqa: BLE001 - eagerly DeepReduceError, in a graph an OpError naming it
        assert "HOROVOD_DYNAMIC_PROCESS_SETS" in str(exc), exc
        assert isinstance(exc, dr.DeepReduceError) or FRAMEWORK == "tf", exc
        return
    raise AssertionError("no DeepReduceError")


if __name__ == "__main__":
    harness.main(globals())
