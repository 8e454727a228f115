"""How the suite is spread over pytest-xdist workers: scripts/test.sh runs
`-n 3 --dist loadgroup` (README "Tests"). Without xdist nothing here changes a run.

A worker takes a group of tests whole:
- a module, so a module's tests run in order on one worker and its module-scoped
  fixtures (a broker, a trained model) start once;
- FAULTS, the fault tests, which kill brokers, cut network links and pause workers for
  minutes of steady traffic: one worker runs them one after the other, as a serial run
  does, while the other workers take everything else. Side by side they would put two
  3-node clusters and their workers on the 2 cores CI has.
The fault group goes first: it is the longest chain, and what the other workers have
left when it ends are short tests.

xdist's own loadgroup reads `xdist_group` marks by renaming nodeids, which pytest 9.2
no longer lets it do (a node's id is no longer `_nodeid`), so the groups are made here,
from the nodeids, by the scheduler that `--dist loadgroup` gets.
"""

from __future__ import annotations

from typing import Any

import pytest

FAULTS = "faults"
# Modules whose every test is a fault test...
FAULT_MODULES = frozenset({
    "tests/integration/test_broker_nodes.py",
    "tests/integration/test_cluster_faults.py",
    "tests/integration/test_exactly_once.py",
    "tests/integration/test_network_faults.py",
})
# ... and fault tests of other modules (nodeid without parameters).
FAULT_TESTS = frozenset({
    "tests/integration/test_kafka_broker.py::test_three_nodes_lose_nothing_when_a_partition_leader_is_killed",
})


def group_of(nodeid: str) -> str:
    """The group of a test: FAULTS, or its module's path."""
    module = nodeid.split("::", 1)[0]
    if module in FAULT_MODULES or nodeid.split("[", 1)[0] in FAULT_TESTS:
        return FAULTS
    return module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under --dist loadgroup: the fault tests first, then the rest as
    collected; the scheduler queues groups in this order. Among the fault tests, those on
    the 3-node `kafka_cluster` come first, one after the other, so that they share one
    cluster (tests/integration/conftest.py keeps it while consecutive tests use it)."""
    if getattr(config.option, "loadgroup", False):  # set on workers only, from --dist
        items.sort(key=lambda item: (group_of(item.nodeid) != FAULTS, "kafka_cluster" not in item.fixturenames))


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # the hook exists only with xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """LoadScopeScheduling with group_of() as the scope, queued in collection order
        (not sorted by test count, xdist's default: that would not put FAULTS first)."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)
