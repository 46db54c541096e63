"""The hierarchical mode, PyTorch and TensorFlow, on 2 hosts x 2 ranks: horovodrun -H
localhost:2,127.0.0.1:2 makes Horovod see two hosts of two ranks on this machine."""
import pytest

from horovod_run import discover, explain, run_checks

pytestmark = [pytest.mark.horovod, pytest.mark.torch, pytest.mark.tensorflow]

TWO_HOSTS = "localhost:2,127.0.0.1:2"
FRAMEWORKS = ["torch", "tf"]
# run without Horovod's dynamic process sets, which the mode needs
STATIC = ["refused_without_dynamic_process_sets"]
CHECKS = [check for check in discover("hierarchical.py") if check not in STATIC]


@pytest.fixture(scope="module", params=FRAMEWORKS)
def outcome(request):
    return run_checks("hierarchical.py", CHECKS, np_=4, hosts=TWO_HOSTS,
                      env={"DEEPREDUCE_FRAMEWORK": request.param})


@pytest.mark.parametrize("check", CHECKS)
def test_on_two_hosts(outcome, check):
    assert outcome[check].passed == 4, explain(outcome, check, 4)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("check", STATIC)
def test_refused_on_every_rank_without_dynamic_process_sets(framework, check):
    outcome = run_checks("hierarchical.py", [check], np_=4, hosts=TWO_HOSTS,
                         env={"DEEPREDUCE_FRAMEWORK": framework, "DEEPREDUCE_STATIC_SETS": "1"})
    assert outcome[check].passed == 4, explain(outcome, check, 4)
