"""Steady CTR traffic and every outcome of it, for the tests that run a `tidebatch run`
worker process through faults (test_cluster_faults.py: broker failures;
test_exactly_once.py: worker kills and zombies under delivery exactly_once).

PacedProducer writes requests at a fixed rate from a thread; OutcomeCollector reads
the output, dead-letter and late topics from the start, in a thread, and maps each
request id to the outcome records seen for it (more than one is a duplicate)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from consumers.profiles import KAFKA, consumer_config, producer_config
from pipeline.registry.pipelines import get_pipeline
from tests.integration import opsutil


class PacedProducer:
    """CTR requests at `rate` per second for `seconds` from a thread (acks=all,
    idempotent: the kafka profile), each stamped by the broker's clock-independent
    CreateTime. Only ids whose delivery was acknowledged count as produced."""

    def __init__(self, bootstrap: str, topic: str, seconds: float, seed: int, *, rate: int = 200) -> None:
        self.delivered: list[str] = []
        self.errors: list[str] = []
        self.rate = rate
        self.count = int(seconds * rate)
        self._producer = Producer(producer_config(KAFKA, bootstrap))
        self._topic = topic
        self._bootstrap = bootstrap
        self._make = get_pipeline("ctr").make_samples(seed)
        self._thread = threading.Thread(target=self._run, name="paced-producer", daemon=True)

    def start(self) -> PacedProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        began = time.monotonic()
        for i in range(self.count):
            delay = began + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._send(self._producer, i)
            self._producer.poll(0)
        # Through a fault the last records may wait for a new leader: librdkafka keeps
        # retrying them until message.timeout.ms.
        self._producer.flush(120)

    def burst(self, n: int) -> None:
        """`n` more requests at once, beside the paced ones, returning once the broker
        has them all: a worker then holds fetched, unscored work for a while. Counted
        in `count` and `delivered` like the others."""
        producer = Producer(producer_config(KAFKA, self._bootstrap))
        first, self.count = self.count, self.count + n
        for i in range(first, first + n):
            self._send(producer, i)
        producer.flush(60)

    def _send(self, producer: Producer, i: int) -> None:
        """Request `i`, its delivery counted in `delivered` or `errors`."""
        key, value, headers = self._make(i)
        rid = orjson.loads(value)["request_id"]

        def on_delivery(err, _msg, rid: str = rid) -> None:
            if err is None:
                self.delivered.append(rid)
            else:
                self.errors.append(str(err))

        while True:
            try:
                producer.produce(self._topic, value=value, key=key, headers=headers or None, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


@dataclass
class Outcomes:
    """Request id -> outcome kinds; results' (record timestamp, latency ms); request id
    -> where each outcome record was read (partition@offset, record timestamp) and, for
    a result, the input record it answers and when it was scored: a duplicate then says
    whether it is two records or one read twice, of one input record or two, and when."""

    kinds: dict[str, list[str]] = field(default_factory=dict)
    results: list[tuple[int, int]] = field(default_factory=list)
    where: dict[str, list[dict[str, object]]] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        """Outcome records beyond the first of each request."""
        return sum(len(k) - 1 for k in self.kinds.values())

    def duplicated(self) -> dict[str, list[str]]:
        """Request id -> its outcome kinds, for requests with more than one."""
        return {rid: k for rid, k in self.kinds.items() if len(k) > 1}

    def duplicated_where(self, limit: int = 5) -> dict[str, list[dict[str, object]]]:
        """Where the outcome records of (up to `limit`) duplicated requests were read."""
        return {rid: self.where.get(rid, []) for rid in list(self.duplicated())[:limit]}

    def by_kind(self) -> dict[str, int]:
        """Requests per (first) outcome kind."""
        return {kind: sum(1 for k in self.kinds.values() if k[0] == kind) for kind in ("result", "dlq", "late")}


class OutcomeCollector(opsutil.ConsumerThread):
    """Reads every partition of the output (`partitions` of them), dead-letter and late
    topics from the start, in a thread, as any downstream consumer would (it rides out
    the faults too). `isolation` is the reader's isolation.level: read_committed
    (librdkafka's default, set explicitly) sees only committed transactions' records,
    read_uncommitted also those of aborted ones."""

    def __init__(
        self, bootstrap: str, topics: opsutil.Topics, partitions: int, *, isolation: str = "read_committed"
    ) -> None:
        self.outcomes = Outcomes()
        self._topics = topics
        consumer = Consumer(consumer_config(KAFKA, bootstrap, f"outcomes-reader-{time.monotonic_ns()}",
                                            {"isolation.level": isolation}))
        parts = [TopicPartition(topics.output, p, OFFSET_BEGINNING) for p in range(partitions)]
        parts += [TopicPartition(t, 0, OFFSET_BEGINNING) for t in (topics.dlq, topics.late)]
        consumer.assign(parts)
        super().__init__(consumer, "outcomes")

    def _add(self, m) -> None:
        if m.topic() == self._topics.output:
            doc = orjson.loads(m.value())
            rid, kind = doc["request_id"], "result"
            latency = (m.timestamp()[1], m.timestamp()[1] - int(doc["kafka_ts_ms"]))
            src = doc.get("source") or {}
            where = {"at": f"{m.partition()}@{m.offset()}", "ts": m.timestamp()[1],
                     "source": f"{src.get('partition')}@{src.get('offset')}", "scored_at_ms": doc.get("scored_at_ms")}
        else:
            # A dead letter or late record carries the request's original bytes.
            rid = orjson.loads(m.value())["request_id"]
            kind, latency = ("dlq" if m.topic() == self._topics.dlq else "late"), None
            where = {"at": f"{m.topic()}:{m.partition()}@{m.offset()}", "ts": m.timestamp()[1]}
        with self._lock:
            self.outcomes.kinds.setdefault(rid, []).append(kind)
            self.outcomes.where.setdefault(rid, []).append(where)
            if latency is not None:
                self.outcomes.results.append(latency)

    def missing(self, ids: list[str]) -> list[str]:
        with self._lock:
            return [i for i in ids if i not in self.outcomes.kinds]

    def seen(self) -> int:
        """Outcome records read so far."""
        with self._lock:
            return sum(len(k) for k in self.outcomes.kinds.values())

    def close(self) -> Outcomes:
        super().close()
        return self.outcomes
