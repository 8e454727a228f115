"""Online score store: the latest results in Redis, for front ends that do not read Kafka.

    tb:score:<user_id>   hash  item_id -> score (latest), TTL redis.ttl_s, refreshed per write
    tb:req:<request_id>  string  the result document as published (JSON), TTL redis.ttl_s

A ResultSink that is a *cache*: write() acknowledges every row at once, so offsets
never wait for Redis, and hands the rows to a writer thread. The writer sends one
pipeline per drain of its buffer: at most one per batch, fewer under load (it takes
everything queued). While Redis is away the rows wait in a bounded buffer; when it is
full the oldest are dropped and counted (`tidebatch_redis_store_dropped_total`): the
Kafka result topic stays the record of truth, so losing cache entries is acceptable,
stalling the pipeline is not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from pipeline.redisio.link import RedisLink
from pipeline.redisio.metrics import RedisMetrics
from pipeline.sinks import ScoredRow

log = logging.getLogger(__name__)

_MAX_PER_PIPELINE = 2000  # results per round trip: bounds one pipeline's size (~ a few MB)
_DOWN_POLL_S = 0.5  # how often a waiting writer rechecks for close() during an outage
_LOG_EVERY_S = 60.0  # refused writes are logged at most this often


@dataclass(slots=True)
class _Entry:
    request_id: str
    user_id: str | None
    doc: dict[str, Any]


def user_of(row: ScoredRow) -> str | None:
    """The request's user: the codec's user_id, else the Kafka key (the producers' convention)."""
    uid = row.decoded.extra.get("user_id")
    if uid:
        return str(uid)
    if row.rec.key:
        return row.rec.key.decode("utf-8", "replace")
    return None


class ScoreStoreSink:
    name = "redis-scores"

    def __init__(
        self,
        link: RedisLink,
        metrics: RedisMetrics,
        *,
        key_prefix: str = "tb:",
        ttl_s: float = 3600.0,
        buffer_max: int = 100_000,
        flush_timeout_s: float = 2.0,
    ) -> None:
        self.link = link
        self.metrics = metrics
        self.prefix = key_prefix
        self.ttl_ms = max(int(ttl_s * 1000), 1)
        self.buffer_max = buffer_max
        self.flush_timeout_s = flush_timeout_s
        self._buffer: deque[_Entry] = deque()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._closing = False
        self._next_error_log = 0.0
        self._thread = threading.Thread(target=self._writer_loop, name="redis-score-store", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ sink contract
    def write(self, rows: list[ScoredRow]) -> None:
        entries = [_Entry(str(r.result.get("request_id", "")), user_of(r), r.result) for r in rows]
        for row in rows:
            row.ack()  # a cache never holds back an offset commit
        entries = [e for e in entries if e.request_id]
        if entries:
            with self._cond:
                self._buffer.extend(entries)
                self._trim()
                self._cond.notify()

    def poll(self) -> None:
        pass  # the writer thread does the work

    def flush(self) -> None:
        """Wait (at most flush_timeout_s) for buffered results to reach Redis, unless
        Redis is down: a shutdown or revoke must not wait on a cache."""
        with self._cond:
            self._cond.wait_for(
                lambda: (not self._buffer and not self._in_flight) or not self.link.up,
                timeout=self.flush_timeout_s,
            )

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=self.flush_timeout_s + 1.0)
        left = len(self._buffer)
        if left:
            log.warning("score store: %d results not written to Redis at shutdown", left)

    # ------------------------------------------------------------------ writer
    def _trim(self) -> None:
        """Drop the oldest entries beyond buffer_max (caller holds the lock)."""
        over = len(self._buffer) - self.buffer_max
        if over > 0:
            for _ in range(over):
                self._buffer.popleft()
            self.metrics.store_dropped.inc(over)
        self.metrics.store_buffered.set(len(self._buffer))

    def _take(self) -> list[_Entry] | None:
        """Next entries to write; None once closing and nothing (writable) is left."""
        with self._cond:
            while not self._buffer and not self._closing:
                self._cond.wait()
            if not self._buffer or (self._closing and not self.link.up):
                return None
            n = min(len(self._buffer), _MAX_PER_PIPELINE)
            batch = [self._buffer.popleft() for _ in range(n)]
            self._in_flight = n
            self.metrics.store_buffered.set(len(self._buffer))
            return batch

    def _writer_loop(self) -> None:
        while True:
            if not self.link.up:
                self.link.wait_up(_DOWN_POLL_S)
                with self._cond:
                    if self._closing:
                        return
                continue
            batch = self._take()
            if batch is None:
                return
            results = self.link.run("store", lambda pipe, batch=batch: self._queue(pipe, batch))
            with self._cond:
                self._in_flight = 0
                if results is None and not self.link.up:  # Redis went away: back to the front
                    self._buffer.extendleft(reversed(batch))
                    self._trim()
                elif results is None:  # refused while up (logged by the link): retrying would spin
                    self.metrics.store_dropped.inc(len(batch))
                self._cond.notify_all()
            if results is not None:
                self._count(batch, results)

    def _queue(self, pipe: Any, batch: list[_Entry]) -> None:
        for e in batch:
            pipe.set(f"{self.prefix}req:{e.request_id}", orjson.dumps(e.doc), px=self.ttl_ms)
            scores = e.doc.get("scores")
            item_ids = e.doc.get("item_ids")
            if e.user_id and scores and item_ids and len(scores) == len(item_ids):
                key = f"{self.prefix}score:{e.user_id}"
                pipe.hset(key, mapping=dict(zip(item_ids, scores, strict=True)))
                pipe.pexpire(key, self.ttl_ms)

    def _count(self, batch: list[_Entry], results: list[Any]) -> None:
        errors = [r for r in results if isinstance(r, Exception)]
        self.metrics.store_written.inc(len(batch))
        if errors:
            # error replies (e.g. OOM under maxmemory) are not an outage: count, log, move on
            self.metrics.errors.labels("store").inc(len(errors))
            now = time.monotonic()
            if now >= self._next_error_log:
                self._next_error_log = now + _LOG_EVERY_S
                log.warning("score store: %d Redis commands refused, first: %s", len(errors), errors[0])
