"""Horovod 0.28.1's own optimizer scenarios with DeepReduce, on 2 and 4 real ranks over Gloo.

Each worker (tests/workers/torch_scenarios.py, tests/workers/tf_scenarios.py) runs every
scenario twice, with Horovod's dense allreduce and with a lossless DeepReduce, and checks the
two agree and that ranks reducing together agree; every rank prints "RESULT <scenario> ok".
Process sets (even ranks / odd ranks) are registered at hvd.init; on 2 ranks each is a 1-rank
set, on 4 ranks they reduce for real.

One horovodrun job runs all of a worker's scenarios in order; when one fails (or hangs: the
worker's faulthandler watchdog ends it after SCENARIO_TIMEOUT seconds), a fresh job runs the
scenarios after it, so one failure does not hide the others.
"""
import re
import subprocess

import pytest

from horovod_run import horovodrun, results

pytestmark = [pytest.mark.horovod, pytest.mark.torch, pytest.mark.tensorflow]

# grouped_allreduce_process_sets comes first: its unnamed calls are named by Horovod from a
# per-process handle counter, which the process-set scenarios leave different on each rank
# (Horovod's own dense grouped_allreduce hangs after them too)
TORCH = ["grouped_allreduce_process_sets", "optimizer_process_sets", "allreduce_process_sets",
         "dynamic_requires_grad", "gradient_clipping", "named_parameters", "sparse_embeddings",
         "broadcast_state"]
TF = ["grouped_allreduce_process_sets", "gradient_tape_process_sets", "allreduce_process_sets",
      "local_gradient_aggregation", "partial_distributed_gradient_tape", "model_parallel",
      "keras_sparse_as_dense", "keras_gradient_aggregation", "keras_from_config",
      "keras_partial_optimizer", "keras_process_sets", "sparse_as_dense_compressed"]
# the process-set scenarios again, with the sets added after init (hvd.add_process_set), as in
# Horovod's own test_optimizer_process_sets
TORCH_DYNAMIC = ["optimizer_process_sets", "allreduce_process_sets"]
TF_DYNAMIC = ["gradient_tape_process_sets", "allreduce_process_sets", "keras_process_sets"]
DYNAMIC = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
RANKS = [2, 4]
SCENARIO_TIMEOUT = {2: 300, 4: 600}  # seconds one scenario may take before the watchdog fires
JOB_TIMEOUT = 1800                   # a backstop for a whole job
NOISE = re.compile(r"oneDNN|cudart_stub|cpu_feature_guard|absl::InitializeLog|AVX2 AVX512|"
                   r"rebuild TensorFlow")


def run_scenarios(script, scenarios, np_, env=None):
    """{scenario: (ranks that printed ok, the output of the job that ran it)}."""
    outcome, pending = {}, list(scenarios)
    while pending:
        try:
            proc = horovodrun(script, *pending, np_=np_, timeout=JOB_TIMEOUT,
                              env={"SCENARIO_TIMEOUT": str(SCENARIO_TIMEOUT[np_]), **(env or {})})
            output = proc.stdout
        except subprocess.TimeoutExpired as exc:
            output = exc.stdout or ""
            output = output.decode(errors="replace") if isinstance(output, bytes) else output
            output += f"\n[job timed out after {JOB_TIMEOUT} s]"
            proc = subprocess.CompletedProcess(exc.cmd, -1, output)
        output = "\n".join(line for line in output.splitlines() if not NOISE.search(line))
        lines = results(proc)
        for scenario in pending:
            outcome[scenario] = (lines.count(f"{scenario} ok"), output)
        done = [s for s in pending if outcome[s][0] == np_]
        if len(done) == len(pending):
            break
        failed = next(s for s in pending if outcome[s][0] != np_)
        pending = pending[pending.index(failed) + 1:]  # rerun what the failure cut short
    return outcome


def explain(outcome, scenario, np_):
    passed, output = outcome[scenario]
    return f"{scenario}: {passed} of {np_} ranks passed; the job's output:\n{output[-8000:]}"


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}ranks")
def torch_outcome(request):
    return request.param, run_scenarios("torch_scenarios.py", TORCH, request.param)


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}ranks")
def tf_outcome(request):
    return request.param, run_scenarios("tf_scenarios.py", TF, request.param)


@pytest.mark.parametrize("scenario", TORCH)
def test_torch_scenario_matches_dense(torch_outcome, scenario):
    np_, outcome = torch_outcome
    assert outcome[scenario][0] == np_, explain(outcome, scenario, np_)


@pytest.mark.parametrize("scenario", TF)
def test_tf_scenario_matches_dense(tf_outcome, scenario):
    np_, outcome = tf_outcome
    assert outcome[scenario][0] == np_, explain(outcome, scenario, np_)


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}ranks")
def torch_dynamic_outcome(request):
    return request.param, run_scenarios("torch_scenarios.py", TORCH_DYNAMIC, request.param,
                                        env=DYNAMIC)


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"{n}ranks")
def tf_dynamic_outcome(request):
    return request.param, run_scenarios("tf_scenarios.py", TF_DYNAMIC, request.param, env=DYNAMIC)


@pytest.mark.parametrize("scenario", TORCH_DYNAMIC)
def test_torch_dynamic_process_sets_match_dense(torch_dynamic_outcome, scenario):
    np_, outcome = torch_dynamic_outcome
    assert outcome[scenario][0] == np_, explain(outcome, scenario, np_)


@pytest.mark.parametrize("scenario", TF_DYNAMIC)
def test_tf_dynamic_process_sets_match_dense(tf_dynamic_outcome, scenario):
    np_, outcome = tf_dynamic_outcome
    assert outcome[scenario][0] == np_, explain(outcome, scenario, np_)
