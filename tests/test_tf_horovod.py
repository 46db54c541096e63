"""deepreduce_hvd.tensorflow on 2 and 4 real Horovod ranks over Gloo (horovodrun, no mocks)."""
import pytest

from horovod_run import assert_accuracy_close, discover, explain, run_checks, train_history

pytestmark = [pytest.mark.horovod, pytest.mark.tensorflow]

# checks that need another environment: {check: (environment, rank counts)}
SPECIAL = {"keras_fit": ({"TF_USE_LEGACY_KERAS": "1"}, [2])}
CHECKS = [check for check in discover("tf_checks.py") if check not in SPECIAL]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def tf_checks(request):
    return request.param, run_checks("tf_checks.py", CHECKS, np_=request.param)


@pytest.mark.parametrize("check", CHECKS)
def test_check_passes_on_every_rank(tf_checks, check):
    ranks, outcome = tf_checks
    assert outcome[check].passed == ranks, explain(outcome, check, ranks)


@pytest.mark.parametrize("check, ranks", [(check, ranks) for check, (_, counts) in SPECIAL.items()
                                           for ranks in counts])
def test_check_in_its_own_environment(check, ranks):
    outcome = run_checks("tf_checks.py", [check], np_=ranks, env=SPECIAL[check][0])
    assert outcome[check].passed == ranks, explain(outcome, check, ranks)


def test_training_accuracy_within_two_points_of_dense(tmp_path):
    script = "tf/train_digits.py"
    dense = train_history(script, tmp_path, "dense", "--compression", "none", epochs=10)
    sparse = train_history(script, tmp_path, "deepreduce", "--compression", "deepreduce",
                           "--index", "bloom", "--value", "qsgd", epochs=10)
    assert_accuracy_close(dense, sparse)
