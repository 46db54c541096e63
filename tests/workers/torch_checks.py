"""Checks of deepreduce_hvd.torch on real Horovod ranks; run by tests/test_torch_horovod.py.

Checks are the check_* functions (tests/workers/harness.py records each rank's outcome).
"""
import time

import horovod.torch as hvd
import numpy as np
import torch

import deepreduce_hvd as dr
import harness
from deepreduce_hvd.torch import DeepReduce, named

hvd.init()
harness.bind(hvd)
torch.manual_seed(1234 + hvd.rank())  # different gradients on each rank
rank, size = hvd.rank(), hvd.size()


def gathered_sparse(local_dense, ratio, index=None):
    """Average over ranks of each rank's own top-k sparse tensor, computed locally (for Bloom,
    the tensor its own payload decodes to: the top-k plus false positives' true values)."""
    dense = local_dense.numpy()
    values, indices = dr.topk(dense, ratio)
    if index is not None:
        payload = dr.SparseCodec(index=index).encode(values, indices, dense.shape, dense=dense)
        values, indices, _ = dr.decode(payload)
    mine = dr.densify(values, indices, local_dense.shape)
    return np.mean(hvd.allgather_object(mine), axis=0)


def check_lossless_equals_dense():
    for op in (hvd.Average, hvd.Sum):
        for config in (dict(sparsifier="none", index="entropy", value="raw"),
                       dict(sparsifier="topk", ratio=1.0, index="bitmap", value="deflate")):
            t = torch.randn(64, 50)
            got = hvd.allreduce(t, name=f"lossless.{op}.{config['index']}", op=op,
                                compression=DeepReduce(**config))
            want = hvd.allreduce(t, name=f"dense.{op}.{config['index']}", op=op)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def check_topk_equals_local_average():
    for index, value in (("entropy", "raw"), ("bloom", "raw"), ("golomb", "deflate")):
        t = torch.randn(100, 80)
        got = hvd.allreduce(t, name=f"topk.{index}", compression=DeepReduce(
            ratio=0.05, index=index, value=value, adaptive_density=False))  # exactly top-5%
        want = gathered_sparse(t, 0.05, index="bloom" if index == "bloom" else None)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
        for other in hvd.allgather_object(got.numpy())[1:]:  # the same bits on every rank
            np.testing.assert_array_equal(got.numpy(), other)
        if index == "bloom":
            assert np.count_nonzero(want) > np.count_nonzero(gathered_sparse(t, 0.05))


def check_local_clipping_bounds_each_ranks_gradient():
    """DeepReduce(local_clip_norm=c) through real Horovod: the delivered average is the
    average of each rank's gradient clipped to norm c (exactly, with lossless codecs)."""
    t = torch.randn(100, 80) * (rank + 1)
    got = hvd.allreduce(t, name="clipped", compression=DeepReduce(
        sparsifier="none", index="entropy", value="raw", local_clip_norm=3.0))
    clipped = [g * min(1.0, 3.0 / np.linalg.norm(g)) for g in hvd.allgather_object(t.numpy())]
    np.testing.assert_allclose(got.numpy(), np.mean(clipped, axis=0), rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(got.numpy()) <= 3.0 + 1e-4


def check_energy_share_counts_differ_by_rank():
    """DeepReduce(energy=0.7) through real Horovod: a rank with a flat gradient sends more
    than the 2% count (up to 4x), one with a spiky gradient sends the count; every rank
    receives the average of what each kept (its largest elements), the same bits everywhere."""
    gen = np.random.default_rng(rank)
    g = gen.standard_normal(5000).astype(np.float32)
    if rank % 2:
        g[gen.choice(g.size, 100, replace=False)] = 60.0
    got = hvd.allreduce(named(torch.from_numpy(g), "energy"), name="energy", compression=DeepReduce(
        ratio=0.02, index="entropy", value="raw", energy=0.7, adaptive_density=False))
    kept = []
    for other in hvd.allgather_object(g):
        energy = np.sort(other.astype(np.float64) ** 2)[::-1]
        count = min(max(100, int(np.searchsorted(np.cumsum(energy), 0.7 * energy.sum())) + 1), 400)
        sparse = np.zeros_like(other)
        largest = np.argsort(-np.abs(other), kind="stable")[:count]
        sparse[largest] = other[largest]
        kept.append(sparse)
    np.testing.assert_allclose(got.numpy(), np.mean(kept, axis=0), rtol=1e-6, atol=1e-7)
    assert {np.count_nonzero(k) for k in kept} == ({400} if hvd.size() == 1 else {100, 400})
    for other in hvd.allgather_object(got.numpy())[1:]:
        np.testing.assert_array_equal(got.numpy(), other)


def check_passthrough():
    compression = DeepReduce(ratio=0.01, index="entropy", value="raw")
    small = torch.randn(10)
    ints = torch.arange(5000, dtype=torch.int64) * (rank + 1)
    torch.testing.assert_close(hvd.allreduce(small, name="small", compression=compression),
                               hvd.allreduce(small, name="small.dense"))
    torch.testing.assert_close(hvd.allreduce(ints, name="ints", op=hvd.Sum, compression=compression),
                               hvd.allreduce(ints, name="ints.dense", op=hvd.Sum))
    stats = compression.stats()
    assert stats["tensors_passed_through"] == 2 and stats["tensors_compressed"] == 0, stats


def make_model():
    torch.manual_seed(0)  # same initial weights everywhere
    return torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 3))


