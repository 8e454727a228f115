"""`tidebatch produce PIPELINE`: a load generator with Poisson arrivals and realistic
request contents (no model needed)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from confluent_kafka import Producer

from consumers.admin import ensure_topics
from consumers.profiles import producer_config
from pipeline.loadgen.pacing import poisson_schedule, run_open_loop
from pipeline.pipelines import PIPELINES, get_pipeline


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("produce", help="generate requests to a Kafka topic (Poisson arrivals)")
    p.add_argument("pipeline", choices=sorted(PIPELINES), help="which kind of request")
    p.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    p.add_argument("--topic", help="default: the pipeline's input topic")
    p.add_argument("--partitions", type=int, default=4, help="partitions if the topic is created (default 4)")
    p.add_argument("--rate", type=float, default=500.0, help="requests per second (default 500)")
    p.add_argument("--count", type=int, default=10_000, help="requests to send (default 10000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--broker-profile", default="kafka", choices=("kafka", "embedded"))
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def produce(
    bootstrap: str,
    pipeline: str,
    rate: float,
    count: int,
    *,
    topic: str | None = None,
    seed: int = 1,
    profile: str = "kafka",
    start_index: int = 0,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
    on_sent: Callable[[int], None] | None = None,
) -> tuple[int, float]:
    """Send `count` requests at `rate`/s; returns (sent, seconds). Flushes at the end."""
    spec = get_pipeline(pipeline)
    topic = topic or spec.input_topic
    make = spec.make_samples(seed)
    from consumers.profiles import large_message_overrides

    large = large_message_overrides(spec.max_message_bytes).producer if spec.max_message_bytes else None
    producer = Producer(producer_config(profile, bootstrap, large))
    warm_up_producer(producer, topic)
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(err.str())

    def send(i: int) -> None:
        key, value, headers = make(start_index + i)
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers or None, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        if on_sent:
            on_sent(i + 1)
        if progress and i and i % 1000 == 0:
            print(f"\rsent {i}/{count}", end="", file=sys.stderr, flush=True)

    sent, elapsed = run_open_loop(
        poisson_schedule(rate, count, seed), send, idle=lambda s: producer.poll(s), should_stop=should_stop
    )
    left = producer.flush(30)
    if progress:
        print(file=sys.stderr)
    if left or errors:
        raise RuntimeError(f"{left} requests unacknowledged, {len(errors)} failed: {errors[:1]}")
    return sent, elapsed


def warm_up_producer(producer: Producer, topic: str, timeout: float = 10.0) -> None:
    """Connect and fetch metadata before the first timed request: otherwise the first
    requests carry the producer's start-up in their timestamps as if the pipeline
    were slow."""
    producer.list_topics(topic=None, timeout=timeout)
    producer.poll(0.2)  # idempotent producer id (InitProducerId) follows the connect


def run(args: argparse.Namespace) -> int:
    spec = get_pipeline(args.pipeline)
    topic = args.topic or spec.input_topic
    ensure_topics(args.bootstrap_servers, {topic: args.partitions})
    t0 = time.monotonic()
    sent, _ = produce(
        args.bootstrap_servers, args.pipeline, args.rate, args.count,
        topic=topic, seed=args.seed, profile=args.broker_profile, progress=not args.quiet,
    )
    elapsed = time.monotonic() - t0
    print(f"sent {sent} {args.pipeline} requests to {topic} in {elapsed:.1f} s ({sent / elapsed:.0f}/s)")
    return 0
