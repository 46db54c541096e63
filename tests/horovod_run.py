"""Launch a worker script on 2 real Horovod ranks over Gloo, with a time limit."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


def horovodrun(script, *args, np_=2, timeout=300, env=None, hosts=None):
    """Run script (a path, or a name in WORKERS) with horovodrun; returns CompletedProcess
    (stdout and stderr merged). hosts: horovodrun's -H (default all on localhost); e.g.
    "localhost:2,127.0.0.1:2" makes Horovod see two hosts of two ranks on this machine."""
    runner = Path(sys.executable).parent / "horovodrun"
    cmd = [str(runner), "-np", str(np_), "-H", hosts or f"localhost:{np_}", "--gloo",
           sys.executable, str(WORKERS / script), *map(str, args)]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "3", "HOROVOD_CYCLE_TIME": "1", **(env or {})}
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def results(proc):
    """The RESULT lines a worker printed (rank-prefixed by horovodrun)."""
    return [line.split("RESULT ", 1)[1] for line in proc.stdout.splitlines() if "RESULT " in line]


def train_history(script, tmp_path, tag, *args, epochs):
    """Run a training job (torch/ or tf/ train_digits.py) and return rank 0's history."""
    out = tmp_path / f"{tag}.json"
    proc = horovodrun(ROOT / script, "--no-progress", "--epochs", epochs, "--json", out, *args,
                      timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return json.loads(out.read_text())["history"]


def assert_accuracy_close(dense, sparse, points=0.02):
    """Best of the last three epochs within `points` of dense, and far fewer bytes sent."""
    best_dense = max(e["test_accuracy"] for e in dense[-3:])
    best_sparse = max(e["test_accuracy"] for e in sparse[-3:])
    assert best_sparse >= best_dense - points, (dense[-3:], sparse[-3:])
    assert sparse[-1]["mb_sent"] < sparse[-1]["mb_dense"] / 5
