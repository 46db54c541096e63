"""The jobs' closing line: a run against a recorded dense run, only when the two are comparable."""
from history import History

ARGS = {"model": "resnet20", "ranks": 2, "epochs": 2, "batch_size": 32, "lr": 0.05, "seed": 0}


def run(path, compression, accuracy, mb_per_epoch, **changed):
    history = History(0, path, {**ARGS, "compression": compression, **changed})
    for epoch in (1, 2):
        history.add(epoch, {"test_accuracy": accuracy}, epoch * mb_per_epoch * 1e6,
                    epoch * 24e6, 1.0)
    return history


def test_closing_line_against_recorded_dense_run(tmp_path, capsys):
    dense = tmp_path / "dense.json"
    run(dense, "none", 0.98, 24).save()
    run(None, "deepreduce", 0.97, 0.5).compare(dense)
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("vs dense fp32 (recorded in ")
    assert "test accuracy 0.9700 vs 0.9800" in line
    assert "1.00 MB vs 48.00 MB sent (48.0x less)" in line


def test_no_comparison_with_another_run_length(tmp_path, capsys):
    dense = tmp_path / "dense.json"
    run(dense, "none", 0.98, 24).save()
    run(None, "deepreduce", 0.97, 0.5, epochs=3, seed=1).compare(dense)
    assert "has epochs 2, seed 0" in capsys.readouterr().out
    run(None, "deepreduce", 0.97, 0.5).compare(tmp_path / "missing.json")
    assert "no dense baseline recorded" in capsys.readouterr().out
