"""Elastic Horovod with DeepReduce (tests/workers/elastic.py), PyTorch and TensorFlow: a job
that goes from 2 ranks to 1 and back to 2, and one that loses a worker in the middle of a
step, both finish with identical parameters on every rank, and nothing hangs.

One machine plays two hosts: the discovery script lists "localhost" and "127.0.0.1", which
Horovod treats as two hosts on this machine; elastic horovodrun needs --network-interface lo
here (without it no rank starts)."""
import subprocess
import sys

import pytest

from horovod_run import NOISE, RUNNER, WORKERS, read_results, run_job

pytestmark = [pytest.mark.horovod, pytest.mark.torch, pytest.mark.tensorflow]


@pytest.mark.parametrize("scenario", ["resize", "kill"])
@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_elastic_job_finishes_with_identical_parameters(framework, scenario, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    cmd = [str(RUNNER), "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(discover), "--network-interface", "lo", "--gloo",
           sys.executable, str(WORKERS / "elastic.py")]
    env = {"DEEPREDUCE_FRAMEWORK": framework, "DEEPREDUCE_SCENARIO": scenario,
           "DEEPREDUCE_HOSTS": str(hosts), "DEEPREDUCE_RESULTS": str(tmp_path)}
    try:
        output = run_job(cmd, 600, env).stdout
    except subprocess.TimeoutExpired as exc:
        output = (exc.output or "") + "\n[timed out: a hang]"
    output = "\n".join(line for line in output.splitlines() if not any(n in line for n in NOISE))
    results = [r for r in read_results(tmp_path) if r["check"] == f"elastic_{scenario}"]
    assert sorted(r["rank"] for r in results if r["ok"]) == [0, 1], (results, output[-6000:])
