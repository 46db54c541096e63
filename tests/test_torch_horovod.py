"""deepreduce_hvd.torch on 2 and 4 real Horovod ranks over Gloo (horovodrun, no mocks)."""
import pytest

from horovod_run import assert_accuracy_close, discover, explain, run_checks, train_history

pytestmark = [pytest.mark.horovod, pytest.mark.torch]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def torch_checks(request):
    return request.param, run_checks("torch_checks.py", np_=request.param)


@pytest.mark.parametrize("check", discover("torch_checks.py"))
def test_check_passes_on_every_rank(torch_checks, check):
    ranks, outcome = torch_checks
    assert outcome[check].passed == ranks, explain(outcome, check, ranks)


def test_training_accuracy_within_two_points_of_dense(tmp_path):
    script = "torch/train_digits.py"
    dense = train_history(script, tmp_path, "dense", "--compression", "none", epochs=8)
    sparse = train_history(script, tmp_path, "deepreduce", "--compression", "deepreduce",
                           "--index", "bloom", "--value", "qsgd", epochs=8)
    assert_accuracy_close(dense, sparse)