def train(model, compression, steps=4, **kwargs):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, **kwargs)
    passes = kwargs.get("backward_passes_per_step", 1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(passes):
            x = torch.randn(16, 40, generator=gen)
            model(x).pow(2).mean().backward()
        opt.step()
    return opt


def assert_same_everywhere(model):
    harness.same_within({n: p.detach().numpy() for n, p in model.named_parameters()}, "parameters")


def check_optimizer_variants():
    variants = [dict(), dict(backward_passes_per_step=2), dict(op=hvd.Sum),
                dict(gradient_predivide_factor=2.0), dict(groups=2)]
    for kwargs in variants:
        model = make_model()
        compression = DeepReduce(ratio=0.1, index="entropy", value="qsgd", memory="residual",
                                 min_size=100)
        train(model, compression, **kwargs)
        assert_same_everywhere(model)
        stats = compression.stats()
        assert stats["tensors_compressed"] > 0 and stats["bytes_sent"] < stats["dense_bytes"], stats
        big = {n for n, p in model.named_parameters() if p.numel() >= 100}
        assert compression.pipeline.memory.names() == big, sorted(compression.pipeline.memory.names())


def check_optimizer_matches_dense():
    """One SGD step with lossless ratio=1 compression equals a dense Horovod step."""
    dense_model, dr_model = make_model(), make_model()
    train(dense_model, hvd.Compression.none, steps=2)
    train(dr_model, DeepReduce(sparsifier="none", index="entropy", value="raw", min_size=100),
          steps=2)
    for (n, a), (_, b) in zip(dense_model.named_parameters(), dr_model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def check_hook_order_independent():
    """Reduce same-shaped parameters in a different order on each rank: names must agree."""
    model = torch.nn.Sequential(torch.nn.Linear(50, 50), torch.nn.Linear(50, 50))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=DeepReduce(sparsifier="none", index="entropy",
                                                          value="raw", min_size=100))
    for p in model.parameters():
        p.grad = torch.full_like(p, float(rank + 1)) * (1 + p.numel() % 7)
    params = [p for p in model.parameters() if p.dim() == 2]
    expected = [hvd.allreduce(p.grad, name=f"expect.{i}") for i, p in enumerate(params)]
    for p in (params if rank == 0 else params[::-1]):
        opt._handles[p] = opt._allreduce_grad_async(p)
    opt.synchronize()
    for p, want in zip(params, expected):
        torch.testing.assert_close(p.grad, want)


def expect_error(fn, fragment):
    try:
        fn()
    except dr.DeepReduceError as exc:
        assert fragment in str(exc), str(exc)
        return
    raise AssertionError(f"no DeepReduceError ({fragment})")


def check_mismatches():
    t = torch.randn(40, 40)
    other = DeepReduce(ratio=0.05, index="golomb" if rank else "entropy", value="raw")
    expect_error(lambda: hvd.allreduce(t, name="mismatch.config", compression=other), "config")
    shaped = torch.randn(40, 40) if rank == 0 else torch.randn(80, 20)
    expect_error(lambda: hvd.allreduce(shaped, name="mismatch.shape",
                                       compression=DeepReduce(ratio=0.05, index="entropy",
                                                              value="raw")), "shape")
    corrupt = DeepReduce(ratio=0.05, index="entropy", value="raw")
    if rank == 1:
        real = corrupt.pipeline.compress
        corrupt.pipeline.compress = lambda *args: real(*args)[:-3] + b"xyz"
    expect_error(lambda: hvd.allreduce(t, name="mismatch.corrupt", compression=corrupt),
                 "checksum")


def check_device_path():
    """Compensation and selection as torch ops (device_path=True, here on CPU tensors) train
    to exactly the parameters the native host path gives. min_size=0 sends every tensor through
    DeepReduce: Horovod's own dense ring sum order depends on fusion timing at 4 ranks."""
    results = []
    for device_path in (True, False):
        model = make_model()
        train(model, DeepReduce(ratio=0.1, index="entropy", value="entropy", min_size=0,
                                device_path=device_path), steps=4)
        results.append([p.detach().numpy().copy() for p in model.parameters()])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def time_aware_steps(model, bandwidth, steps, record, **options):
    """The default DeepReduce (with these options) at a declared bandwidth for `steps` SGD
    steps of `model` -> (the compression, record(its stats) after each step); the records
    and the parameters are checked identical on every rank."""
    compression = DeepReduce(bandwidth=bandwidth, **options).name_parameters(
        model.named_parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    gen, history = torch.Generator().manual_seed(rank), []
    for _ in range(steps):
        compression.reset_stats()
        opt.zero_grad()
        model(torch.randn(16, 64, generator=gen)).pow(2).mean().backward()
        opt.step()
        history.append(record(compression.stats()))
    for other in hvd.allgather_object(history)[1:]:
        assert other == history, (history, other)
    assert_same_everywhere(model)
    return compression, history


def check_time_aware():
    """The default DeepReduce decides per tensor and step by predicted time: every rank makes
    the same choice at every step (exploration included), parameters stay identical, big
    tensors go sparse on a slow link and everything goes dense on a fast one."""
    for bandwidth, sparse_expected in (("10mbit", True), ("100gbit", False)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 4))
        _, history = time_aware_steps(model, bandwidth, 20, lambda stats: {
            n: t["choice"] for n, t in stats["tensors"].items()})
        chosen = {c for step in history for c in step.values()}
        assert any("+" in c for c in chosen) == sparse_expected, (bandwidth, chosen)


def check_lowrank_route():
    """At 10 Mbit/s the default sends its matrices as low-rank factors (the 4 x 256 one, whose
    factors would not save 8x, sparse): every rank makes the same choices and holds the same
    parameters; a sum of rank-1 gradients arrives exactly; and over steps of full-rank
    gradients what every rank's residual let go is what every rank received."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    compression, history = time_aware_steps(model, "10mbit", 12, lambda stats: (
        stats["tensors_lowrank"], {n: t["choice"] for n, t in stats["tensors"].items()}))
    assert all(lowrank == 2 for lowrank, _ in history), history
    assert history[-1][1]["0.weight"] == history[-1][1]["2.weight"] == "lowrank", history
    assert "+" in history[-1][1]["4.weight"], history
    u, v = torch.randn(96, generator=torch.Generator().manual_seed(5)), torch.randn(80)
    exact = DeepReduce(bandwidth="10mbit", lowrank=1)
    got = hvd.allreduce((rank + 1) * torch.outer(u, v), name="rank1", compression=exact)
    torch.testing.assert_close(got, (size + 1) / 2 * torch.outer(u, v), rtol=1e-4, atol=1e-4)
    assert exact.stats()["tensors_lowrank"] == 1, exact.stats()
    shifting = DeepReduce(bandwidth="10mbit", lowrank=2)
    entered = delivered = np.zeros(96 * 80)
    for _ in range(6):
        t = torch.randn(96, 80)
        entered = entered + t.numpy().reshape(-1)
        delivered = delivered + hvd.allreduce(t, name="full", op=hvd.Sum,
                                              compression=shifting).numpy().reshape(-1)
    assert shifting.stats()["tensors_lowrank"] == 6, shifting.stats()
    residual = shifting.comm.sets["global"].pipeline.memory.residual("full").reshape(-1)
    left = sum(hvd.allgather_object(residual.astype(np.float64)))
    entered = sum(hvd.allgather_object(entered))
    np.testing.assert_allclose(delivered + left, entered, rtol=1e-4, atol=1e-3)


def check_step_guard():
    """The step guard compares the plan with the sparse arm and Horovod's allreduce of every
    tensor (fp16, fp32) once the planner settled: in each arm's steps every tensor takes that
    arm's route, the comparison and its winner are the same on every rank, and the winner
    then runs. At a stated 100 kbit/s a dense arm's wire alone (seconds) outlasts the plan's
    step, even a step slowed by the other ranks on shared cores: the dense arms are not run;
    at 10 Gbit/s they are."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    compression, steps = time_aware_steps(model, "100kbit", 36, lambda stats: (
        stats["tensors_compressed"], stats["guard"]["global"]), lowrank=0)
    guard = steps[-1][1]
    start = compression.comm.sets["global"].policy.planner.settled_after + 1
    planned, sparse = steps[start - 1:start + 2], steps[start + 2:start + 5]
    assert all(compressed > 0 for compressed, _ in planned), steps  # the 100 kbit/s plan: sparse
    assert all(compressed == 2 for compressed, _ in sparse), steps  # both weights (>= min_size)
    assert set(guard["compared_ms"]) == {"planned", "sparse"}, guard
    moved = 2 * (hvd.size() - 1) / hvd.size() * sum(p.numel() for p in model.parameters())
    floors = guard["skipped_ms"]  # ms: elements moved * bytes each * 8 bits / 100 kbit/s
    assert set(floors) == {"allreduce", "allreduce_fp16"}, guard
    assert np.allclose([floors["allreduce"], floors["allreduce_fp16"]],
                       [1e3 * moved * 4 * 8 / 1e5, 1e3 * moved * 2 * 8 / 1e5], rtol=1e-3), guard
    after = steps[start + 10:]  # the sparse arm's two visits are one of 5 steps: P3 S5 P3
    assert all((compressed > 0) == (guard["winner"] in ("planned", "sparse"))
               for compressed, _ in after), (guard, steps)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    compression, steps = time_aware_steps(model, "10gbit", 48, lambda stats: (
        stats["tensors_compressed"], stats["guard"]["global"]), lowrank=0)
    guard = steps[-1][1]
    start = compression.comm.sets["global"].policy.planner.settled_after + 1
    sparse, dense = steps[start + 2:start + 5], steps[start + 5:start + 16]  # F3 A5 F3
    assert all(compressed == 2 for compressed, _ in sparse), steps
    assert all(compressed == 0 for compressed, _ in dense), steps   # both dense arms
    assert set(guard["compared_ms"]) == {"planned", "sparse", "allreduce_fp16", "allreduce"}, guard
    assert guard["skipped_ms"] == {}, guard


