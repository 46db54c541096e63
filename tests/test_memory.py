"""Error feedback: nothing a rank fails to deliver is lost, whichever codec lost it."""
import numpy as np
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.compression import pipeline as pipeline_module


@pytest.mark.parametrize("config", [
    dict(index="entropy", value="raw"),
    dict(index="entropy", value={"id": "qsgd", "bits": 4}),
    dict(index={"id": "bloom", "policy": "random"}, value="raw"),
    dict(index="entropy", value="polyfit"),
    dict(index="entropy", value="raw", energy=0.7),
])
def test_delivered_plus_residual_conserves_the_gradient_sum(config, rng):
    pipeline = dr.Pipeline(ratio=0.02, **config)
    shape, total_grad, total_delivered = (60, 70), 0, 0
    for step in range(6):
        grad = rng.standard_normal(shape).astype(np.float32)
        frame = pipeline.compress("w", grad)
        delivered, _ = pipeline.decompress(frame, shape, "float32", ranks=1)
        total_grad, total_delivered = total_grad + grad, total_delivered + delivered
    residual = pipeline.memory.residual("w")
    np.testing.assert_allclose(total_delivered + residual, total_grad, rtol=1e-4, atol=1e-4)
    assert np.abs(residual).sum() > 0


def test_residual_includes_the_codec_loss(rng):
    grad = rng.standard_normal(5000).astype(np.float32)
    lossy = dr.Pipeline(ratio=0.05, value={"id": "qsgd", "bits": 3})
    exact = dr.Pipeline(ratio=0.05, value="raw")
    lossy.compress("g", grad)
    exact.compress("g", grad)
    values, indices = dr.topk(grad, 0.05)
    selected = np.zeros(grad.size, bool)
    selected[indices] = True
    assert np.all(exact.memory.residual("g")[selected] == 0)   # sparsifier loss only
    assert np.any(lossy.memory.residual("g")[selected] != 0)   # plus quantisation loss


def test_memory_compensates_and_delivers_in_place():
    memory = dr.ResidualMemory()
    buffer = memory.compensate("a", np.ones(4))
    memory.deliver("a", np.array([1, 3]), np.array([1.0, 0.5]))
    np.testing.assert_array_equal(memory.residual("a"), [1, 0, 1, 0.5])
    assert memory.compensate("a", np.ones(4)) is buffer  # the same buffer, updated in place
    np.testing.assert_array_equal(buffer, [2, 1, 2, 1.5])
    memory.deliver_dense("a", buffer.copy())
    np.testing.assert_array_equal(memory.residual("a"), 0)
    with pytest.raises(dr.DeepReduceError, match="changed shape"):
        memory.compensate("a", np.ones(5))
    memory.reset("a")
    assert memory.residual("a") is None


@pytest.mark.parametrize("sparsifier", ["topk", "randomk"])
def test_density_warmup_decays_from_a_quarter_to_the_ratio(sparsifier, rng):
    pipeline = dr.Pipeline(sparsifier=sparsifier, ratio=0.01, warmup_steps=4, index="golomb",
                           value="raw")
    sent = []
    for step in range(6):
        frame = pipeline.compress("w", rng.standard_normal(10_000).astype(np.float32))
        _, received = pipeline.decompress(frame, (10_000,), "float32", ranks=1)
        sent.append(dr.describe(received[0].payload)["count"])
    # 25% * (0.01 / 0.25) ** (step / 4), then the ratio; dense steps count as steps too
    assert sent == [2500, 1118, 500, 224, 100, 100]
    assert pipeline.selection_count(10_000, "w") == 100
    assert pipeline.selection_count(10_000, "other") == 2500  # each tensor has its own steps
    assert pipeline.selection_count(10_000) == 100            # unnamed: no warm-up
    pipeline.compress_dense("other", np.ones(10_000, np.float32))
    assert pipeline.selection_count(10_000, "other") == 1118


