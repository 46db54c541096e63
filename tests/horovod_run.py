"""Launch a worker script on 2 real Horovod ranks over Gloo, with a time limit."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


def horovodrun(script, *args, np_=2, timeout=300, env=None):
    """Run script (a path, or a name in WORKERS) with horovodrun; returns CompletedProcess
    (stdout and stderr merged)."""
    runner = Path(sys.executable).parent / "horovodrun"
    cmd = [str(runner), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
           sys.executable, str(WORKERS / script), *map(str, args)]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "3", "HOROVOD_CYCLE_TIME": "1", **(env or {})}
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def results(proc):
    """The RESULT lines a worker printed (rank-prefixed by horovodrun)."""
    return [line.split("RESULT ", 1)[1] for line in proc.stdout.splitlines() if "RESULT " in line]
