"""Checkpoints: DeepReduce's state_dict (torch.save) and tf.train.Checkpoint resume training
bit for bit, at 2 and 4 ranks, by allgather and by the sparse allreduce
(tests/workers/resume.py, one job per step); the state's own
round trips and refusals."""
import numpy as np
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.comm.state import pack, unpack
from horovod_run import discover, explain, run_checks


@pytest.fixture(scope="module", params=[("torch", 2, "auto"), ("tf", 2, "auto"), ("torch", 4, "auto"),
                                        ("tf", 4, "auto"), ("torch", 4, "sparse_allreduce"),
                                        ("tf", 4, "sparse_allreduce")],
                ids=lambda p: f"{p[0]}-{p[1]}ranks-{p[2]}")
def resumed(request, tmp_path_factory):
    framework, ranks, collective = request.param
    env = {"DEEPREDUCE_FRAMEWORK": framework, "DEEPREDUCE_COLLECTIVE": collective,
           "DEEPREDUCE_SCRATCH": str(tmp_path_factory.mktemp("resume"))}
    outcome = {}
    for check in discover("resume.py"):  # each in a fresh process
        outcome.update(run_checks("resume.py", [check], np_=ranks, env=env))
    return ranks, outcome


@pytest.mark.horovod
@pytest.mark.torch
@pytest.mark.tensorflow
@pytest.mark.parametrize("check", discover("resume.py"))
def test_resume(resumed, check):
    ranks, outcome = resumed
    assert outcome[check].passed == ranks, explain(outcome, check, ranks)


def test_packed_state_round_trips_without_pickle():
    state = {"format": 1, "sets": {"global": {"pipeline": {
        "residuals": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
        "steps": {"w": 3}, "codec": {"state": {"state": 2**100, "inc": 7}}}}}}
    back = unpack(pack(state))
    np.testing.assert_array_equal(back["sets"]["global"]["pipeline"]["residuals"]["w"],
                                  state["sets"]["global"]["pipeline"]["residuals"]["w"])
    assert back["sets"]["global"]["pipeline"]["codec"] == state["sets"]["global"]["pipeline"]["codec"]


@pytest.mark.parametrize("data", [b"", b"\0" * 8, b"\x05" + b"\0" * 7 + b"{}", pack({"a": 1})[:-5]])
def test_corrupted_packed_state_is_refused(data):
    with pytest.raises(dr.DeepReduceError):
        unpack(data)


def test_pipeline_state_resumes_residuals_steps_and_random_draws(rng):
    config = dict(ratio=0.05, index="golomb", value={"id": "qsgd", "seed": 3}, warmup_steps=5)
    grads = [rng.standard_normal(3000).astype(np.float32) for _ in range(6)]
    straight = dr.Pipeline(**config)
    frames = [straight.compress("w", g) for g in grads]
    first = dr.Pipeline(**config)
    for g in grads[:3]:
        first.compress("w", g)
    resumed = dr.Pipeline(**config)
    resumed.load_state_dict(unpack(pack(first.state_dict())))
    assert [resumed.compress("w", g)[21:] for g in grads[3:]] == [f[21:] for f in frames[3:]]
