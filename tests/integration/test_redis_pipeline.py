"""Redis in a real worker on the embedded broker: id-only requests score like their
inline twins, results land in the score store, a copy is flagged, and a Redis killed
mid-stream loses no request and is recovered from without restarting the worker."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from consumers.profiles import consumer_config, producer_config
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.redisio.loader import load_features
from tests.integration.pipeline_helpers import (
    produce_values,
    profile_of,
    read_topic,
    result_docs,
    wait_for,
    worker_config,
)
from tests.integration.redis_helpers import (
    metric,
    metric_sum,
    running_redis_worker,
    twin,
    write_parquet,
)

REDIS_ON = {"features": {"enabled": True}, "store": {"enabled": True}, "dedup": {"enabled": True}}


def topics(topic_factory, prefix: str) -> tuple[str, str]:
    inp = topic_factory(prefix, partitions=2)
    out = topic_factory(f"{prefix}-scores", partitions=2)
    topic_factory(f"{inp}.dlq", exact=True)  # so that nothing auto-creates them
    topic_factory(f"{inp}.late", exact=True)
    return inp, out


def redis_worker_config(broker, inp: str, out: str, group: str, redis_url: str, **redis: Any):
    return worker_config(
        broker.bootstrap_servers, inp, out, group,
        batching={"slo_ms": 30_000},  # a shared 2-core box: lateness is not under test
        runtime={"warmup": False},
        redis={"url": redis_url, **REDIS_ON, **redis},
    )


def test_id_requests_score_like_inline_twins_and_fill_the_store(
    broker, topic_factory, unique_group_id, private_redis, tmp_path: Path
) -> None:
    factory = CtrRequestFactory(seed=21, mean_items=8, max_items=30)
    pairs = [twin(factory.make_doc(i)) for i in range(30)]
    client = private_redis.client()
    load_features(client, write_parquet(tmp_path / "f.parquet", [r for t in pairs for r in t.rows]))
    messages = [(t.user_id.encode(), v) for t in pairs for v in (t.inline, t.ids)]
    messages.append((pairs[0].user_id.encode(), pairs[0].ids))  # the same request produced twice
    inp, out = topics(topic_factory, "redis-e2e")
    cfg = redis_worker_config(broker, inp, out, unique_group_id, private_redis.url)

    with running_redis_worker(cfg) as (worker, parts):
        produce_values(broker.bootstrap_servers, inp, messages)
        docs = result_docs(read_topic(broker.bootstrap_servers, out, len(messages), timeout=120))
        assert len(docs) == len(messages)
        wait_for(lambda: all(client.exists(f"tb:req:{d['request_id']}") for d in docs), 30, "store incomplete")
        registry = worker.metrics.registry
        assert metric(registry, "tidebatch_feature_misses_total", {"kind": "item"}) == 0
        assert metric(registry, "tidebatch_redis_up") == 1

    by_id: dict[str, list[dict]] = {}
    for d in docs:
        by_id.setdefault(d["request_id"], []).append(d)
    for t in pairs:
        inline, ids = by_id[f"{t.request_id}-inline"][0], by_id[f"{t.request_id}-ids"][0]
        assert ids["item_ids"] == inline["item_ids"] == t.item_ids
        assert ids["scores"] == pytest.approx(inline["scores"], abs=1e-6)  # other batches, same features
        stored = client.hgetall(f"tb:score:{t.user_id}")
        assert [float(stored[i]) for i in t.item_ids] == pytest.approx(inline["scores"], abs=1e-6)
    copies = by_id[f"{pairs[0].request_id}-ids"]
    assert sorted(bool(c.get("duplicate")) for c in copies) == [False, True]
    assert sum(bool(d.get("duplicate")) for d in docs) == 1
    assert worker.stats.duplicates == 1
    assert orjson.loads(client.get(f"tb:req:{pairs[1].request_id}-ids"))["scores"] == by_id[f"{pairs[1].request_id}-ids"][0]["scores"]


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
