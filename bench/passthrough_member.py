"""One member of a Kafka passthrough group: consume and produce the same records, no
decoding, no model (bench/processes_scale.py runs N of them beside `tidebatch run
--processes N`, the ceiling the brokers and the clients allow at that N).

    python bench/passthrough_member.py --bootstrap B --profile P --input T --output T2 --group G --ready FILE

It writes the number of partitions it holds to FILE after every assignment, so the
bench starts the backlog only once the group has settled; SIGTERM flushes and leaves.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, Producer  # noqa: E402

from consumers.profiles import consumer_config, producer_config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--profile", "--input", "--output", "--group", "--ready"):
        ap.add_argument(flag, required=True)
    args = ap.parse_args()
    consumer = Consumer(consumer_config(args.profile, args.bootstrap, args.group))
    producer = Producer(producer_config(args.profile, args.bootstrap))
    held: set[tuple[str, int]] = set()

    def record(change: str, parts: list) -> None:
        for tp in parts:
            (held.add if change == "add" else held.discard)((tp.topic, tp.partition))
        Path(args.ready).write_text(str(len(held)))

    consumer.subscribe([args.input], on_assign=lambda _c, p: record("add", p), on_revoke=lambda _c, p: record("drop", p),
                       on_lost=lambda _c, p: record("drop", p))
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    while running[0]:
        for m in consumer.consume(1000, timeout=0.05):
            if m.error():
                continue
            while True:
                try:
                    producer.produce(args.output, m.value(), m.key())
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    producer.flush(30)
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
