"""Redis in a real worker on the embedded broker: id-only requests score like their
inline twins, results land in the score store, a copy is flagged, and a Redis killed
mid-stream loses no request and is recovered from without restarting the worker."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from consumers.profiles import consumer_config, producer_config
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.redisio.loader import load_features
from tests.integration.pipeline_helpers import (
    profile_of,
    wait_for,
)
from tests.integration.redis_helpers import (
    metric,
    metric_sum,
    redis_worker_config,
    running_redis_worker,
    score_twins_end_to_end,
    topics,
    twin,
    write_parquet,
)


def test_id_requests_score_like_inline_twins_and_fill_the_store(
    broker, topic_factory, unique_group_id, private_redis, tmp_path: Path
) -> None:
    score_twins_end_to_end(broker, topic_factory, unique_group_id, private_redis, tmp_path)


class ResultReader:
    """Reads the result topic in a thread, from the beginning, like a downstream consumer."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.docs: list[dict] = []
        self.arrived = threading.Event()
        self._stop = threading.Event()
        conf = consumer_config(profile_of(bootstrap), bootstrap, f"reader-{topic}")
        self._consumer = Consumer(conf)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self._thread = threading.Thread(target=self._loop, name="results", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for m in self._consumer.consume(num_messages=500, timeout=0.1):
                if m.error() is None:
                    self.docs.append(orjson.loads(m.value()))
                    self.arrived.set()

    def ids(self) -> set[str]:
        return {d["request_id"] for d in list(self.docs)}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


class Stream:
    """Produces id requests in a thread, closed loop: keeps ~10 without a result in
    flight, so the stream runs for as long as the test needs, without sleeps."""

    def __init__(self, bootstrap: str, topic: str, values: list[tuple[bytes, bytes]], reader: ResultReader) -> None:
        self.values = values
        self.sent: list[str] = []
        self.reader = reader
        self._producer = Producer(producer_config(profile_of(bootstrap), bootstrap))
        self._topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stream", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        i = 0
        while not self._stop.is_set() and i < len(self.values):
            if len(self.sent) - len(self.reader.docs) < 10:
                for key, value in self.values[i : i + 5]:
                    self._producer.produce(self._topic, key=key, value=value)
                    self.sent.append(orjson.loads(value)["request_id"])
                i += 5
                self._producer.flush(30)
            else:
                self.reader.arrived.wait(0.2)
                self.reader.arrived.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert self._producer.flush(30) == 0


def test_redis_killed_mid_stream_loses_nothing_and_recovers(
    broker, topic_factory, unique_group_id, private_redis, tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.redisio.link")
    factory = CtrRequestFactory(seed=31, mean_items=5, max_items=20)
    pairs = [twin(factory.make_doc(i)) for i in range(400)]
    features = write_parquet(tmp_path / "f.parquet", [r for t in pairs for r in t.rows])
    load_features(private_redis.client(), features)
    inp, out = topics(topic_factory, "redis-outage")
    cfg = redis_worker_config(broker, inp, out, unique_group_id, private_redis.url)

    with running_redis_worker(cfg) as (worker, parts):
        registry = worker.metrics.registry
        reader = ResultReader(broker.bootstrap_servers, out, 2)
        stream = Stream(broker.bootstrap_servers, inp, [(t.user_id.encode(), t.ids) for t in pairs], reader)
        try:
            wait_for(lambda: len(reader.docs) >= 30, 120, "no results before the outage")
            private_redis.kill()
            wait_for(lambda: metric(registry, "tidebatch_redis_up") == 0, 60, "outage never noticed")
            during_from = len(stream.sent)  # produced from here on: scored while Redis is down
            wait_for(lambda: len(reader.docs) >= during_from + 20, 120, "the stream stalled during the outage")
            during_to = len(stream.sent)
            private_redis.start()  # empty (no persistence); features reloaded as ops would
            load_features(private_redis.client(), features)
            wait_for(lambda: metric(registry, "tidebatch_redis_up") == 1, 60, "no recovery without a restart")
            after = len(stream.sent)
            wait_for(lambda: len(reader.docs) >= after + 30, 120, "the stream stalled after recovery")
        finally:
            stream.stop()
        sent = set(stream.sent)
        wait_for(lambda: reader.ids() >= sent, 120, "requests lost: no result on the output topic")
        reader.close()
        client = private_redis.client()
        outage_ids = stream.sent[during_from:during_to]
        # scored during the outage: kept in the bounded buffer, written after recovery
        wait_for(lambda: all(client.exists(f"tb:req:{r}") for r in outage_ids), 30, "retry buffer not written")
        unavailable = metric(registry, "tidebatch_feature_unavailable_total", {"kind": "user"})
        skipped = metric(registry, "tidebatch_redis_dedup_skipped_total")
        outages = metric(registry, "tidebatch_redis_outages_total")
        errors = metric_sum(registry, "tidebatch_redis_errors_total")

    counts = Counter(d["request_id"] for d in reader.docs)
    assert set(counts) == sent and max(counts.values()) == 1
    assert not any(d.get("duplicate") for d in reader.docs)
    assert outages == 1 and errors >= 1
    assert unavailable >= 1 and skipped >= 1  # defaults used, dedup skipped (fail-open)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.redisio.link"]
    assert sum("unavailable" in line for line in lines) == 1, lines  # logged once per outage
    assert sum("is back" in line for line in lines) == 1, lines  # and once on recovery
