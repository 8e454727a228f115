"""Helpers for the Redis tests: turn generated CTR requests into (inline, id-only)
twins whose store features are exactly the inline ones, write feature files, read
metrics, run a worker with its Redis parts attached, and the end-to-end check that
the plain and the secured (AUTH + TLS) servers both pass."""

from __future__ import annotations

import csv
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from models.ctr import features as F
from pipeline.app.compose import build_parts
from pipeline.config import WorkerConfig
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.redisio.loader import load_features
from pipeline.redisio.parts import RedisParts
from pipeline.worker import Worker
from tests.integration.pipeline_helpers import (
    produce_values,
    read_topic,
    result_docs,
    wait_for,
    worker_config,
)

REDIS_ON = {"features": {"enabled": True}, "store": {"enabled": True}, "dedup": {"enabled": True}}
FEATURE_COLUMNS = ["kind", "id", *F.DENSE_FIELDS, *F.CAT_FIELDS]


@dataclass
class Twin:
    """One request twice: with inline features and with ids only (store features)."""

    request_id: str
    user_id: str
    item_ids: list[str]
    inline: bytes  # request_id = f"{request_id}-inline"
    ids: bytes  # request_id = f"{request_id}-ids"
    rows: list[dict[str, Any]] = field(default_factory=list)  # feature-file rows


def twin(doc: dict[str, Any]) -> Twin:
    """Twin of a generated request. Users and items get ids private to this request,
    since the generator draws a fresh context per request even for the same user."""
    rid = doc["request_id"]
    user_id = f"u-{rid}"
    context = {k: v for k, v in doc["context"].items() if v is not None}
    rows = [{"kind": "user", "id": user_id, **context}]
    items = []
    for item in doc["items"]:
        item_id = f"{rid}:{item['item_id']}"
        features = {k: v for k, v in item.items() if k != "item_id" and v is not None}
        rows.append({"kind": "item", "id": item_id, **features})
        items.append({**item, "item_id": item_id})
    item_ids = [it["item_id"] for it in items]
    inline = {**doc, "request_id": f"{rid}-inline", "user_id": user_id, "items": items}
    ids = {"request_id": f"{rid}-ids", "user_id": user_id, "items": item_ids}
    return Twin(rid, user_id, item_ids, orjson.dumps(inline), orjson.dumps(ids), rows)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FEATURE_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Typed columns: dense as float64 (null = missing), tokens as strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {
        "kind": pa.array([r["kind"] for r in rows], pa.string()),
        "id": pa.array([r["id"] for r in rows], pa.string()),
    }
    for name in F.DENSE_FIELDS:
        columns[name] = pa.array([r.get(name) for r in rows], pa.float64())
    for name in F.CAT_FIELDS:
        columns[name] = pa.array([r.get(name) for r in rows], pa.string())
    pq.write_table(pa.table(columns), path)
    return path


def metric(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def metric_sum(registry: CollectorRegistry, name: str) -> float:
    """Sum over all label sets of one sample name (e.g. every op of an error counter)."""
    return sum(
        s.value for fam in registry.collect() for s in fam.samples if s.name == name
    )


@contextmanager
def running_redis_worker(cfg: WorkerConfig) -> Iterator[tuple[Worker, RedisParts]]:
    """A Worker with its Redis parts (as `tidebatch run` builds it), run in a thread."""
    built = build_parts(cfg, redis=True)
    parts = built.redis
    assert parts is not None, "no redis feature enabled in cfg"
    worker = Worker(cfg, parts=built)
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(worker.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: bool(worker.assigned), 60, "worker never got partitions")
        yield worker, parts
    finally:
        worker.stop()
        thread.join(60)
        parts.close()
    assert not thread.is_alive(), "worker did not stop"
    assert exit_code == [0], f"worker exit code {exit_code}"


# ---------------------------------------------------------------------------- end to end
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


def score_twins_end_to_end(broker: Any, topic_factory: Any, group: str, server: Any, tmp_path: Path) -> CollectorRegistry:
    """A worker with features, store and dedup on, reaching `server` (a RedisServer,
    plain or secured) with its redis_section(): id-only requests score like their
    inline twins (so the features came from Redis), every result is in the store, the
    request produced twice is flagged once. Returns the worker's metrics registry."""
    factory = CtrRequestFactory(seed=21, mean_items=8, max_items=30)
    pairs = [twin(factory.make_doc(i)) for i in range(30)]
    client = server.client()
    load_features(client, write_parquet(tmp_path / "f.parquet", [r for t in pairs for r in t.rows]))
    messages = [(t.user_id.encode(), v) for t in pairs for v in (t.inline, t.ids)]
    messages.append((pairs[0].user_id.encode(), pairs[0].ids))  # the same request produced twice
    inp, out = topics(topic_factory, "redis-e2e")
    keys = server.redis_section()
    cfg = redis_worker_config(broker, inp, out, group, keys.pop("url"), **keys)

    with running_redis_worker(cfg) as (worker, parts):
        produce_values(broker.bootstrap_servers, inp, messages)
        docs = result_docs(read_topic(broker.bootstrap_servers, out, len(messages), timeout=120))
        assert len(docs) == len(messages)
        wait_for(lambda: all(client.exists(f"tb:req:{d['request_id']}") for d in docs), 30, "store incomplete")
        registry = worker.metrics.registry
        assert metric(registry, "tidebatch_feature_lookups_total", {"kind": "item"}) > 0
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
    return registry
