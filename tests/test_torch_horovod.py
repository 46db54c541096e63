"""deepreduce_hvd.torch on 2 and 4 real Horovod ranks over Gloo (horovodrun, no mocks)."""
import pytest

from horovod_run import assert_accuracy_close, horovodrun, results, train_history

pytestmark = [pytest.mark.horovod, pytest.mark.torch]

CHECKS = ["lossless_equals_dense", "topk_equals_local_average", "passthrough",
          "optimizer_variants", "optimizer_matches_dense", "hook_order_independent", "mismatches",
          "time_aware", "device_path"]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def torch_checks(request):
    proc = horovodrun("torch_checks.py", *CHECKS, np_=request.param, timeout=900)
    return request.param, proc, results(proc)


@pytest.mark.parametrize("check", CHECKS)
def test_check_passes_on_every_rank(torch_checks, check):
    ranks, proc, lines = torch_checks
    assert lines.count(f"{check} ok") == ranks, proc.stdout[-4000:]


def test_training_accuracy_within_two_points_of_dense(tmp_path):
    script = "torch/train_digits.py"
    dense = train_history(script, tmp_path, "dense", "--compression", "none", epochs=8)
    sparse = train_history(script, tmp_path, "deepreduce", "--compression", "deepreduce",
                           "--index", "bloom", "--value", "qsgd", epochs=8)
    assert_accuracy_close(dense, sparse)


TWO_HOSTS = "localhost:2,127.0.0.1:2"  # horovodrun sees two hosts of two ranks each
HIERARCHICAL = ["lossless_sum_is_exact", "error_feedback_conserves_the_sum",
                "training_keeps_parameters_identical"]


@pytest.fixture(scope="module")
def hierarchical():
    proc = horovodrun("torch_hierarchical.py", np_=4, hosts=TWO_HOSTS, timeout=600)
    return proc, results(proc)


@pytest.mark.parametrize("check", HIERARCHICAL)
def test_hierarchical_mode_on_two_hosts(hierarchical, check):
    proc, lines = hierarchical
    assert lines.count(f"{check} ok") == 4, proc.stdout[-4000:]


def test_hierarchical_mode_refused_on_every_rank_without_dynamic_process_sets():
    proc = horovodrun("torch_hierarchical.py", "refused", np_=4, hosts=TWO_HOSTS, timeout=300)
    assert results(proc).count("refused_without_dynamic_process_sets ok") == 4, proc.stdout[-4000:]
