"""The process sets of the hierarchical mode: one per host, and one of the hosts' leaders.

Inside a host the link is fast and a dense allreduce is cheap; between hosts only payloads
travel. Every rank adds every set, in the same order (Horovod's dynamic process sets).
"""
import os

from ..errors import DeepReduceError
from .hosts import topology


class Hierarchy:
    """This rank's hosts (hosts.Hosts) and the process sets of its host and of the leaders."""

    def __init__(self, hosts, adapter):
        if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") != "1":
            raise DeepReduceError("DeepReduce(hierarchical=True) adds process sets for the hosts: "
                                  "run with HOROVOD_DYNAMIC_PROCESS_SETS=1 or "
                                  "hvd.init(process_sets=\"dynamic\")")
        self.hosts, sets = hosts, {}
        try:
            for ranks in (*hosts.hosts, hosts.leaders):
                if len(ranks) > 1:
                    sets[ranks] = adapter.add_process_set(ranks)
        except ValueError as exc:
            raise DeepReduceError(f"hierarchical mode: {exc} (remove it, or run flat)") from exc
        self.local = sets.get(hosts.local)
        self.leaders = sets[hosts.leaders]
        self.is_leader = adapter.rank() == hosts.leader


def discover(adapter, process_set):
    """The job's Hierarchy, or None when it runs on one host or with one rank per host."""
    placements = adapter.allgather_numbers(adapter.host_placement(), process_set, "DeepReduce.hosts")
    hosts = topology([(int(rank), int(first)) for rank, first in placements], adapter.rank())
    return Hierarchy(hosts, adapter) if hosts.spans_hosts else None
