"""Every outcome of a worker's input, by input offset, for tests that check "exactly
one outcome per message" (tests/integration/test_hostile_input.py, test_fuzz_worker.py).

A result carries `source.offset`; a dead-letter or late record the
`tidebatch.source.offset` header."""

from __future__ import annotations

import time
from collections import defaultdict

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from consumers.dead_letter import H_OFFSET
from consumers.profiles import consumer_config, producer_config
from tests.integration import opsutil
from tests.integration.pipeline_helpers import profile_of

Message = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def produce(bootstrap: str, topic: str, messages: list[Message]) -> None:
    """In order, to one partition; values up to 100 MB."""
    producer = Producer(producer_config(profile_of(bootstrap), bootstrap, {"message.max.bytes": 100_000_000}))
    errors: list[str] = []
    for key, value, headers in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers or None,
                                 on_delivery=lambda err, _m: err and errors.append(str(err)))
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0 and not errors, errors[:3]


class OutcomeReader:
    """Every record of the output, dead-letter and late topics, by input offset."""

    def __init__(self, bootstrap: str, topics: opsutil.Topics) -> None:
        self.topics = topics
        conf = consumer_config(profile_of(bootstrap), bootstrap, f"reader-{time.monotonic_ns()}")
        conf["receive.message.max.bytes"] = 200_000_000
        self._consumer = Consumer(conf)
        self._consumer.assign(
            [TopicPartition(t, 0, OFFSET_BEGINNING) for t in (topics.output, topics.dlq, topics.late)]
        )
        self.by_offset: dict[int, list[tuple[str, object]]] = defaultdict(list)

    def read_until(self, offsets: int, timeout: float = 180.0) -> dict[int, list[tuple[str, object]]]:
        """Read until every input offset below `offsets` has an outcome, then a little
        longer, so that a second outcome for any of them would be seen too."""
        deadline = time.monotonic() + timeout
        settle: float | None = None
        while time.monotonic() < deadline:
            for m in self._consumer.consume(num_messages=500, timeout=0.2):
                if m.error() is None:
                    self._add(m)
            if settle is None and all(o in self.by_offset for o in range(offsets)):
                settle = time.monotonic() + 1.5
            if settle is not None and time.monotonic() >= settle:
                break
        return self.by_offset

    def _add(self, m) -> None:
        if m.topic() == self.topics.output:
            doc = orjson.loads(m.value())
            self.by_offset[doc["source"]["offset"]].append(("result", doc))
        else:
            headers = dict(m.headers() or [])
            kind = "dlq" if m.topic() == self.topics.dlq else "late"
            self.by_offset[int(headers[H_OFFSET])].append((kind, (headers, m.value())))

    def close(self) -> None:
        self._consumer.close()


def exactly_one(outcomes: dict, n: int) -> None:
    missing = [o for o in range(n) if o not in outcomes]
    doubled = {o: [k for k, _ in v] for o, v in outcomes.items() if len(v) != 1}
    assert not missing and not doubled, f"no outcome: {missing[:10]}, several: {list(doubled.items())[:5]}"


def score_in_thread(broker, topics: opsutil.Topics, cfg, messages: list[Message]) -> dict:
    """Run a worker in this process over `messages`; exactly one outcome each, the
    worker alive throughout and clean at the end."""
    reader = OutcomeReader(broker.bootstrap_servers, topics)
    try:
        with opsutil.live_worker(cfg) as live:
            opsutil.wait_for(lambda: live.worker.assigned, 60, "partitions")
            produce(broker.bootstrap_servers, topics.input, messages)
            outcomes = reader.read_until(len(messages))
            assert live.thread.is_alive()
        assert live.worker.failure is None
    finally:
        reader.close()
    exactly_one(outcomes, len(messages))
    return outcomes


# Apache Kafka refuses records over a topic's max.message.bytes (~1 MB by default):
# the input topic takes what hostile producers send; the others keep the default, so
# the worker must fit its outcomes to what the broker describes.
INPUT_TOPIC_CONFIG = {"max.message.bytes": str(100 * 1024 * 1024)}


def topics_for(topic_factory) -> opsutil.Topics:
    inp = topic_factory("hostile", 1, config=INPUT_TOPIC_CONFIG)
    return opsutil.Topics(inp, topic_factory("hostile-out", 1), topic_factory(f"{inp}.dlq", exact=True),
                          topic_factory(f"{inp}.late", exact=True))
