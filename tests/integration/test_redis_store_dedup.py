"""Score store sink and replay dedup hook against a private redis-server, including
their behaviour while it is dead."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import CollectorRegistry

from consumers.records import SourceRecord
from pipeline.codecs.base import Decoded
from pipeline.redisio.config import RedisConfig
from pipeline.redisio.dedup import DedupHook
from pipeline.redisio.link import RedisLink
from pipeline.redisio.metrics import register_redis_metrics
from pipeline.redisio.scores import ScoreStoreSink
from pipeline.sinks import ScoredRow
from tests.integration.pipeline_helpers import wait_for
from tests.integration.redis_helpers import metric


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def link(private_redis, registry):
    link = RedisLink(RedisConfig(url=private_redis.url), register_redis_metrics(registry)).start()
    yield link
    link.close()


def record(offset: int, partition: int = 0, key: bytes | None = b"u1") -> SourceRecord:
    return SourceRecord("ctr.requests", partition, offset, key, b"{}", {}, 1)


def doc(rid: str, items: tuple[str, ...] = ("a", "b"), scores: tuple[float, ...] = (0.25, 0.5)) -> dict:
    return {"request_id": rid, "item_ids": list(items), "scores": list(scores), "late": False}


def scored(rec: SourceRecord, result: dict, acks: list[str], user_id: str | None = None) -> ScoredRow:
    extra = {"item_ids": result["item_ids"], **({"user_id": user_id} if user_id else {})}
    decoded = Decoded(result["request_id"], len(result["item_ids"]), None, extra=extra)
    return ScoredRow(rec, decoded, result, lambda: acks.append(result["request_id"]))


# ---------------------------------------------------------------------------- dedup
@pytest.mark.parametrize("action", ["flag", "drop"])
def test_a_copy_of_a_request_is_flagged_or_dropped(action, link) -> None:
    hook = DedupHook(link, link.metrics, action=action)
    first = [doc("r1"), doc("r2")]
    assert hook.after_inference([record(0), record(1)], first) == [True, True]
    assert not any("duplicate" in d for d in first)
    # r1 produced again (offset 5), and twice in the same batch (offsets 6, 7).
    again = [doc("r1"), doc("r3"), doc("r3")]
    keep = hook.after_inference([record(5), record(6), record(7)], again)
    assert keep == ([True, True, True] if action == "flag" else [False, True, False])
    assert [d.get("duplicate", False) for d in again] == [True, False, True]


def test_a_redelivered_record_is_flagged_but_always_published(link, private_redis) -> None:
    """The record that claimed the id comes back (crash before its offset commit): its
    first result may never have reached Kafka, so even 'drop' publishes it."""
    hook = DedupHook(link, link.metrics, action="drop", ttl_s=60)
    assert hook.after_inference([record(3, partition=1)], [doc("r9")]) == [True]
    replay = [doc("r9")]
    assert hook.after_inference([record(3, partition=1)], replay) == [True]
    assert replay[0]["duplicate"] is True
    client = private_redis.client()
    assert client.get("tb:seen:r9") == "ctr.requests/1/3"
    assert 0 < client.pttl("tb:seen:r9") <= 60_000


def test_with_exactly_once_a_redelivered_record_is_not_a_duplicate(link) -> None:
    """delivery exactly_once (docs/DELIVERY.md): a record comes back only when its first
    result's transaction did not commit, so no reader saw that result: the replay is
    the one result, unflagged. A copy of the id in another record still is one."""
    hook = DedupHook(link, link.metrics, action="drop", ttl_s=60, exactly_once=True)
    assert hook.after_inference([record(3, partition=1)], [doc("r8")]) == [True]
    replay, copy = [doc("r8")], [doc("r8")]
    assert hook.after_inference([record(3, partition=1)], replay) == [True]
    assert "duplicate" not in replay[0]
    assert hook.after_inference([record(4, partition=1)], copy) == [False]
    assert copy[0]["duplicate"] is True


def test_dedup_fails_open_while_redis_is_dead(link, private_redis, registry) -> None:
    hook = DedupHook(link, link.metrics, action="drop")
    hook.after_inference([record(0)], [doc("r1")])
    private_redis.kill()
    docs = [doc("r1"), doc("r1")]
    assert hook.after_inference([record(8), record(9)], docs) == [True, True]  # better a duplicate than a loss
    assert not any("duplicate" in d for d in docs)
    assert metric(registry, "tidebatch_redis_dedup_skipped_total") == 2
    assert metric(registry, "tidebatch_redis_up") == 0


# ---------------------------------------------------------------------------- score store
def test_store_writes_scores_and_results_with_ttl_and_acks_at_once(link, private_redis, registry) -> None:
    sink = ScoreStoreSink(link, link.metrics, ttl_s=30)
    acks: list[str] = []
    d1, d2 = doc("r1", ("a", "b"), (0.1, 0.2)), doc("r2", ("b", "c"), (0.3, 0.4))
    sink.write([scored(record(0), d1, acks), scored(record(1, key=b"kafka-key"), d2, acks, user_id="u7")])
    assert acks == ["r1", "r2"]  # acknowledged before Redis saw anything: a cache never holds a commit
    sink.flush()
    client = private_redis.client()
    wait_for(lambda: client.exists("tb:req:r2"), 10, "results never written")
    assert orjson.loads(client.get("tb:req:r1")) == d1
    assert client.hgetall("tb:score:u1") == {"a": "0.1", "b": "0.2"}  # user from the Kafka key
    assert client.hgetall("tb:score:u7") == {"b": "0.3", "c": "0.4"}  # the codec's user_id wins
    assert 0 < client.pttl("tb:req:r1") <= 30_000 and 0 < client.pttl("tb:score:u7") <= 30_000
    assert metric(registry, "tidebatch_redis_store_written_total") == 2
    sink.close()


def test_store_buffers_during_an_outage_drops_oldest_and_catches_up(link, private_redis, registry) -> None:
    sink = ScoreStoreSink(link, link.metrics, buffer_max=3, flush_timeout_s=0.5)
    acks: list[str] = []
    private_redis.kill()
    sink.write([scored(record(0), doc("first"), acks)])  # finds Redis dead
    wait_for(lambda: metric(registry, "tidebatch_redis_up") == 0, 10, "outage not noticed")
    sink.write([scored(record(i), doc(f"r{i}"), acks) for i in range(1, 5)])
    assert len(acks) == 5  # all acknowledged although nothing was written
    assert metric(registry, "tidebatch_redis_store_dropped_total") == 2  # "first" and r1
    assert metric(registry, "tidebatch_redis_store_buffered") == 3
    sink.flush()  # Redis is down: returns at once instead of waiting on a cache

    private_redis.start()
    client = private_redis.client()
    wait_for(lambda: client.exists("tb:req:r4"), 30, "buffer never written after recovery")
    assert [client.exists(f"tb:req:{r}") for r in ("first", "r1", "r2", "r3", "r4")] == [0, 0, 1, 1, 1]
    assert metric(registry, "tidebatch_redis_store_buffered") == 0
    sink.close()
