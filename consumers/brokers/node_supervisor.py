"""The foreground loop of `tidebatch broker --engine kafka` (pipeline/commands/broker.py):
watch each node, report one that ends (one line: the node, how it ended, its own log),
and carry out `tidebatch broker node stop|kill|start N` requests (consumers/brokers/
node_control.py), keeping every node's data until the command ends. It returns when
asked to stop (SIGINT/SIGTERM set `stop`) or when no node is left.

Everything runs on the calling (main) thread, one tick every TICK_S: signals and spawns
never wait here, the book (consumers/brokers/node_states.py) keeps the deadlines.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_fetch import KafkaBrokerError
from consumers.brokers.kafka_node import failure_line
from consumers.brokers.node_control import ControlError, ControlFiles, parse_request
from consumers.brokers.node_states import LIVE, STARTING, NodeBook, NodeInfo

TICK_S = 0.5


def supervise(
    kafka: KafkaBroker,
    stop: threading.Event,
    say: Callable[[str], None],
    *,
    clock: Callable[[], float] = time.monotonic,
    tick_s: float = TICK_S,
) -> NodeBook:
    """Run until `stop` is set or every node is gone; the book of the nodes' last states
    (book.all_gone tells which). `kafka` is started: every node is running."""
    book = NodeBook(
        [NodeInfo(n.node_id, n.port, n.log_path) for n in kafka.nodes], clock,
        start_timeout=kafka.start_timeout, stop_timeout=kafka.stop_timeout,
    )
    for node in kafka.nodes:
        assert node.proc is not None
        book.started(node.node_id, node.proc.pid)
        book.ready(node.node_id)  # start() returned: all registered
    control = ControlFiles(kafka.workdir)
    control.open()
    status = {"bootstrap_servers": kafka.bootstrap_servers, "workdir": str(kafka.workdir)}
    control.write_status({**status, "nodes": book.snapshot()})
    try:
        while not stop.wait(tick_s):
            replies = [(rid, *_handle(kafka, book, text)) for rid, text in control.take_requests()]
            _watch(kafka, book, say)
            control.write_status({**status, "nodes": book.snapshot()})
            # After the status: a client that reads it on the reply sees the new state.
            for rid, ok, message in replies:
                control.reply(rid, ok, message)
            if book.all_gone:
                break
    finally:
        control.close()
    return book


def _handle(kafka: KafkaBroker, book: NodeBook, text: str) -> tuple[bool, str]:
    """Carry out one request: (ok, the message for the client)."""
    try:
        action, node_id = parse_request(text)
    except ControlError as exc:
        return False, str(exc)
    refusal = book.refusal(action, node_id)
    if refusal is not None:
        return False, refusal
    if action == "stop":
        kafka.signal_node(node_id, signal.SIGTERM)
        book.stopping(node_id)
        return True, f"stopping node {node_id} (SIGTERM: controlled shutdown)"
    if action == "kill":
        kafka.signal_node(node_id, signal.SIGKILL)
        book.killing(node_id)
        return True, f"killed node {node_id} (SIGKILL)"
    try:
        node = kafka.start_node(node_id)
    except KafkaBrokerError as exc:
        return False, f"cannot start node {node_id}: {exc}"
    assert node.proc is not None
    book.started(node_id, node.proc.pid)
    return True, f"starting node {node_id} (pid {node.proc.pid}, port {node.port})"


def _watch(kafka: KafkaBroker, book: NodeBook, say: Callable[[str], None]) -> None:
    """Report ends and readiness; SIGKILL what is overdue."""
    for node_id in book.node_ids:
        if book.status(node_id).state not in LIVE:
            continue
        code = kafka.exit_code(node_id)
        if code is not None:
            say(book.exited(node_id, code, failure_line(kafka.node(node_id).log_path) if code > 0 else None))
        elif book.status(node_id).state == STARTING and kafka.node_ready(node_id):
            say(book.ready(node_id))
    for node_id, why in book.overdue():
        kafka.signal_node(node_id, signal.SIGKILL)
        book.forced(node_id, why)
