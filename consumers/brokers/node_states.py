"""What `tidebatch broker --engine kafka` knows of each of its nodes: running, starting,
stopping, stopped or dead, since when, and why. Pure bookkeeping with the clock passed
in; the command (consumers/brokers/node_supervisor.py) does the signalling and
spawning and tells the book what happened, and the book says what to report.

    book = NodeBook([NodeInfo(1, 9092, Path("node-1/server.log")), ...], clock=time.monotonic)
    book.started(1, pid=4711); book.ready(1)        # "node 1 running (pid 4711, port 9092) ..."
    book.exited(2, -9)                               # "Apache Kafka node 2 died (killed by SIGKILL) ..."

States: STARTING (spawned, not yet registered with the controller), RUNNING, STOPPING
(SIGTERM sent: controlled shutdown), STOPPED (ended after `node stop`), DEAD (SIGKILLed
by `node kill`, or ended on its own: crashed, killed from outside, never became ready;
only the latter is `unasked`, and makes the command's end an error).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

STARTING = "starting"
RUNNING = "running"
STOPPING = "stopping"
STOPPED = "stopped"
DEAD = "dead"
# The states in which the node's JVM may still be alive.
LIVE = (STARTING, RUNNING, STOPPING)

ACTIONS = ("stop", "kill", "start")


def describe_exit(code: int) -> str:
    """A Popen return code as words: "exit code 1", "killed by SIGKILL"."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    if 128 < code < 128 + 32:
        # The JVM exits 128 + n when signal n ran its shutdown hooks (143: SIGTERM).
        with contextlib.suppress(ValueError):
            return f"exit code {code}, after {signal.Signals(code - 128).name}"
    return f"exit code {code}"


@dataclass(frozen=True)
class NodeInfo:
    """What does not change across a node's restarts."""

    node_id: int
    port: int
    log_path: Path


@dataclass
class NodeStatus:
    info: NodeInfo
    state: str = STOPPED
    pid: int | None = None
    since: float = 0.0  # clock time of the last change of state
    ended: str | None = None  # describe_exit of the last end
    asked: str | None = None  # the action whose end is awaited: "stop", "kill"
    deadline: float | None = None  # STARTING: ready by then; STOPPING: SIGKILL then
    note: str | None = None  # why the command SIGKILLed an overdue node
    unasked: bool = False  # DEAD on its own, not by `node kill`


