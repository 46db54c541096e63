"""The sparse allreduce route: its three steps simulated for P ranks in one process (numpy
only), then on 4 real Horovod ranks in PyTorch and TensorFlow (tests/workers/sparse_allreduce.py)."""
import numpy as np
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.codecs.sparse_codec import SparseCodec
from deepreduce_hvd.comm import sparse_allreduce
from deepreduce_hvd.comm.sparse_allreduce import HEAD, Exchange, Ranges, even_bounds, owner_count
from deepreduce_hvd.compression.sparsify import exact_topk
from deepreduce_hvd.engine import native
from deepreduce_hvd.engine.runs import member, merge_sum
from horovod_run import discover, explain, run_checks

SIZE = 20000


@pytest.fixture
def split_small(monkeypatch):
    """Every rank owns a range of these 20,000-element tensors (200 selected), as of a large
    tensor's: one range per 16 selected elements instead of per MIN_OWNED."""
    monkeypatch.setattr(sparse_allreduce, "MIN_OWNED", 16)


def scattered(pipelines, ranges, grads, codec, name="w"):
    """Every rank's scatter, the alltoall done by slicing bytes. -> (the exchanges, for each
    owner the pieces every rank sent it, in rank order)."""
    ranks = len(pipelines)
    bounds = ranges[0].bounds(name, grads[0].size, ranks,
                              pipelines[0].selection_count(grads[0].size, name))
    exchanges = [Exchange(p, name, "float32") for p in pipelines]
    sent = [e.scatter(g, bounds.copy(), r, codec, None) for r, (e, g) in enumerate(zip(exchanges, grads))]
    offsets = [np.concatenate([[0], np.cumsum(e.splits)]) for e in exchanges]
    return exchanges, [[sent[r][offsets[r][owner]:offsets[r][owner + 1]].copy() for r in range(ranks)]
                       for owner in range(ranks)]


def step(pipelines, ranges, grads, codec, name="w"):
    """One sparse allreduce of each rank's gradient, the alltoall and the allgather done by
    slicing and concatenating bytes. -> (each rank's total, each owner's reduced message)."""
    exchanges, pieces = scattered(pipelines, ranges, grads, codec, name)
    reduced = [e.reduce(np.concatenate(pieces[owner])) for owner, e in enumerate(exchanges)]
    gathered = np.concatenate(reduced)
    return [e.gather(gathered, ranges[r], name)[0] for r, e in enumerate(exchanges)], reduced


