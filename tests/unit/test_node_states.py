"""The node bookkeeping of `tidebatch broker --engine kafka` (consumers/brokers/node_states.py):
states, the line for each end (the node, how it ended, ITS log), deadlines on a fake clock."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from consumers.brokers.node_states import (
    DEAD,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    NodeBook,
    NodeInfo,
    describe_exit,
    ending_line,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def logs(n: int) -> Path:
    return Path(f"/w/node-{n}/server.log")


def running_book(clock: Clock, nodes: int = 3) -> NodeBook:
    book = NodeBook([NodeInfo(n, 9000 + n, logs(n)) for n in range(1, nodes + 1)], clock,
                    start_timeout=90.0, stop_timeout=20.0)
    for n in range(1, nodes + 1):
        book.started(n, 4000 + n)
        book.ready(n)
    return book


def test_exit_codes_in_words() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(143) == "exit code 143, after SIGTERM"  # the JVM's own SIGTERM exit


def test_a_node_that_dies_is_named_with_its_own_log_and_the_rest_run_on() -> None:
    """The command used to stop everything and name node 1's log when node 2 died."""
    clock = Clock()
    book = running_book(clock)
    clock.now += 35.0
    line = book.exited(2, -signal.SIGKILL)
    assert line == "Apache Kafka node 2 died (killed by SIGKILL); data kept; log: /w/node-2/server.log"
    assert book.status(2).state == DEAD and book.status(2).ended == "killed by SIGKILL"
    assert [book.status(n).state for n in (1, 3)] == [RUNNING, RUNNING]
    assert not book.all_gone and book.any_died


def test_a_crash_quotes_the_telling_line_of_the_log() -> None:
    book = running_book(Clock())
    line = book.exited(3, 1, "java.io.IOException: No space left on device")
    assert "died (exit code 1: java.io.IOException: No space left on device)" in line
    assert line.endswith("log: /w/node-3/server.log")


def test_stop_as_asked_then_start_again() -> None:
    clock = Clock()
    book = running_book(clock)
    assert book.refusal("stop", 2) is None
    book.stopping(2)
    assert book.status(2).state == STOPPING
    clock.now += 2.5
    line = book.exited(2, 143, "some old ERROR line")  # not quoted: this end was asked for
    assert line == ("Apache Kafka node 2 stopped as asked (exit code 143, after SIGTERM) in 2.5 s; "
                    "data kept; log: /w/node-2/server.log")
    assert book.status(2).state == STOPPED and not book.any_died
    assert book.refusal("stop", 2) == "node 2 is stopped, not running"
    assert book.refusal("start", 2) is None
    book.started(2, 5002)
    assert book.refusal("start", 2) == "node 2 is starting, not stopped or dead"
    clock.now += 11.0
    assert book.ready(2) == "Apache Kafka node 2 running (pid 5002, port 9002), ready in 11.0 s"


def test_a_kill_as_asked_is_not_a_death() -> None:
    book = running_book(Clock())
    book.killing(1)
    assert book.exited(1, -9) == ("Apache Kafka node 1 killed as asked (killed by SIGKILL); data kept; "
                                  "log: /w/node-1/server.log")
    assert book.status(1).state == DEAD and not book.any_died
    assert book.refusal("kill", 1) == "node 1 is dead already"


def test_a_dead_node_can_be_started_again() -> None:
    book = running_book(Clock())
    book.exited(2, -9)
    assert book.refusal("start", 2) is None
    book.started(2, 6000)
    assert book.status(2).state == STARTING and book.status(2).pid == 6000
    assert not book.any_died  # it is back


def test_when_every_node_was_stopped_or_killed_as_asked_none_died() -> None:
    book = running_book(Clock())
    book.killing(1)
    book.exited(1, -9)
    for n in (2, 3):
        book.stopping(n)
        book.exited(n, 143)
    assert book.all_gone and not book.any_died


def test_unknown_nodes_and_actions_are_refused() -> None:
    book = running_book(Clock())
    assert book.refusal("start", 4) == "no node 4 (nodes: 1, 2, 3)"
    assert book.refusal("reboot", 1) == "unknown action 'reboot' (one of stop, kill, start)"
    assert book.refusal("start", 1) == "node 1 is running, not stopped or dead"


def test_a_stop_that_hangs_is_overdue_after_the_stop_timeout() -> None:
    clock = Clock()
    book = running_book(clock)
    book.stopping(3)
    clock.now += 19.9
    assert book.overdue() == []
    clock.now += 0.1
    assert book.overdue() == [(3, "still running 20 s after SIGTERM")]
    book.forced(3, "still running 20 s after SIGTERM")
    assert book.overdue() == []
    line = book.exited(3, -9)
    assert "stopped as asked (killed by SIGKILL: still running 20 s after SIGTERM)" in line
    assert book.status(3).state == STOPPED


def test_a_start_that_never_gets_ready_ends_dead() -> None:
    clock = Clock()
    book = running_book(clock)
    book.exited(1, -9)
    book.started(1, 7001)
    clock.now += 90.0
    assert book.overdue() == [(1, "not ready within 90 s")]
    book.forced(1, "not ready within 90 s")
    line = book.exited(1, -9)
    assert line.startswith("Apache Kafka node 1 died while starting (killed by SIGKILL: not ready within 90 s)")
    assert book.status(1).state == DEAD and book.any_died


def test_all_gone_only_when_no_node_is_alive_or_on_its_way() -> None:
    book = running_book(Clock())
    book.exited(1, -9)
    book.killing(2)
    book.exited(2, -9)
    book.stopping(3)
    assert not book.all_gone  # still stopping
    book.exited(3, 143)
    assert book.all_gone
    assert ending_line(book, "no node left") == (
        "no node left: node 1 dead (killed by SIGKILL), node 2 dead (killed by SIGKILL, as asked), "
        "node 3 stopped"
    )
    assert book.any_died


def test_the_snapshot_has_what_node_status_prints() -> None:
    clock = Clock()
    book = running_book(clock, nodes=1)
    clock.now += 3.25
    assert book.snapshot() == [{
        "node": 1, "state": RUNNING, "pid": 4001, "port": 9001, "for_s": 3.2, "ended": None,
        "log": "/w/node-1/server.log",
    }]
    book.exited(1, -9)
    assert book.snapshot()[0]["pid"] is None and book.snapshot()[0]["state"] == DEAD


def test_a_book_needs_nodes() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        NodeBook([], Clock(), start_timeout=1.0, stop_timeout=1.0)