class NodeBook:
    """The states of a cluster's nodes. start_timeout: a STARTING node not ready by then
    is overdue (killed, DEAD); stop_timeout: a STOPPING node still alive by then is
    overdue (SIGKILLed), as KafkaBroker.stop does (consumers/brokers/kafka.py)."""

    def __init__(
        self,
        nodes: Sequence[NodeInfo],
        clock: Callable[[], float],
        *,
        start_timeout: float,
        stop_timeout: float,
    ) -> None:
        if not nodes:
            raise ValueError("a NodeBook needs at least one node")
        self._clock = clock
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        now = clock()
        self._nodes = {info.node_id: NodeStatus(info, since=now) for info in nodes}

    # ------------------------------------------------------------ queries
    def status(self, node_id: int) -> NodeStatus:
        return self._nodes[node_id]

    @property
    def node_ids(self) -> list[int]:
        return sorted(self._nodes)

    @property
    def all_gone(self) -> bool:
        """No node's JVM is alive or on its way: the command has nothing left to run."""
        return all(s.state not in LIVE for s in self._nodes.values())

    @property
    def any_died(self) -> bool:
        """Did a node end without being asked to (crash, outside kill, failed start)?"""
        return any(s.state == DEAD and s.unasked for s in self._nodes.values())

    def refusal(self, action: str, node_id: int) -> str | None:
        """Why `action` cannot be done to `node_id` now; None when it can."""
        if action not in ACTIONS:
            return f"unknown action {action!r} (one of {', '.join(ACTIONS)})"
        if node_id not in self._nodes:
            return f"no node {node_id} (nodes: {', '.join(map(str, self.node_ids))})"
        state = self._nodes[node_id].state
        if action == "start" and state != STOPPED and state != DEAD:
            return f"node {node_id} is {state}, not stopped or dead"
        if action == "stop" and state != RUNNING:
            return f"node {node_id} is {state}, not running"
        if action == "kill" and state not in LIVE:
            return f"node {node_id} is {state} already"
        return None

    def overdue(self) -> list[tuple[int, str]]:
        """(node, why) for each node past its deadline: a start that never became ready,
        a stop still running after stop_timeout. The command SIGKILLs them."""
        now = self._clock()
        out = []
        for node_id, s in sorted(self._nodes.items()):
            if s.deadline is None or now < s.deadline:
                continue
            if s.state == STARTING:
                out.append((node_id, f"not ready within {self.start_timeout:g} s"))
            elif s.state == STOPPING:
                out.append((node_id, f"still running {self.stop_timeout:g} s after SIGTERM"))
        return out

    def snapshot(self) -> list[dict[str, object]]:
        """Each node as a JSON-able dict, for `tidebatch broker node status`."""
        now = self._clock()
        return [
            {
                "node": node_id, "state": s.state, "pid": s.pid if s.state in LIVE else None,
                "port": s.info.port, "for_s": round(now - s.since, 1), "ended": s.ended,
                "log": str(s.info.log_path),
            }
            for node_id, s in sorted(self._nodes.items())
        ]

    # ------------------------------------------------------------ events
    def started(self, node_id: int, pid: int) -> None:
        """The node's JVM was spawned (at command start, or by `node start`)."""
        s = self._nodes[node_id]
        self._enter(s, STARTING, deadline=self._clock() + self.start_timeout)
        s.pid = pid
        s.asked = None
        s.unasked = False

    def ready(self, node_id: int) -> str:
        """The node is registered and answers metadata: the line to print."""
        s = self._nodes[node_id]
        took = self._clock() - s.since
        self._enter(s, RUNNING)
        return f"Apache Kafka node {node_id} running (pid {s.pid}, port {s.info.port}), ready in {took:.1f} s"

    def stopping(self, node_id: int) -> None:
        """SIGTERM was sent (node stop): a controlled shutdown, data kept."""
        s = self._nodes[node_id]
        self._enter(s, STOPPING, deadline=self._clock() + self.stop_timeout)
        s.asked = "stop"

    def killing(self, node_id: int) -> None:
        """SIGKILL was sent (node kill, or an overdue node): its end is expected."""
        s = self._nodes[node_id]
        s.asked = "kill"
        s.deadline = None

    def exited(self, node_id: int, code: int, detail: str | None = None) -> str:
        """The node's JVM ended with Popen return code `code`; detail: the telling line
        of its log, if any. The one line to print, naming the node, how it ended and its
        own log."""
        s = self._nodes[node_id]
        now = self._clock()
        was, asked, lasted = s.state, s.asked, now - s.since
        how = describe_exit(code)
        s.ended = how
        log = s.info.log_path
        if s.note:
            how = f"{how}: {s.note}"
        elif detail and asked is None:
            how = f"{how}: {detail}"  # an end nobody asked for: the log may say why
        if asked == "stop" and was == STOPPING:
            self._enter(s, STOPPED)
            return f"Apache Kafka node {node_id} stopped as asked ({how}) in {lasted:.1f} s; data kept; log: {log}"
        if asked == "kill":
            self._enter(s, DEAD)
            return f"Apache Kafka node {node_id} killed as asked ({how}); data kept; log: {log}"
        self._enter(s, DEAD)
        s.unasked = True
        during = " while starting" if was == STARTING else ""
        return f"Apache Kafka node {node_id} died{during} ({how}); data kept; log: {log}"

    def forced(self, node_id: int, why: str) -> None:
        """An overdue node (see overdue) was SIGKILLed. A start that never became ready
        ends DEAD; a stop that hung ends STOPPED; the exit line says why either way."""
        s = self._nodes[node_id]
        if s.state == STARTING:
            s.asked = None
        s.deadline = None
        s.note = why

    def _enter(self, s: NodeStatus, state: str, deadline: float | None = None) -> None:
        s.state = state
        s.since = self._clock()
        s.deadline = deadline
        if state not in LIVE:
            s.asked = None
            s.note = None


def ending_line(book: NodeBook, reason: str) -> str:
    """The command's last line: why it ends and each node's last state."""
    parts = []
    for node_id in book.node_ids:
        s = book.status(node_id)
        how = f" ({s.ended}{'' if s.unasked else ', as asked'})" if s.ended and s.state == DEAD else ""
        parts.append(f"node {node_id} {s.state}{how}")
    return f"{reason}: " + ", ".join(parts)