def check_step_guard_lean_arm():
    """Where the plan factors matrices the guard also runs the lean arm: its steps send as
    factors only the largest of them (256 x 256 holds over half of the 82K elements the plan
    factors; 256 x 64 goes by fp32 allreduce), then the winner runs, alike on every rank.
    At a stated 10 Mbit/s the dense arms' wire alone outlasts the plan's step: not run."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    compression, steps = time_aware_steps(model, "10mbit", 38, lambda stats: (
        stats["tensors_lowrank"], stats["guard"]["global"]))
    guard = steps[-1][1]
    start = compression.comm.sets["global"].policy.planner.settled_after + 1
    planned, lean = steps[start - 1:start + 2], steps[start + 5:start + 8]
    assert all(factored == 2 for factored, _ in planned), steps
    assert all(factored == 1 for factored, _ in lean), steps
    assert set(guard["compared_ms"]) == {"planned", "sparse", "lean"}, guard
    assert set(guard["skipped_ms"]) == {"allreduce", "allreduce_fp16"}, guard
    expected = 1 if guard["winner"] == "lean" else 2
    assert all(factored == expected for factored, _ in steps[start + 16:]), (guard, steps)


class Recording(DeepReduce):
    """DeepReduce that records, for each compress, whether Horovod was handed the tensor
    itself and no context."""

    def __init__(self, **options):
        super().__init__(**options)
        self.handed = []

    def compress(self, tensor):
        sent, ctx = super().compress(tensor)
        self.handed.append((sent is tensor, ctx is None))
        return sent, ctx


def check_fp32_route_hands_horovod_the_gradient_itself():
    """A tensor that travels by Horovod's fp32 allreduce with nothing held back for it is
    handed to Horovod as it is, with no context: the same bits as Horovod's own dense
    allreduce. Its first send makes (and clears) its residual; a bf16 gradient, which
    Horovod cannot sum, travels as float32 and comes back bf16."""
    compression = Recording(bandwidth="100gbit", value="raw", min_size=10**6, lowrank=0)  # fp32
    for step in range(3):
        t = torch.randn(300, 50)
        got = hvd.allreduce(t, name="as_is", compression=compression)
        torch.testing.assert_close(got, hvd.allreduce(t, name="as_is.dense"), rtol=0, atol=0)
    assert compression.handed == [(False, False), (True, True), (True, True)], compression.handed
    assert compression.stats()["tensors_allreduced"] == 3, compression.stats()
    for step in range(2):
        t = torch.randn(300, 50).bfloat16()
        got = hvd.allreduce(t, name="as_is.bf16", compression=compression)
        assert got.dtype == torch.bfloat16, got.dtype
        want = hvd.allreduce(t.float(), name="as_is.bf16.dense").bfloat16()
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert compression.handed[3:] == [(False, False)] * 2, compression.handed


def check_lowrank_second_round_starts_before_decompress():
    """A low-rank flight whose reduced P has arrived settles at the next compress (in a
    training step: while backward still runs) and starts its Q allreduce there, not at
    decompress; what it delivers is unchanged (a sum of rank-1 gradients, exactly)."""
    gen = torch.Generator().manual_seed(5)
    u, v = torch.randn(96, generator=gen), torch.randn(80, generator=gen)
    compression = DeepReduce(bandwidth="10mbit", lowrank=1)
    sent, flight = compression.compress(named((rank + 1) * torch.outer(u, v), "early.first"))
    placeholder = hvd.allreduce_async(sent, name="early.first.placeholder")
    deadline = time.monotonic() + 60
    while not hvd.poll(flight.handle):  # the P round of every rank done
        assert time.monotonic() < deadline, "the P round did not finish in 60 s"
        time.sleep(0.01)
    p_round = flight.handle
    sent_later, later = compression.compress(named(torch.randn(96, 80), "early.later"))
    assert flight.handle is not p_round, "the Q round waited for decompress"
    placeholder_later = hvd.allreduce_async(sent_later, name="early.later.placeholder")
    got = compression.decompress(hvd.synchronize(placeholder), flight)
    torch.testing.assert_close(got, (size + 1) / 2 * torch.outer(u, v), rtol=1e-4, atol=1e-4)
    compression.decompress(hvd.synchronize(placeholder_later), later)
    assert compression.stats()["tensors_lowrank"] == 2, compression.stats()


def check_lowrank_mismatches():
    """Ranks whose low-rank factors cannot agree (another shape, another rank) get a
    DeepReduceError, not Horovod's own error or a hang."""
    shaped = torch.randn(128, 128) if rank == 0 else torch.randn(256, 64)
    expect_error(lambda: hvd.allreduce(shaped, name="mismatch.lowrank.shape",
                                       compression=DeepReduce(bandwidth="10mbit")), "low-rank")
    other = DeepReduce(bandwidth="10mbit", lowrank=4 if rank == 0 else 2)
    expect_error(lambda: hvd.allreduce(torch.randn(128, 128), name="mismatch.lowrank.rank",
                                       compression=other), "low-rank")


if __name__ == "__main__":
    harness.main(globals())
