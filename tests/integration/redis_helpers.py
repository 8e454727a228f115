"""Helpers for the Redis tests: turn generated CTR requests into (inline, id-only)
twins whose store features are exactly the inline ones, write feature files, read
metrics, run a worker with its Redis parts attached."""

from __future__ import annotations

import csv
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from models.ctr import features as F
from pipeline.config import WorkerConfig
from pipeline.redisio.attach import RedisParts
from pipeline.worker import Worker, build_parts
from tests.integration.pipeline_helpers import wait_for

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
