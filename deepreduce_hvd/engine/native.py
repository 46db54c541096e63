"""Loads the optional C++ engine (`deepreduce_hvd._native`, built from csrc/).

Every kernel has a numpy twin that gives identical bytes, so the engine only changes speed.
Set DEEPREDUCE_NATIVE=0 to force the numpy path.
"""
import os
import warnings

engine = None
if os.environ.get("DEEPREDUCE_NATIVE", "1") != "0":
    try:
        from .. import _native as engine
    except ImportError as exc:  # the extension failed to build or load
        warnings.warn(f"deepreduce_hvd: C++ engine unavailable ({exc}); using the numpy path "
                      "(same bytes, slower)", RuntimeWarning, stacklevel=2)


def backend():
    """'native' when the C++ engine is loaded, else 'numpy'."""
    return "native" if engine is not None else "numpy"


# what launchers set for the ranks on this host (horovodrun, Open MPI, Slurm)
LOCAL_SIZE_VARIABLES = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def cores_per_rank(environ=os.environ, cpus=None):
    """This host's cores over its ranks (at least 1): the threads one rank's kernels may use.
    Every rank of a step decodes at the same moment, so worker threads beyond this share
    cores with the other ranks and slow them all (4 ranks on 2 cores: one 4M-element
    allgather's decode took 16.9 ms a step on two threads, 7.8 ms on one)."""
    cpus = cpus or os.cpu_count() or 1
    for name in LOCAL_SIZE_VARIABLES:
        try:
            ranks = int(environ.get(name, "").split("(")[0])
        except ValueError:
            continue
        if ranks > 0:
            return max(1, cpus // ranks)
    return cpus
