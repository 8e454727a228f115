"""Feature store against a real (private) redis-server: store features score exactly
like the same features sent inline, one round trip per batch counted by the server
itself, documented defaults for misses, defaults without stalling during an outage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
import pytest
from prometheus_client import CollectorRegistry

from models.registry import load_spec
from pipeline.codecs.ctr import CtrCodec
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.redisio.codec import CtrIdCodec, CtrIdPayload
from pipeline.redisio.config import RedisConfig
from pipeline.redisio.features import FeatureLookupHook
from pipeline.redisio.link import RedisLink
from pipeline.redisio.loader import load_features
from pipeline.redisio.metrics import register_redis_metrics
from tests.integration.pipeline_helpers import wait_for
from tests.integration.redis_helpers import metric, twin, write_csv

LOOKUPS = ["script", "pipeline"]


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(load_spec("ctr").onnx_path), opts, providers=["CPUExecutionProvider"])


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def link(private_redis, registry):
    link = RedisLink(RedisConfig(url=private_redis.url), register_redis_metrics(registry)).start()
    yield link
    link.close()


def hook_for(link: RedisLink, lookup: str) -> FeatureLookupHook:
    return FeatureLookupHook(link, link.metrics, "tb:", lookup)


def twins(n: int, seed: int = 11, mean_items: float = 6, max_items: int = 20) -> list:
    factory = CtrRequestFactory(seed=seed, mean_items=mean_items, max_items=max_items)
    return [twin(factory.make_doc(i)) for i in range(n)]


def feeds_equal(a: dict, b: dict) -> None:
    np.testing.assert_array_equal(a["dense"], b["dense"])  # NaN == NaN here
    np.testing.assert_array_equal(a["cat"], b["cat"])


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_store_features_score_exactly_like_inline(lookup, private_redis, link, session, tmp_path: Path) -> None:
    pairs = twins(24)
    rows = [row for t in pairs for row in t.rows]
    load_features(private_redis.client(), write_csv(tmp_path / "f.csv", rows))
    codec = CtrIdCodec()
    inline = [CtrCodec().decode(t.inline) for t in pairs]
    ids = [codec.decode(t.ids) for t in pairs]
    assert all(type(d.payload) is CtrIdPayload for d in ids)

    hook_for(link, lookup).before_inference(ids)

    inline_feeds = codec.collate([d.payload for d in inline])
    id_feeds = codec.collate([d.payload for d in ids])
    feeds_equal(inline_feeds, id_feeds)
    inline_scores = codec.split(dict(zip(["prob"], session.run(["prob"], inline_feeds), strict=True)), inline)
    id_scores = codec.split(dict(zip(["prob"], session.run(["prob"], id_feeds), strict=True)), ids)
    for a, b in zip(inline_scores, id_scores, strict=True):
        assert a["item_ids"] == b["item_ids"]
        assert a["scores"] == b["scores"]  # bit for bit: same feeds, same batch


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_one_round_trip_per_batch_counted_by_the_server(lookup, private_redis, link, tmp_path: Path) -> None:
    # Small on purpose: redis-py writes a request over ~6 KB in several send() calls
    # (without waiting in between: still one round trip), which the server may count
    # as several reads. ~20 keys stay well below that for both lookups.
    pairs = twins(4, seed=3, mean_items=3, max_items=4)
    load_features(private_redis.client(), write_csv(tmp_path / "f.csv", [r for t in pairs for r in t.rows]))
    codec = CtrIdCodec()
    # Repeated users and items inside the batch: each key must be fetched once.
    docs = [orjson.loads(t.ids) for t in pairs]
    docs.append({**docs[0], "request_id": "again-0"})
    docs.append({**docs[1], "request_id": "again-1", "items": docs[1]["items"][:1] + docs[0]["items"][:2]})
    keys = {f"tb:user:{d['user_id']}" for d in docs} | {f"tb:item:{i}" for d in docs for i in d["items"]}
    hook = hook_for(link, lookup)
    hook.before_inference([codec.decode(orjson.dumps(docs[0]))])  # connection set up (and script loaded)
    stats = private_redis.client()
    stats.ping()  # this client's connection exists before the first INFO
    batch = [codec.decode(orjson.dumps(d)) for d in docs]

    before = stats.info("all")
    hook.before_inference(batch)
    after = stats.info("all")

    def delta(name: str) -> int:
        return int(after[name] - before[name])

    def calls(cmd: str) -> int:
        return int(after.get(f"cmdstat_{cmd}", {}).get("calls", 0) - before.get(f"cmdstat_{cmd}", {}).get("calls", 0))

    # Each INFO counts: the second one's own read, and the first one as a command.
    assert delta("total_reads_processed") - 1 == 1, "the batch's lookup was not one request to the server"
    assert calls("hmget") == len(keys)  # deduplicated: one HMGET per distinct key
    if lookup == "script":
        assert calls("evalsha") == 1
        assert delta("total_commands_processed") - 1 == 1 + len(keys)  # EVALSHA + its HMGETs
    else:
        assert delta("total_commands_processed") - 1 == len(keys)
    assert all(d.payload.filled for d in batch)


def test_inline_only_batch_does_not_touch_redis(private_redis, link) -> None:
    codec = CtrIdCodec()
    batch = [codec.decode(t.inline) for t in twins(3)]
    stats = private_redis.client()
    stats.ping()
    before = stats.info("stats")["total_commands_processed"]
    hook_for(link, "script").before_inference(batch)
    assert stats.info("stats")["total_commands_processed"] - before == 1  # the first INFO only


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_missing_keys_get_the_codecs_missing_encoding_and_are_counted(lookup, link, registry) -> None:
    codec = CtrIdCodec()
    ids = codec.decode(orjson.dumps({"request_id": "r", "user_id": "nobody", "items": ["x1", "x2", "x1"]}))
    all_missing = CtrCodec().decode(
        orjson.dumps({"request_id": "r", "context": {}, "items": [{"item_id": i} for i in ("x1", "x2", "x1")]})
    )
    hook_for(link, lookup).before_inference([ids])
    feeds_equal(codec.collate([all_missing.payload]), codec.collate([ids.payload]))
    assert metric(registry, "tidebatch_feature_misses_total", {"kind": "user"}) == 1
    assert metric(registry, "tidebatch_feature_misses_total", {"kind": "item"}) == 2  # distinct keys
    assert metric(registry, "tidebatch_feature_lookups_total", {"kind": "item"}) == 2


def test_inline_context_with_store_items_and_bad_stored_values(private_redis, link, registry, tmp_path: Path) -> None:
    pair = twins(1, seed=5)[0]
    doc = orjson.loads(pair.inline)
    client = private_redis.client()
    load_features(client, write_csv(tmp_path / "items.csv", pair.rows[1:]))
    # A value no loader would write: counted as invalid and treated as missing.
    client.hset(f"tb:item:{pair.item_ids[0]}", "C14", "not-hex")
    client.hset(f"tb:item:{pair.item_ids[0]}", "I7", "many")
    mixed = {"request_id": "m", "user_id": pair.user_id, "context": doc["context"], "items": pair.item_ids}
    expected_doc = {**doc, "items": [dict(doc["items"][0], C14=None, I7=None), *doc["items"][1:]]}
    codec = CtrIdCodec()
    got = codec.decode(orjson.dumps(mixed))
    assert got.payload.user_id is None  # the inline context is used, no user lookup
    hook_for(link, "script").before_inference([got])
    feeds_equal(codec.collate([CtrCodec().decode(orjson.dumps(expected_doc)).payload]), codec.collate([got.payload]))
    assert metric(registry, "tidebatch_feature_invalid_total", {"kind": "item"}) == 2
    assert metric(registry, "tidebatch_feature_lookups_total", {"kind": "user"}) == 0


def test_dead_redis_gives_defaults_and_recovers_by_itself(private_redis, link, registry, tmp_path: Path) -> None:
    pairs = twins(4, seed=9)
    load_features(private_redis.client(), write_csv(tmp_path / "f.csv", [r for t in pairs for r in t.rows]))
    codec = CtrIdCodec()
    hook = hook_for(link, "script")
    assert metric(registry, "tidebatch_redis_up") == 1

    private_redis.kill()
    for _ in range(3):  # the first batch finds it dead; the next ones skip Redis entirely
        batch = [codec.decode(t.ids) for t in pairs]
        hook.before_inference(batch)
        assert all(np.isnan(d.payload.dense).all() for d in batch)  # all defaults
    assert metric(registry, "tidebatch_redis_up") == 0
    assert metric(registry, "tidebatch_redis_outages_total") == 1
    assert metric(registry, "tidebatch_redis_errors_total", {"op": "features"}) == 1
    assert metric(registry, "tidebatch_feature_unavailable_total", {"kind": "user"}) == 3 * len(pairs)

    private_redis.start()  # empty: no persistence
    load_features(private_redis.client(), write_csv(tmp_path / "f.csv", [r for t in pairs for r in t.rows]))
    wait_for(lambda: metric(registry, "tidebatch_redis_up") == 1, 30, "link never came back")
    batch = [codec.decode(t.ids) for t in pairs]
    hook.before_inference(batch)  # NOSCRIPT after the restart: redis-py reloads the script
    inline = [CtrCodec().decode(t.inline) for t in pairs]
    feeds_equal(codec.collate([d.payload for d in inline]), codec.collate([d.payload for d in batch]))
