"""Horovod 0.28.1's own optimizer scenarios with DeepReduce, on 2 and 4 real ranks over Gloo.

Each worker (tests/workers/torch_scenarios.py, tests/workers/tf_scenarios.py) runs every
scenario (its check_* functions, found by tests/horovod_run.py) twice, with Horovod's dense
allreduce and with a lossless DeepReduce, and checks the two agree and that ranks reducing
together agree. Process sets (even ranks / odd ranks) are registered at hvd.init; on 2 ranks
each is a 1-rank set, on 4 ranks they reduce for real. A failing or hanging scenario ends its
job; a fresh job runs the scenarios after it.
"""
import pytest

from horovod_run import discover, explain, run_checks

pytestmark = [pytest.mark.horovod, pytest.mark.torch, pytest.mark.tensorflow]

# the files put grouped_allreduce_process_sets first: its unnamed calls are named by Horovod
# from a per-process handle counter, which the process-set scenarios leave different on each
# rank (Horovod's own dense grouped_allreduce hangs after them too)
TORCH, TF = discover("torch_scenarios.py"), discover("tf_scenarios.py")
# the process-set scenarios again, with the sets added after init (hvd.add_process_set), as in
# Horovod's own test_optimizer_process_sets
TORCH_DYNAMIC = ["optimizer_process_sets", "allreduce_process_sets"]
TF_DYNAMIC = ["gradient_tape_process_sets", "allreduce_process_sets", "keras_process_sets"]
DYNAMIC = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
RANKS = [2, 4]
CHECK_TIMEOUT = {2: 300, 4: 600}  # seconds one scenario may take before the watchdog fires


def scenarios(script, names, np_, env=None):
    return run_checks(script, names, np_=np_, env=env, check_timeout=CHECK_TIMEOUT[np_])


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}ranks")
def torch_outcome(request):
    return request.param, scenarios("torch_scenarios.py", TORCH, request.param)


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}ranks")
def tf_outcome(request):
    return request.param, scenarios("tf_scenarios.py", TF, request.param)


@pytest.mark.parametrize("scenario", TORCH)
def test_torch_scenario_matches_dense(torch_outcome, scenario):
    np_, outcome = torch_outcome
    assert outcome[scenario].passed == np_, explain(outcome, scenario, np_)


@pytest.mark.parametrize("scenario", TF)
def test_tf_scenario_matches_dense(tf_outcome, scenario):
    np_, outcome = tf_outcome
    assert outcome[scenario].passed == np_, explain(outcome, scenario, np_)


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}ranks")
def torch_dynamic_outcome(request):
    return request.param, scenarios("torch_scenarios.py", TORCH_DYNAMIC, request.param, DYNAMIC)


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}ranks")
def tf_dynamic_outcome(request):
    return request.param, scenarios("tf_scenarios.py", TF_DYNAMIC, request.param, DYNAMIC)


@pytest.mark.parametrize("scenario", TORCH_DYNAMIC)
def test_torch_dynamic_process_sets_match_dense(torch_dynamic_outcome, scenario):
    np_, outcome = torch_dynamic_outcome
    assert outcome[scenario].passed == np_, explain(outcome, scenario, np_)


@pytest.mark.parametrize("scenario", TF_DYNAMIC)
def test_tf_dynamic_process_sets_match_dense(tf_dynamic_outcome, scenario):
    np_, outcome = tf_dynamic_outcome
    assert outcome[scenario].passed == np_, explain(outcome, scenario, np_)
