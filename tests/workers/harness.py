"""What every worker shares: its checks are its `check_*` functions, each runs under a
watchdog, and each rank records every outcome as a JSON line that the pytest side reads
(tests/horovod_run.py), so a check cannot pass by printing and cannot be skipped unnoticed.

    if __name__ == "__main__":
        harness.main(globals())

runs the checks named on the command line (every check, in file order, if none). A check
fails by raising; the worker then ends (its ranks may be stuck in a collective), and the
pytest side runs the checks after it in a fresh job. A check that hangs past CHECK_TIMEOUT
seconds dumps every thread's stack and ends the worker.
"""
import faulthandler
import json
import os
import sys
import time
import traceback

import numpy as np

RESULTS = "DEEPREDUCE_RESULTS"  # the folder each rank writes <rank>.jsonl into
DENSE = "dense"
_hvd = None  # the worker's horovod.torch or horovod.tensorflow (bind)


def bind(hvd):
    """The Horovod module the shared assertions gather with."""
    global _hvd
    _hvd = hvd


def init_with_process_sets(hvd):
    """hvd.init with two process sets, the even ranks and the odd ranks: registered at init
    (Horovod 0.28's static process sets) or, with HOROVOD_DYNAMIC_PROCESS_SETS=1, added after
    it with hvd.add_process_set, as Horovod's own test does. -> (even, odd)."""
    size = int(os.environ["HOROVOD_SIZE"])
    if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1":
        hvd.init()
        return hvd.add_process_set(range(0, size, 2)), hvd.add_process_set(range(1, size, 2))
    even, odd = hvd.ProcessSet(range(0, size, 2)), hvd.ProcessSet(range(1, size, 2))
    hvd.init(process_sets=[even, odd])
    return even, odd


def checks(namespace):
    """{name: function} of a worker's check_* functions, in file order."""
    return {name[len("check_"):]: fn for name, fn in namespace.items()
            if name.startswith("check_") and callable(fn)}


def record(check, ok, detail="", seconds=0.0, rank=None):
    """Append one outcome to this rank's results file (and say it on stdout)."""
    rank = int(os.environ.get("HOROVOD_RANK", "0")) if rank is None else rank
    line = {"check": check, "ok": ok, "rank": rank, "seconds": round(seconds, 3), "detail": detail}
    folder = os.environ.get(RESULTS)
    if folder:
        with open(os.path.join(folder, f"{rank}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")
    print(f"check {check}: {'ok' if ok else 'FAILED'} on rank {rank}", flush=True)


def main(namespace, finish=None):
    """Run the checks (see the module docstring); finish(): called after the last one."""
    found = checks(namespace)
    names = sys.argv[1:] or list(found)
    unknown = [name for name in names if name not in found]
    if unknown:
        sys.exit(f"no such checks: {unknown}")
    timeout = float(os.environ.get("CHECK_TIMEOUT", "600"))
    for name in names:
        faulthandler.dump_traceback_later(timeout, exit=True)
        start = time.perf_counter()
        try:
            found[name]()
        except BaseException:  # noqa: BLE001 - recorded; the pytest side shows it
            record(name, False, traceback.format_exc()[-4000:], time.perf_counter() - start)
            sys.stdout.flush()
            os._exit(1)  # other ranks may wait in a collective: end the job
        finally:
            faulthandler.cancel_dump_traceback_later()
        record(name, True, "", time.perf_counter() - start)
    if finish is not None:
        finish()


# ---- assertions the workers share ----
def same_within(values, what="", groups=None):
    """`values` (a dict of arrays, or one array) identical on every rank of each group (every
    rank calls this; default: one group, the whole world)."""
    everyone = _hvd.allgather_object(values)
    for members in groups or [list(range(len(everyone)))]:
        first = everyone[members[0]]
        for other in members[1:]:
            theirs = everyone[other]
            if isinstance(first, dict):
                assert theirs.keys() == first.keys(), what
                for key in first:
                    np.testing.assert_array_equal(theirs[key], first[key],
                                                  err_msg=f"{what}: {key} rank {other} vs {members[0]}")
            else:
                np.testing.assert_array_equal(theirs, first, err_msg=f"{what}: rank {other} vs {members[0]}")


def assert_close(want, got, what, rtol=1e-5, atol=1e-6):
    """Two dicts of arrays (DeepReduce's result against dense Horovod's) agree."""
    assert want.keys() == got.keys(), (what, sorted(want), sorted(got))
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key], dtype=np.float64),
                                   np.asarray(want[key], dtype=np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"{what}: {key} (DeepReduce vs dense)")


def assert_compressed(compression, what, expected=True):
    """DeepReduce encoded tensors (or, expected=False, was never run); none passed through."""
    stats = compression.stats()
    assert (stats["tensors_compressed"] > 0) == expected, (what, stats)
    assert stats["tensors_passed_through"] == 0, (what, stats)


def both(run):
    """run(kind) with dense Horovod and with DeepReduce; returns the two results."""
    return run(DENSE), run("deepreduce")
