"""deepreduce_hvd.tensorflow on 2 real Horovod ranks over Gloo (horovodrun, no mocks)."""
import json

import pytest

from horovod_run import ROOT, horovodrun, results

CHECKS = ["eager", "tf_function", "gradient_tape", "mismatch", "keras3_gradients"]


@pytest.fixture(scope="module")
def tf_checks():
    proc = horovodrun("tf_checks.py", *CHECKS, timeout=600)
    return proc, results(proc)


@pytest.mark.parametrize("check", CHECKS)
def test_check_passes_on_every_rank(tf_checks, check):
    proc, lines = tf_checks
    assert lines.count(f"{check} ok") == 2, proc.stdout[-4000:]


def test_keras_fit_with_tf_keras():
    proc = horovodrun("tf_checks.py", "keras_fit", timeout=600, env={"TF_USE_LEGACY_KERAS": "1"})
    assert results(proc).count("keras_fit ok") == 2, proc.stdout[-4000:]


def train(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    proc = horovodrun(ROOT / "tf" / "train_digits.py", "--no-progress", "--epochs", 10,
                      "--json", out, *args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return json.loads(out.read_text())["history"]


def test_training_accuracy_within_two_points_of_dense(tmp_path):
    dense = train(tmp_path, "dense", "--compression", "none")
    sparse = train(tmp_path, "deepreduce", "--compression", "deepreduce", "--index", "bloom",
                   "--value", "qsgd")
    best_dense = max(e["test_accuracy"] for e in dense[-3:])
    best_sparse = max(e["test_accuracy"] for e in sparse[-3:])
    assert best_sparse >= best_dense - 0.02, (dense[-3:], sparse[-3:])
    assert sparse[-1]["mb_sent"] < sparse[-1]["mb_dense"] / 5
