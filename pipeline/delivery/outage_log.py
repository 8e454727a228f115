"""The outage's lines and gauges (pipeline/delivery/kafka_progress.py decides what they
say): fed what waits on Kafka by the source loop every second, and asked for the lines
due by the watchdog thread too (pipeline/delivery/watchdog.py), since an outage may hold
the source loop inside a client call for a while. Also the broker connection counters,
from the consumer's librdkafka statistics (consumers/broker_connections.py)."""

from __future__ import annotations

import logging
import threading

import orjson

from consumers.broker_connections import BrokerConnections
from consumers.offsets import OffsetTracker
from consumers.records import SourceRecord
from pipeline.delivery.kafka_progress import COMMIT, DELIVERY, KafkaProgress
from pipeline.delivery.watchdog import CallWatch
from pipeline.observe.metrics import WorkerMetrics

log = logging.getLogger("pipeline.worker.core")  # where the worker's other lines come from


class OutageLog:
    """calls: the source thread's blocking client call, a wait of its own."""

    def __init__(self, progress: KafkaProgress, metrics: WorkerMetrics, pipeline: str, calls: CallWatch) -> None:
        self.progress = progress
        self.calls = calls
        self._outage = metrics.outage.labels(pipeline)
        self._outages = metrics.outages.labels(pipeline)
        self._lock = threading.Lock()  # two threads report; each line once
        self._acknowledged = 0
        self._connections = BrokerConnections()
        self._connects = metrics.broker_connects.labels(pipeline)
        self._disconnects = metrics.broker_disconnects.labels(pipeline)
        self._brokers_up = metrics.brokers_up.labels(pipeline)

    def broker_stats(self, document: str) -> None:
        """librdkafka's statistics JSON (the consumer's stats_cb, in its poll)."""
        try:
            delta = self._connections.update(orjson.loads(document))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            log.debug("librdkafka statistics not read: %s", exc)
            return
        self._connects.inc(delta.connects)
        self._disconnects.inc(delta.disconnects)
        self._brokers_up.set(delta.up)

    def sample(self, now: float, unacknowledged: int, uncommitted: int, acknowledged: int) -> None:
        """Records produced and not acknowledged, partitions with done offsets not
        committed, acknowledgements so far (source thread), then the lines due."""
        if acknowledged != self._acknowledged:
            self._acknowledged = acknowledged
            self.progress.ok(DELIVERY, now)
        self.progress.waiting(DELIVERY, unacknowledged, now)
        self.progress.waiting(COMMIT, uncommitted, now)
        self.report(now, loop=True)

    def report(self, now: float, loop: bool = False) -> None:
        """Log the lines due now; export the gauges. loop: the source loop's own turn
        (else the watchdog's tick)."""
        call = self.calls.current
        with self._lock:
            if call is None:
                self.progress.in_call(None, now, now, loop=loop)
            else:
                self.progress.in_call(call.name, call.started, now)
            began = self.progress.outages
            for line in self.progress.step(now):
                log.log(logging.WARNING if self.progress.in_outage else logging.INFO, line)
            self._outages.inc(self.progress.outages - began)
        self._outage.set(1 if self.progress.in_outage else 0)


class Acks:
    """The outcomes' ack (pipeline/delivery/outcomes.py): an outcome record is durable,
    so its offset is done, and Kafka takes writes. A count, not a clock read per record
    (the hot path): OutageLog.sample reads it each second."""

    __slots__ = ("_tracker", "count")

    def __init__(self, tracker: OffsetTracker) -> None:
        self._tracker = tracker
        self.count = 0  # outcome records acknowledged so far

    def __call__(self, rec: SourceRecord) -> None:
        self._tracker.ack(rec.tp, rec.offset)
        self.count += 1
