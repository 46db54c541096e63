"""The torch wrapper's hierarchical mode on 2 hosts x 2 ranks (horovodrun -H
localhost:2,127.0.0.1:2: Horovod sees two hosts); run by tests/test_torch_horovod.py.

Every rank prints "RESULT <check> ok" when a check passes; argv[1] "refused" runs without
dynamic process sets and expects every rank to get DeepReduceError.
"""
import sys

import horovod.torch as hvd
import numpy as np
import torch

import deepreduce_hvd as dr
from deepreduce_hvd.torch import DeepReduce, named

refused = sys.argv[1:] == ["refused"]
hvd.init(process_sets=None if refused else "dynamic")
rank, size = hvd.rank(), hvd.size()
assert (size, hvd.local_size(), hvd.cross_size()) == (4, 2, 2), (size, hvd.local_size())


def ok(check):
    print(f"RESULT {check} ok", flush=True)


def same_on_every_rank(array):
    for other in hvd.allgather_object(array):
        np.testing.assert_array_equal(array, other)


def check_lossless_sum_is_exact():
    """Integer-valued gradients: the host sums, the leaders' exchange and the broadcast add
    up exactly to the dense sum and average."""
    compression = DeepReduce(sparsifier="none", index="golomb", value="raw", hierarchical=True,
                             objective="bytes")
    for step in range(3):
        grad = torch.arange(3000, dtype=torch.float32) % 17 + rank * 100 + step
        want = sum(torch.arange(3000, dtype=torch.float32) % 17 + r * 100 + step for r in range(size))
        got = hvd.allreduce(named(grad.clone(), "exact"), op=hvd.Sum, name="exact",
                            compression=compression)
        assert torch.equal(got, want), (got[:5], want[:5])
        average = hvd.allreduce(named(grad.clone(), "exact.avg"), name="exact.avg",
                                compression=compression)
        assert torch.equal(average, want / size)
    stats = compression.stats()
    leader = rank in (0, 2)
    assert (stats["tensors_compressed"] > 0) == leader, stats  # only leaders send payloads
    ok("lossless_sum_is_exact")


def check_error_feedback_conserves_the_sum():
    """Top-k of each host's sum with residual memory: what every rank received over the steps
    plus the leaders' residuals is the sum of every rank's gradients."""
    compression = DeepReduce(ratio=0.02, index="golomb", value="raw", hierarchical=True,
                             objective="bytes")
    generator = torch.Generator().manual_seed(rank)
    received = torch.zeros(5000)
    sent = torch.zeros(5000)
    for step in range(5):
        grad = torch.randn(5000, generator=generator)
        sent += grad
        received += hvd.allreduce(named(grad.clone(), "ef"), op=hvd.Sum, name="ef",
                                  compression=compression)
    same_on_every_rank(received.numpy())
    residual = compression.pipeline.memory.residual("ef")
    leftover = torch.from_numpy(np.zeros(5000, np.float32) if residual is None else residual.copy())
    assert (residual is not None) == (rank in (0, 2))
    total_sent = hvd.allreduce(sent, op=hvd.Sum, name="ef.sent")
    total_left = hvd.allreduce(leftover, op=hvd.Sum, name="ef.left")
    torch.testing.assert_close(received + total_left, total_sent, rtol=1e-4, atol=1e-4)
    assert float(total_left.abs().sum()) > 0
    ok("error_feedback_conserves_the_sum")


def check_training_keeps_parameters_identical():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    compression = DeepReduce(ratio=0.05, hierarchical=True, bandwidth="1gbit")
    compression.name_parameters(model.named_parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(8):
        x, y = torch.randn(16, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    same_on_every_rank(torch.cat([p.detach().flatten() for p in model.parameters()]).numpy())
    ok("training_keeps_parameters_identical")


def check_refused_without_dynamic_process_sets():
    try:
        hvd.allreduce(named(torch.randn(2000), "x"), name="x",
                      compression=DeepReduce(hierarchical=True, objective="bytes"))
    except dr.DeepReduceError as exc:
        assert "HOROVOD_DYNAMIC_PROCESS_SETS" in str(exc)
        ok("refused_without_dynamic_process_sets")
        return
    raise AssertionError("no DeepReduceError")


if refused:
    check_refused_without_dynamic_process_sets()
else:
    check_lossless_sum_is_exact()
    check_error_feedback_conserves_the_sum()
    check_training_keeps_parameters_identical()
