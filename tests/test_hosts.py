"""The hierarchical mode's view of hosts: contiguous ranks per host, one leader each."""
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.comm.hosts import topology


def placements(*sizes):
    """(rank, first rank of its host) for hosts of these sizes, in a shuffled order."""
    out, first = [], 0
    for size in sizes:
        out += [(first + i, first) for i in range(size)]
        first += size
    return out[::-1]


def test_two_hosts_of_two():
    hosts = topology(placements(2, 2), rank=3)
    assert hosts.local == (2, 3) and hosts.leader == 2
    assert hosts.leaders == (0, 2) and hosts.hosts == ((0, 1), (2, 3))
    assert hosts.spans_hosts


@pytest.mark.parametrize("sizes, spans", [((4,), False), ((1, 1, 1), False), ((3, 1), True),
                                          ((2, 2, 2), True)])
def test_the_hierarchy_applies_only_across_hosts_with_several_ranks(sizes, spans):
    assert topology(placements(*sizes), rank=0).spans_hosts is spans


def test_ranks_that_do_not_form_hosts_are_refused():
    with pytest.raises(dr.DeepReduceError, match="not contiguous"):
        topology([(0, 0), (1, 1), (2, 0), (3, 1)], rank=0)
    with pytest.raises(dr.DeepReduceError, match="do not form hosts"):
        topology([(0, 0), (2, 0)], rank=0)
