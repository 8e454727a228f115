"""The loop a user writes first with confluent-kafka (the client tidebatch uses):

- `--mode poll`: `poll()` one request, one ONNX Runtime call for it, produce;
- `--mode consume64` / `consume512`: `consume(64 or 512, timeout=10 ms)`, one ONNX
  Runtime call for the whole list, produce each result.

librdkafka's auto commit (every 5 s, of what was polled), no dead-letter topic, no
backpressure: what confluent-kafka's own consumer example does
(https://docs.confluent.io/kafka-clients/python/current/overview.html, "Basic poll
loop"), with the model call in the middle.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Scorer, client_settings, parse_args  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402

MODES = {"poll": 1, "consume64": 64, "consume512": 512}


def main() -> int:
    args = parse_args(__doc__ or "", list(MODES))
    consumer_conf, producer_conf = client_settings(args.profile)
    consumer = Consumer({**consumer_conf, "bootstrap.servers": args.bootstrap, "group.id": args.group})
    producer = Producer({**producer_conf, "bootstrap.servers": args.bootstrap})
    scorer = Scorer(args.threads)
    consumer.subscribe([args.input])
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    size = MODES[args.mode]
    while running[0]:
        msgs = [consumer.poll(1.0)] if size == 1 else consumer.consume(size, timeout=0.01)
        msgs = [m for m in msgs if m is not None and not m.error()]
        if msgs:
            for doc in scorer.score([(m.value(), m.timestamp()[1]) for m in msgs]):
                producer.produce(args.output, doc)
        producer.poll(0)
    producer.flush(30)
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
