"""Replay deduplication: recognise a request id seen before, one pipeline per batch.

    tb:seen:<request_id>  string "<topic>/<partition>/<offset>" of the first record
                          that carried the id; TTL redis.dedup.ttl_s

after_inference sends `SET key position NX GET PX ttl` for every result of the batch
(Redis >= 7.0) and reads back who was first:
- nothing there: first sighting, publish as is;
- another record's position: a *copy* (the producer sent the request twice, or a
  different partition replayed it): the result gets "duplicate": true and, with
  action "drop", is not published;
- this record's own position: a *redelivery* of the very record that claimed the id
  (crash or rebalance before its offset was committed). Its first result may never
  have reached Kafka, so it is published, flagged "duplicate": true, whatever the
  action: dropping it could lose the only result of the request. With delivery
  exactly_once (docs/DELIVERY.md) the record is only replayed when its first result's
  transaction did not commit, so no reader ever saw that one: published unflagged.
Redis unavailable: results are published unchecked (fail-open: better a duplicate
than a lost result), counted in `tidebatch_redis_dedup_skipped_total`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from consumers.records import SourceRecord
from pipeline.codecs.base import Decoded
from pipeline.redisio.link import RedisLink
from pipeline.redisio.metrics import RedisMetrics


def position(rec: SourceRecord) -> str:
    return f"{rec.topic}/{rec.partition}/{rec.offset}"


class DedupHook:
    """WorkerHook: flags (or drops) results whose request id was seen before."""

    name = "redis-dedup"

    def __init__(
        self,
        link: RedisLink,
        metrics: RedisMetrics,
        *,
        key_prefix: str = "tb:",
        ttl_s: float = 86_400.0,
        action: str = "flag",
        exactly_once: bool = False,
    ) -> None:
        if action not in ("flag", "drop"):
            raise ValueError(f"dedup action must be flag or drop, got {action!r}")
        self.link = link
        self.metrics = metrics
        self.prefix = key_prefix
        self.ttl_ms = max(int(ttl_s * 1000), 1)
        self.drop = action == "drop"
        self.exactly_once = exactly_once

    def before_inference(self, decoded: Sequence[Decoded]) -> None:
        pass

    def close(self) -> None:
        pass

    def after_inference(self, records: Sequence[SourceRecord], docs: list[dict[str, Any]]) -> list[bool]:
        keep = [True] * len(docs)
        checked = [i for i, doc in enumerate(docs) if doc.get("request_id")]
        if not checked:
            return keep
        mine = {i: position(records[i]) for i in checked}

        def build(pipe: Any) -> None:
            for i in checked:
                pipe.set(f"{self.prefix}seen:{docs[i]['request_id']}", mine[i], nx=True, get=True, px=self.ttl_ms)

        replies = self.link.run("dedup", build)
        if replies is None:
            self.metrics.dedup_skipped.inc(len(checked))
            return keep
        for i, first in zip(checked, replies, strict=True):
            if isinstance(first, Exception):  # an error reply: fail open for this one
                self.metrics.errors.labels("dedup").inc()
                continue
            if first is None or (self.exactly_once and first == mine[i]):
                continue
            docs[i]["duplicate"] = True
            if self.drop and first != mine[i]:
                keep[i] = False
        return keep