def test_pipeline_rejects_bad_config():
    for bad in (dict(sparsifier="topq"), dict(ratio=0), dict(ratio=1.5), dict(memory="yes"),
                dict(min_size=-1), dict(warmup_steps=-1), dict(warmup_steps=1.5), dict(index="nope"), dict(value={"id": "qsgd", "bits": 1})):
        with pytest.raises(dr.DeepReduceError):
            dr.Pipeline(**bad)


def test_frames_detect_mismatch_and_truncation(rng):
    grad = rng.standard_normal((40, 40)).astype(np.float32)
    a, b = dr.Pipeline(ratio=0.05), dr.Pipeline(ratio=0.05, index="golomb")
    frames = a.compress("w", grad) + b.compress("w", grad)
    with pytest.raises(dr.DeepReduceError, match="rank 1 .*config"):
        a.decompress(frames, grad.shape, "float32", ranks=2)
    good = a.compress("w", grad)
    with pytest.raises(dr.DeepReduceError, match="truncated"):
        a.decompress(good[:-5], grad.shape, "float32", ranks=1)
    with pytest.raises(dr.DeepReduceError, match="left after"):
        a.decompress(good + b"x", grad.shape, "float32", ranks=1)
    with pytest.raises(dr.DeepReduceError, match="no DeepReduce frame"):
        a.decompress(good, grad.shape, "float32", ranks=2)


@pytest.mark.parametrize("index,value", [("entropy", "qsgd"), ("bloom", "raw"),
                                         ({"id": "bloom", "policy": "conflict"}, "polyfit"),
                                         ("auto", "auto"), ("golomb", "dexp")])
def test_delivered_is_what_decode_gives(index, value, rng):
    dense = rng.standard_normal(20_000).astype(np.float32)
    values, indices = dr.topk(dense, 0.02)
    codec = dr.SparseCodec(index=index, value={"id": "qsgd", "seed": 1} if value == "qsgd" else value)
    payload, i, v = codec.encode_full(values, indices, dense.shape, dense=dense)
    v2, i2, _ = dr.decode(payload)
    np.testing.assert_array_equal(i, i2)
    np.testing.assert_array_equal(v, v2)


def test_randomk_with_seeded_index_sends_only_values(rng):
    grad = rng.standard_normal(100_000).astype(np.float32)
    pipeline = dr.Pipeline(sparsifier="randomk", ratio=0.01, index="seeded", value="raw")
    frame = pipeline.compress("w", grad)
    assert len(frame) < 4 * 1000 + 64  # 1000 float32 values and headers, no index bytes
    got, _ = pipeline.decompress(frame, grad.shape, "float32", ranks=1)
    selected = np.flatnonzero(got)
    assert selected.size == 1000
    np.testing.assert_array_equal(got[selected], grad[selected])
    second = pipeline.compress("w", grad)  # a new seed each step: other positions
    assert set(np.flatnonzero(pipeline.decompress(second, grad.shape, "float32", 1)[0])) != set(selected)


def test_threshold_zero_sends_exactly_the_nonzeros(rng):
    grad = np.zeros((300, 40), np.float32)
    grad[rng.choice(300, 20, replace=False)] = rng.standard_normal((20, 40))
    pipeline = dr.Pipeline(sparsifier="threshold", threshold=0.0, index="entropy", value="raw")
    got, _ = pipeline.decompress(pipeline.compress("emb", grad), grad.shape, "float32", ranks=1)
    np.testing.assert_array_equal(got, grad)