def skewed(rng, ranks):
    scale = np.where(np.arange(SIZE) < SIZE // 10, 10.0, 1.0)
    return [(rng.standard_normal(SIZE) * scale).astype(np.float32) for _ in range(ranks)]


@pytest.mark.parametrize("owned", [16, sparse_allreduce.MIN_OWNED], ids=["4 owners", "1 owner"])
@pytest.mark.parametrize("index,value", [("golomb", "fp16"), ("bloom", "qsgd"), ("entropy", "raw")])
def test_what_every_residual_holds_plus_the_totals_is_the_sum_of_the_gradients(index, value, owned,
                                                                               monkeypatch):
    """4 ranks, 25 steps, lossy codecs included, every rank owning a range or one alone:
    sent totals + all residuals = all gradients; every rank decodes the same total, of about
    k values a step (not P*k)."""
    monkeypatch.setattr(sparse_allreduce, "MIN_OWNED", owned)
    ranks, rng = 4, np.random.default_rng(0)
    pipelines = [dr.Pipeline(ratio=0.01, index=index, value=value) for _ in range(ranks)]
    ranges = [Ranges() for _ in range(ranks)]
    codec = SparseCodec(index=index, value=value)
    gradient_sum, delivered = np.zeros(SIZE), np.zeros(SIZE)
    for _ in range(25):
        grads = skewed(rng, ranks)
        totals, _ = step(pipelines, ranges, grads, codec)
        assert all(np.array_equal(totals[0], t) for t in totals[1:])
        assert np.count_nonzero(totals[0]) <= 2 * SIZE // 100 + ranks  # about k (P*k gathered)
        gradient_sum += sum(grads)
        delivered += totals[0]
    residuals = sum(p.memory.residual("w").astype(np.float64) for p in pipelines)
    np.testing.assert_allclose(delivered + residuals, gradient_sum, atol=1e-3)
    assert np.abs(residuals).sum() > 0


@pytest.mark.parametrize("engine", ["native", "numpy"])
def test_owner_sums_in_rank_order_and_senders_find_survivors(engine, monkeypatch):
    """merge_sum: the union of the pieces' positions and 0 + their values in rank order, the
    same bits as adding them into a dense array rank by rank (pieces ascending or not, empty,
    overlapping, sparse or crowded: the native engine sums crowded ones over their span);
    member: exactly np.isin. Both engines."""
    if engine == "native" and native.engine is None:
        pytest.skip("C++ engine not built")
    if engine == "numpy":
        monkeypatch.setattr(native, "engine", None)
    rng = np.random.default_rng(3)
    for trial in range(40):
        size = int(rng.integers(1, 3000))
        pieces = []
        crowded = trial % 4 == 1  # most positions of the span taken
        for rank in range(int(rng.integers(1, 7))):
            count = int(rng.integers(size // 2, size + 1)) if crowded else \
                int(rng.integers(0, min(size, 400) + 1))
            positions = np.sort(rng.choice(size, count, replace=False))
            positions = rng.permutation(positions) if trial % 3 == 0 else positions
            values = (rng.standard_normal(positions.size) * 10.0 ** rng.uniform(-4, 4, positions.size))
            pieces.append((values.astype(np.float32), positions))
        dense, touched = np.zeros(size, np.float32), np.zeros(size, bool)
        for values, positions in pieces:
            dense[positions] += values
            touched[positions] = True
        union, sums = merge_sum(pieces)
        np.testing.assert_array_equal(union, np.flatnonzero(touched))
        assert sums.tobytes() == dense[union].tobytes()
        among = rng.choice(size, int(rng.integers(0, size + 1)), replace=False)
        among = np.sort(among) if trial % 2 else among
        np.testing.assert_array_equal(member(union, among), np.isin(union, among))
        far = np.sort(rng.choice(1000 * size, union.size, replace=False))  # few in a wide span:
        far = np.union1d(far[::2], union[1::2] * 1000)  # merged, not marked in a bitmap
        np.testing.assert_array_equal(member(union * 1000, far), np.isin(union * 1000, far))


def test_owner_keeps_exactly_the_largest_magnitudes_ties_by_lowest_position():
    """exact_topk (the owner's selection of its sums): `count` chosen, ascending; every
    chosen magnitude >= every other; among elements equal to the cut, the lowest positions
    (ties are common: fp16-rounded sums)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        size = int(rng.integers(2, 400))
        values = rng.choice(np.float32([-3, -1, -0.5, 0.5, 1, 2, 3]), size) * \
            np.where(rng.random(size) < 0.5, 1, rng.random(size)).astype(np.float32)
        count = int(rng.integers(1, size))
        magnitude = np.abs(values)
        picked = exact_topk(magnitude, count)
        assert (np.diff(picked) > 0).all()
        chosen = np.zeros(size, bool)
        chosen[picked] = True
        assert chosen.sum() == count
        assert magnitude[chosen].min() >= magnitude[~chosen].max()
        tied = np.flatnonzero(magnitude == magnitude[chosen].min())
        assert (chosen[tied] == (np.arange(tied.size) < chosen[tied].sum())).all()


def test_ranges_follow_the_selected_elements(split_small):
    """Selections crowded into the first tenth: the owners' loads even out as the ranges move
    (every rank computing the same boundaries), each range keeping at least one element."""
    ranks, rng = 4, np.random.default_rng(1)
    pipelines = [dr.Pipeline(ratio=0.01, index="golomb", value="fp16") for _ in range(ranks)]
    ranges = [Ranges() for _ in range(ranks)]
    codec = SparseCodec(index="golomb", value="fp16")
    first_loads = None
    for _ in range(6):
        _, reduced = step(pipelines, ranges, skewed(rng, ranks), codec)
        loads = [HEAD.unpack_from(message)[0] for message in reduced]
        first_loads = first_loads or loads
    bounds = ranges[0].bounds("w", SIZE, ranks, 200)
    assert all(np.array_equal(bounds, r.bounds("w", SIZE, ranks, 200)) for r in ranges[1:])
    assert bounds[1] < SIZE // 10 and (np.diff(bounds) >= 1).all()
    assert max(first_loads) > 3 * np.mean(first_loads) and max(loads) < 1.6 * np.mean(loads), \
        (first_loads, loads)


def test_rebalance_keeps_even_loads_and_every_range_nonempty(split_small):
    ranges = Ranges()
    bounds = ranges.bounds("t", 10, 4, 64)
    np.testing.assert_array_equal(bounds, even_bounds(10, 4))
    ranges.rebalance("t", bounds, [10, 11, 10, 12])  # within REBALANCE: kept
    np.testing.assert_array_equal(ranges.bounds("t", 10, 4, 64), bounds)
    ranges.rebalance("t", bounds, [1000, 0, 0, 0])   # all in the first range
    moved = ranges.bounds("t", 10, 4, 64)
    assert moved[0] == 0 and moved[-1] == 10 and (np.diff(moved) >= 1).all(), moved
    restored = Ranges()
    restored.load_state_dict(ranges.state_dict())
    np.testing.assert_array_equal(restored.bounds("t", 10, 4, 64), moved)
    assert len(restored.bounds("t", 10, 8, 64)) == 9  # another world size: even again


def test_a_tensor_selecting_few_elements_has_fewer_owners_spread_over_the_ranks():
    """One range per MIN_OWNED selected elements (at least 1, at most P); the other ranks'
    ranges are empty and stay empty when the owners' ranges rebalance; the owners of many
    small tensors spread over the ranks; a new owner count splits the tensor anew."""
    owned = sparse_allreduce.MIN_OWNED
    assert [owner_count(n, 4) for n in (0, 1, owned - 1, owned, 3 * owned, 100 * owned)] == \
        [1, 1, 1, 1, 3, 4]
    ranges = Ranges()
    firsts = set()
    for t in range(16):
        bounds = ranges.bounds(f"small.{t}", 2048, 4, 20)
        owner, = np.flatnonzero(np.diff(bounds))
        assert bounds[owner + 1] - bounds[owner] == 2048
        firsts.add(int(owner))
    assert len(firsts) >= 3, firsts
    bounds = ranges.bounds("w", 4000, 4, 2 * owned)
    owners = np.flatnonzero(np.diff(bounds))
    assert len(owners) == 2 and bounds[-1] == 4000
    loads = np.zeros(4)
    loads[owners] = [900, 100]
    ranges.rebalance("w", bounds, loads)
    moved = ranges.bounds("w", 4000, 4, 2 * owned)
    np.testing.assert_array_equal(np.flatnonzero(np.diff(moved)), owners)
    assert moved[owners[0] + 1] < 4000 // 2  # the busy owner's range shrank
    assert len(np.flatnonzero(np.diff(ranges.bounds("w", 4000, 4, 4 * owned)))) == 4


def test_a_rank_without_a_range_sends_and_gathers_no_frame():
    """One owner (a 20,000-element tensor selecting 200): the others' pieces for it are
    empty, their reduced messages only the head, and every rank decodes the same total."""
    ranks, rng = 4, np.random.default_rng(6)
    pipelines = [dr.Pipeline(ratio=0.01, index="golomb", value="fp16") for _ in range(ranks)]
    ranges = [Ranges() for _ in range(ranks)]
    exchanges, pieces = scattered(pipelines, ranges, skewed(rng, ranks),
                                  SparseCodec(index="golomb", value="fp16"))
    owner, = np.flatnonzero(np.diff(exchanges[0].bounds))
    for e in exchanges:
        assert np.flatnonzero(e.splits).tolist() == [owner]
    reduced = [e.reduce(np.concatenate(pieces[j])) for j, e in enumerate(exchanges)]
    assert [len(m) == HEAD.size for m in reduced] == [j != owner for j in range(ranks)]
    totals = [e.gather(np.concatenate(reduced), ranges[r], "w")[0] for r, e in enumerate(exchanges)]
    assert all(t.tobytes() == totals[0].tobytes() for t in totals[1:])
    assert 0 < np.count_nonzero(totals[0]) <= 200


def test_hostile_reduced_messages_are_refused(split_small):
    ranks = 2
    pipelines = [dr.Pipeline(ratio=0.01, index="golomb", value="fp16") for _ in range(ranks)]
    ranges = [Ranges() for _ in range(ranks)]
    _, reduced = step(pipelines, ranges, skewed(np.random.default_rng(2), ranks),
                      SparseCodec(index="golomb", value="fp16"))
    gathered = np.concatenate(reduced)
    assert len(set(np.diff(ranges[0].bounds("w", SIZE, ranks, 200)))) == 2  # swapped: mismatch
    exchange = Exchange(pipelines[0], "w", "float32")
    exchange.scatter(np.ones(SIZE, np.float32), ranges[0].bounds("w", SIZE, ranks, 200), 0,
                     SparseCodec(index="golomb", value="fp16"), None)
    unframed = reduced[1][:HEAD.size].copy()
    unframed[-1] = 0  # rank 1 says it owns no range: its frame missing
    for bad in (gathered[:-1], gathered[:HEAD.size - 1], np.concatenate([gathered, gathered[:3]]),
                np.concatenate([reduced[1], reduced[0]]), np.concatenate([reduced[0], unframed])):
        with pytest.raises(dr.DeepReduceError):
            exchange.gather(bad, ranges[0], "w")


@pytest.mark.parametrize("damage", ["truncated", "flipped", "other config"])
def test_a_bad_piece_reaches_one_owner_and_every_rank_raises(damage, split_small):
    """A piece only its owner reads (malformed, truncated, another config's): the owner does
    not raise alone (the other ranks would wait for it in the allgather) but sends an error
    frame, and every rank raises DeepReduceError at the gather."""
    ranks, rng = 4, np.random.default_rng(4)
    codec = SparseCodec(index="golomb", value="fp16")
    pipelines = [dr.Pipeline(ratio=0.01, index="golomb", value="fp16") for _ in range(ranks)]
    ranges = [Ranges() for _ in range(ranks)]
    bounds = ranges[0].bounds("w", SIZE, ranks, 200)
    exchanges, pieces = scattered(pipelines, ranges, skewed(rng, ranks), codec)
    bad = pieces[2][1]  # rank 1's piece of rank 2's range
    if damage == "truncated":
        pieces[2][1] = bad[:len(bad) // 2]
    elif damage == "flipped":
        bad[len(bad) // 2:] ^= 0x5A
    else:
        other = dr.Pipeline(ratio=0.01, index="golomb", value="raw")
        pieces[2][1] = np.frombuffer(other.frame(np.ones(3, np.float32), np.arange(3),
                                                 (int(bounds[3] - bounds[2]),), "float32")[0], np.uint8)
    gathered = np.concatenate([e.reduce(np.concatenate(pieces[owner]))
                               for owner, e in enumerate(exchanges)])
    for r, e in enumerate(exchanges):
        with pytest.raises(dr.DeepReduceError, match="range"):
            e.gather(gathered, ranges[r], "w")


CHECKS = discover("sparse_allreduce.py")


@pytest.fixture(scope="module", params=["torch", "tf"])
def outcome(request):
    return run_checks("sparse_allreduce.py", CHECKS, np_=4, env={"DEEPREDUCE_FRAMEWORK": request.param})


@pytest.mark.horovod
@pytest.mark.torch
@pytest.mark.tensorflow
@pytest.mark.parametrize("check", CHECKS)
def test_at_four_ranks(outcome, check):
    assert outcome[check].passed == 4, explain(outcome, check, 4)
