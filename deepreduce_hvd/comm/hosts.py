"""Which ranks share a host: the topology of the hierarchical mode.

Inside a host the link is fast (shared memory, NVLink, loopback) and a dense allreduce is
cheap; between hosts it is slow, and only there do compressed payloads pay. The hierarchical
mode reduces densely inside each host, exchanges payloads between one leader per host, and
shares the result inside the host again. Horovod numbers the ranks of a host contiguously
(rank - local_rank is the host's first rank), which is what identifies a host here.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple

from ..errors import DeepReduceError


class Hosts(NamedTuple):
    """This rank's view of the job's hosts."""
    local: Tuple[int, ...]    # the ranks of this rank's host, ascending
    leaders: Tuple[int, ...]  # the first rank of every host, ascending
    hosts: Tuple[Tuple[int, ...], ...]  # every host's ranks, in the order of their leaders

    @property
    def leader(self) -> int:
        return self.local[0]

    @property
    def spans_hosts(self) -> bool:
        """Whether the hierarchy helps: several hosts, and several ranks on some host."""
        return len(self.hosts) > 1 and any(len(host) > 1 for host in self.hosts)


def topology(placements: Sequence[Tuple[int, int]], rank: int) -> Hosts:
    """placements: (rank, rank - local_rank) of every rank (as allgathered) -> Hosts."""
    by_host = {}
    for member, first in sorted(placements):
        by_host.setdefault(first, []).append(member)
    hosts = tuple(tuple(ranks) for _, ranks in sorted(by_host.items()))
    if sorted(r for host in hosts for r in host) != list(range(len(placements))):
        raise DeepReduceError(f"ranks do not form hosts: {sorted(placements)}")
    for first, ranks in zip(sorted(by_host), hosts):
        if ranks != tuple(range(first, first + len(ranks))):
            raise DeepReduceError(f"host starting at rank {first} holds ranks {list(ranks)}: "
                                  "Horovod's local ranks are not contiguous")
    local = next((host for host in hosts if rank in host), None)
    if local is None:
        raise DeepReduceError(f"rank {rank} is on no host of {hosts}")
    return Hosts(local, tuple(host[0] for host in hosts), hosts)