def test_an_fp32_send_after_a_cleared_residual_is_the_gradient_itself(rng):
    """Horovod's fp32 allreduce of a tensor whose residual the previous fp32 send cleared
    gets the gradient as it is (no compensation pass, no copy); once a sparse step holds
    something back again, the next fp32 send carries it, and nothing is lost."""
    pipeline = dr.Pipeline(ratio=0.01, index="golomb", value="raw")
    grads = [rng.standard_normal(5000).astype(np.float32) for _ in range(4)]
    assert pipeline.holds_nothing(None)                # unnamed: no residual kept
    pipeline.compress("w", grads[0])                  # sparse: 99% held back
    assert not pipeline.holds_nothing("w")
    held = pipeline.memory.residual("w").copy()
    sent = pipeline.compress_dense("w", grads[1])
    np.testing.assert_array_equal(sent, grads[1] + held)
    assert pipeline.holds_nothing("w")                 # what the communicator hands Horovod as is
    sent = pipeline.compress_dense("w", grads[2])
    assert np.shares_memory(sent, grads[2])            # the gradient itself
    assert not pipeline.memory.residual("w").any()
    pipeline.compress("w", grads[3])
    held = pipeline.memory.residual("w").copy()
    assert held.any() and not pipeline.holds_nothing("w")
    np.testing.assert_array_equal(pipeline.compress_dense("w", grads[0]), grads[0] + held)
    for options in (dict(local_clip_norm=1.0), dict(momentum=0.9)):  # what the optimizer gets
        other = dr.Pipeline(ratio=0.01, index="golomb", value="raw", **options)  # is not the
        other.compress_dense("w", grads[0])                                      # sum as is
        assert not other.holds_nothing("w") and not other.holds_nothing(None)


@pytest.mark.parametrize("index", ["bitmap", "bloom", {"id": "bloom", "policy": "random"}, "deflate",
                                   "dense", "entropy", "golomb", "huffman", "raw", "rle", "varint",
                                   "auto"])
@pytest.mark.parametrize("value", ["bf16", "deflate", "dexp", "entropy", "fp16", "polyfit",
                                   {"id": "qsgd", "bits": 3}, "raw"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_own_frame_kept_not_decoded_gives_the_same_bits(index, value, dtype, rng, monkeypatch):
    """A rank adds the values its encoder kept for its own frame instead of decoding it: the
    sum must be bit for bit the one a rank that decodes every frame computes."""
    decoded = []  # payloads decoded, per decompress
    decode_unordered = pipeline_module.decode_unordered
    monkeypatch.setattr(pipeline_module, "decode_unordered",
                        lambda *a: decoded.__setitem__(-1, decoded[-1] + 1) or decode_unordered(*a))
    config = dict(ratio=0.03, index=index, value=value)
    ranks = [dr.Pipeline(**config) for _ in range(3)]
    shape = (70, 90)
    for step in range(2):
        grads = [rng.standard_normal(shape).astype(dtype) for _ in ranks]
        gathered = b"".join(p.compress("w", g) for p, g in zip(ranks, grads))
        decoded.append(0)
        reference, _ = dr.Pipeline(**config).decompress(gathered, shape, dtype, 3)
        assert decoded[-1] == 3
        for own, pipeline in enumerate(ranks):
            before = pipeline.stats.decode_s
            decoded.append(0)
            total, _ = pipeline.decompress(gathered, shape, dtype, 3, name="w", own=own)
            assert pipeline.stats.decode_s > before
            np.testing.assert_array_equal(total.view(np.uint32), reference.view(np.uint32))
            assert decoded[-1] == 2  # the two other ranks' frames
            decoded.append(0)  # held from compress to its decompress only: again, all three
            again, _ = pipeline.decompress(gathered, shape, dtype, 3, name="w", own=own)
            np.testing.assert_array_equal(again.view(np.uint32), reference.view(np.uint32))
            assert decoded[-1] == 3


def test_own_frame_is_decoded_when_it_is_not_what_this_rank_sent(rng):
    """Only the very payload this rank encoded is taken from the encoder's values."""
    pipeline, other = dr.Pipeline(ratio=0.05), dr.Pipeline(ratio=0.05)
    grad = rng.standard_normal(4000).astype(np.float32)
    pipeline.compress("w", grad)
    foreign = other.compress("w", rng.standard_normal(4000).astype(np.float32))
    got, _ = pipeline.decompress(foreign, (4000,), "float32", 1, name="w", own=0)
    expected, _ = dr.Pipeline(ratio=0.05).decompress(foreign, (4000,), "float32", 1)
    np.testing.assert_array_equal(got, expected)
    assert pipeline.stats.bytes_received == 0  # its own position: not received
    with pytest.raises(dr.DeepReduceError, match="own must be"):
        pipeline.decompress(foreign, (4000,), "float32", 1, own=1)
