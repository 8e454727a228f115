"""CtrIdCodec without Redis: inline requests decode exactly as CtrCodec decodes them;
id requests get the codec's "missing" encoding where the store will fill in; errors
are one precise line."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from models.ctr import features as F
from pipeline.codecs.base import DecodeError
from pipeline.codecs.ctr import CtrCodec, CtrPayload
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.redisio.codec import CtrIdCodec, CtrIdPayload
from pipeline.redisio.config import RedisConfig, redacted_url, validate_redis


def _bytes(doc: dict) -> bytes:
    return orjson.dumps(doc)


def test_inline_requests_decode_exactly_like_ctr_codec() -> None:
    factory = CtrRequestFactory(seed=1)
    for i in range(20):
        value = factory.make(i)[1]
        a, b = CtrCodec().decode(value), CtrIdCodec().decode(value)
        assert type(b.payload) is CtrPayload
        assert (a.request_id, a.rows, a.extra) == (b.request_id, b.rows, b.extra)
        np.testing.assert_array_equal(a.payload.dense, b.payload.dense)
        np.testing.assert_array_equal(a.payload.cat, b.payload.cat)


def test_id_request_starts_with_the_missing_encoding() -> None:
    d = CtrIdCodec().decode(_bytes({"request_id": "r1", "user_id": "u1", "items": ["a", "b", "c"]}))
    p = d.payload
    assert type(p) is CtrIdPayload and not p.filled
    assert (p.user_id, p.item_ids, d.rows) == ("u1", ["a", "b", "c"], 3)
    assert d.extra == {"item_ids": ["a", "b", "c"], "user_id": "u1"}
    assert p.dense.shape == (3, F.N_DENSE) and np.isnan(p.dense).all()
    assert (p.cat == F.MISSING_IDS).all()


def test_half_inline_requests_keep_their_inline_half() -> None:
    doc = CtrRequestFactory(seed=2).make_doc(0)
    full = CtrCodec().decode(_bytes(doc)).payload
    ids = [it["item_id"] for it in doc["items"]]
    ctx_inline = CtrIdCodec().decode(_bytes({**doc, "items": ids})).payload
    assert ctx_inline.user_id is None and ctx_inline.item_ids == ids
    np.testing.assert_array_equal(ctx_inline.dense[:, :6], full.dense[:, :6])
    np.testing.assert_array_equal(ctx_inline.cat[:, :13], full.cat[:, :13])
    no_ctx = CtrIdCodec().decode(_bytes({k: v for k, v in doc.items() if k != "context"})).payload
    assert no_ctx.user_id == doc["user_id"] and no_ctx.item_ids is None
    np.testing.assert_array_equal(no_ctx.dense[:, 6:], full.dense[:, 6:])
    np.testing.assert_array_equal(no_ctx.cat[:, 13:], full.cat[:, 13:])


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ({"request_id": "r", "items": ["a"]}, "user_id: required when 'context' is absent"),
        ({"request_id": "r", "user_id": "u", "items": ["a", {"item_id": "b"}]}, "items[1]: expected item id string like items[0], got object"),
        ({"request_id": "r", "user_id": "u", "items": ["a", ""]}, "items[1]: expected non-empty item id, got ''"),
        ({"request_id": "r", "user_id": "u", "items": [1]}, "items[0]: expected item id string or object, got int"),
        ({"request_id": "r", "user_id": "u", "items": []}, "items: expected at least 1 item, got 0"),
        ({"request_id": "r", "user_id": "u"}, "missing field 'items'"),
        ({"request_id": "r", "user_id": "u", "context": [], "items": ["a"]}, "context: expected object or null, got array"),
        ({"request_id": "r", "user_id": 7, "items": ["a"]}, "user_id: expected string or null, got int"),
        ({"user_id": "u", "items": ["a"]}, "missing field 'request_id'"),
        ({"request_id": "r", "user_id": "u", "context": {"C1": 5}, "items": ["a"]}, "context.C1: expected hex string or null, got int"),
    ],
)
def test_invalid_id_requests_say_why(doc: dict, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        CtrIdCodec().decode(_bytes(doc))
    assert str(err.value).startswith(reason)


def test_too_many_ids() -> None:
    with pytest.raises(DecodeError, match=r"too many items: 3 > max_items 2"):
        CtrIdCodec(max_items=2).decode(_bytes({"request_id": "r", "user_id": "u", "items": ["a", "b", "c"]}))


def test_inline_errors_stay_inline_errors() -> None:
    doc = CtrRequestFactory(seed=3).make_doc(0)
    doc["items"][0]["C14"] = 12345
    with pytest.raises(DecodeError, match=r"items\[0\]\.C14: expected hex string or null, got int"):
        CtrIdCodec().decode(_bytes(doc))


def test_redis_config_validation_and_url_helpers() -> None:
    def bad(key: str, why: str) -> ValueError:
        return ValueError(f"{key}: {why}")

    validate_redis(RedisConfig(), bad)
    for cfg, key in [
        (RedisConfig(url="http://x"), "redis.url"),
        (RedisConfig(ttl_s=0), "redis.ttl_s"),
        (RedisConfig(url="unix:///tmp/r.sock", tls=True), "redis.tls"),
    ]:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            validate_redis(cfg, bad)
    assert RedisConfig(url="redis://h:1/0", tls=True).effective_url() == "rediss://h:1/0"
    assert redacted_url("redis://user:secret@h:6380/0") == "redis://user:***@h:6380/0"
    assert redacted_url("rediss://:secret@h/1") == "rediss://:***@h/1"
    assert not RedisConfig().used


def test_redis_section_from_the_environment() -> None:
    from pipeline.config import load_config

    cfg = load_config(
        environ={
            "TIDEBATCH_REDIS__URL": "redis://cache:6380/2",
            "TIDEBATCH_REDIS__PASSWORD": "s3cret",
            "TIDEBATCH_REDIS__TLS": "true",
            "TIDEBATCH_REDIS__FEATURES__ENABLED": "true",
            "TIDEBATCH_REDIS__DEDUP__ACTION": "drop",
        }
    )
    r = cfg.redis
    assert (r.password, r.tls, r.features.enabled, r.dedup.action) == ("s3cret", True, True, "drop")
    assert r.effective_url() == "rediss://cache:6380/2" and r.used
    assert not load_config(environ={}).redis.used  # off by default: nothing connects


def test_id_requests_take_huge_integers_like_inline_ones() -> None:
    big = "1" + "0" * 400
    head = '{"request_id": "r", "user_id": "u", "items": ["i1"]'
    assert CtrIdCodec().decode(f'{head}, "deadline_ms": {big}}}'.encode()).deadline_ms == 2**63 - 1
    with pytest.raises(DecodeError, match=r"^priority: expected int 0\.\.9, got 100000000000\.\.\.\(401 digits\)$"):
        CtrIdCodec().decode(f'{head}, "priority": {big}}}'.encode())
    with pytest.raises(DecodeError, match="^JSON nested deeper than 1024 levels"):
        CtrIdCodec().decode(f'{head}, "x": {"[" * 1100 + "]" * 1100}}}'.encode())
