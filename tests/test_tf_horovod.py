"""deepreduce_hvd.tensorflow on 2 and 4 real Horovod ranks over Gloo (horovodrun, no mocks)."""
import pytest

from horovod_run import assert_accuracy_close, horovodrun, results, train_history

pytestmark = [pytest.mark.horovod, pytest.mark.tensorflow]

CHECKS = ["eager", "tf_function", "gradient_tape", "mismatch", "keras3_gradients", "time_aware",
          "device_path"]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def tf_checks(request):
    proc = horovodrun("tf_checks.py", *CHECKS, np_=request.param, timeout=900)
    return request.param, proc, results(proc)


@pytest.mark.parametrize("check", CHECKS)
def test_check_passes_on_every_rank(tf_checks, check):
    ranks, proc, lines = tf_checks
    assert lines.count(f"{check} ok") == ranks, proc.stdout[-4000:]


def test_keras_fit_with_tf_keras():
    proc = horovodrun("tf_checks.py", "keras_fit", timeout=600, env={"TF_USE_LEGACY_KERAS": "1"})
    assert results(proc).count("keras_fit ok") == 2, proc.stdout[-4000:]


def test_training_accuracy_within_two_points_of_dense(tmp_path):
    script = "tf/train_digits.py"
    dense = train_history(script, tmp_path, "dense", "--compression", "none", epochs=10)
    sparse = train_history(script, tmp_path, "deepreduce", "--compression", "deepreduce",
                           "--index", "bloom", "--value", "qsgd", epochs=10)
    assert_accuracy_close(dense, sparse)
