"""How long a kafka-python worker source waits for its first partitions, on a topic
created just before it starts, with and without busy processes on the cores.

    .venv/bin/python bench/kafka_python_join.py [--rounds 25] [--hogs 2] [--no-prefetch]

Each round creates a 2-partition topic on a local one-node Apache Kafka, starts a
KafkaPythonSource (consumers/kafka_python_backend.py) in a new group and polls until
it owns partitions, or `--give-up` seconds pass. `--no-prefetch` subscribes the way the
source did before it fetched its topics' metadata first: then, under load, a round now
and then never gets partitions (the leader assigned before the metadata arrived).
The hogs are separate busy-loop processes: their CPU share is the point, not a cost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.harness import local_broker  # noqa: E402
from consumers.kafka_python_backend import KafkaPythonSource  # noqa: E402
from consumers.profiles import KAFKA, kafka_python_consumer_config  # noqa: E402


def _hog() -> None:
    while True:
        pass


class _NoPrefetch:
    """A KafkaConsumer whose partitions_for_topic does nothing: the old subscribe path."""

    def __new__(cls, **config):
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(**config)
        consumer.partitions_for_topic = lambda _topic: None
        return consumer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--hogs", type=int, default=2, help="busy-loop processes during the rounds")
    ap.add_argument("--give-up", type=float, default=30.0, help="seconds before a round counts as never assigned")
    ap.add_argument("--no-prefetch", action="store_true", help="subscribe without fetching metadata first")
    args = ap.parse_args()
    factory = _NoPrefetch if args.no_prefetch else None
    waits: list[float] = []
    never = 0
    with local_broker("kafka") as broker:
        hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
        for h in hogs:
            h.start()
        try:
            for i in range(args.rounds):
                topic = f"join-{uuid.uuid4().hex[:10]}"
                broker.create_topics({topic: 2})
                config = kafka_python_consumer_config(KAFKA, broker.bootstrap_servers, f"g-{topic}")
                owned: list = []
                kwargs = {"consumer_factory": factory} if factory else {}
                source = KafkaPythonSource(config, [topic], owned.extend, lambda _tps: None, **kwargs)
                start = time.monotonic()
                while not owned and time.monotonic() - start < args.give_up:
                    source.poll_batch(100, 0.1)
                waited = time.monotonic() - start
                source.close()
                if owned:
                    waits.append(waited)
                else:
                    never += 1
                print(f"round {i + 1}: {f'{waited:.2f} s' if owned else 'never assigned'}", flush=True)
        finally:
            for h in hogs:
                h.terminate()
    waits.sort()
    median = waits[len(waits) // 2] if waits else float("nan")
    print(
        f"prefetch={'off' if args.no_prefetch else 'on'} hogs={args.hogs}: {never}/{args.rounds} never assigned "
        f"within {args.give_up:.0f} s; median first assignment {median:.2f} s"
    )


if __name__ == "__main__":
    main()
