"""CtrCodec: validation reasons, featurisation, collate/split, and the load generator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from models.ctr import features as F
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.codecs.ctr import CtrCodec, CtrPayload
from pipeline.loadgen.ctr import INVALID_KINDS, CtrRequestFactory

pytestmark = pytest.mark.filterwarnings("error")  # e.g. numpy overflow in a cast

SPEC = Path(__file__).resolve().parents[2] / "models" / "ctr" / "spec.json"


@pytest.fixture(scope="module")
def factory() -> CtrRequestFactory:
    return CtrRequestFactory(seed=3)


@pytest.fixture
def codec() -> CtrCodec:
    return CtrCodec()


def request(items: list[dict] | None = None, **top: object) -> dict:
    doc: dict = {
        "request_id": "r1",
        "context": {"I1": 3, "C1": "68fd1e64"},
        "items": items if items is not None else [{"item_id": "a", "I7": 1, "C14": "0000abcd"}],
    }
    doc.update(top)
    return doc


def reason(codec: CtrCodec, value: bytes | None) -> str:
    with pytest.raises(DecodeError) as info:
        codec.decode(value, None)
    text = str(info.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------------------- invalid input
def test_every_generator_invalid_kind_is_rejected_with_its_reason(factory, codec):
    expected = {
        "missing_field": "missing field 'items'",
        "mistyped_field": "items[0].C14: expected hex string or null, got int",
        "too_many_items": "too many items: 1001 > max_items 1000",
        "empty": "empty message value",
    }
    for kind in INVALID_KINDS:
        value = factory.make_invalid(kind)
        got = reason(codec, value)
        if kind == "malformed_json":
            assert got.startswith("malformed JSON: unexpected end of data at line 1 column ")
        elif kind == "non_utf8":
            offset = value.index(b"\xff")
            assert got == f"value is not valid UTF-8 (byte 0xff at offset {offset})"
        else:
            assert got == expected[kind], kind


def test_unknown_invalid_kind_names_the_kinds(factory):
    with pytest.raises(ValueError, match="malformed_json"):
        factory.make_invalid("nope")


def test_too_many_items_respects_the_codec_limit(factory):
    value = factory.make_invalid("too_many_items", max_items=5)
    assert reason(CtrCodec(max_items=5), value) == "too many items: 6 > max_items 5"
    assert CtrCodec(max_items=6).decode(value, None).rows == 6


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "empty message value"),
        (b"", "empty message value"),
        (
            b'{"a": x}',
            "malformed JSON: unexpected character, expected a JSON value at line 1 column 7",
        ),
        (b"[1, 2]", "expected a JSON object at top level, got array"),
        (b'"text"', "expected a JSON object at top level, got string"),
        (b'{"request_id": "\xc3"}', "value is not valid UTF-8 (byte 0xc3 at offset 16)"),
    ],
)
def test_bytes_level_reasons(codec, value, expected):
    assert reason(codec, value) == expected


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"context": {}, "items": [{"item_id": "a"}]}, "missing field 'request_id'"),
        (request(request_id=7), "request_id: expected non-empty string, got int"),
        (request(request_id=None), "request_id: expected non-empty string, got null"),
        (request(request_id=""), "request_id: expected non-empty string, got ''"),
        (request(request_id="x" * 129), "request_id: expected at most 128 characters, got 129"),
        (request(priority=10), "priority: expected int 0..9, got 10"),
        (request(priority=True), "priority: expected int 0..9, got bool"),
        (request(priority="1"), "priority: expected int 0..9, got string"),
        (request(deadline_ms=0), "deadline_ms: expected int > 0, got 0"),
        (request(deadline_ms=1.5), "deadline_ms: expected int > 0, got float"),
        (request(tenant=3), "tenant: expected string or null, got int"),
        (request(user_id=[]), "user_id: expected string or null, got array"),
        ({"request_id": "r", "items": [{"item_id": "a"}]}, "missing field 'context'"),
        (request(context=[]), "context: expected object, got array"),
        (request(context=None), "context: expected object, got null"),
        ({"request_id": "r", "context": {}}, "missing field 'items'"),
        (request(items={}), "items: expected array, got object"),
        (request(items=[]), "items: expected at least 1 item, got 0"),
        (request(items=[{"item_id": "a"}, 5]), "items[1]: expected object, got int"),
        (request(items=[{"item_id": "a"}, {"I7": 1}]), "missing field 'items[1].item_id'"),
        (request(items=[{"item_id": ""}]), "items[0].item_id: expected non-empty string, got ''"),
        (request(items=[{"item_id": 12}]), "items[0].item_id: expected non-empty string, got int"),
        (request(context={"I2": "12"}), "context.I2: expected number or null, got string"),
        (request(context={"I6": True}), "context.I6: expected number or null, got bool"),
        (request(context={"C13": 5}), "context.C13: expected hex string or null, got int"),
        (request(context={"C2": "xyz"}), "context.C2: expected hex string or null, got 'xyz'"),
        (
            request(items=[{"item_id": "a"}, {"item_id": "b", "I9": [1]}]),
            "items[1].I9: expected number or null, got array",
        ),
        (
            request(items=[{"item_id": "a"}, {"item_id": "b", "C26": {"x": 1}}]),
            "items[1].C26: expected hex string or null, got object",
        ),
        (
            request(items=[{"item_id": "a", "C14": 1.5}]),
            "items[0].C14: expected hex string or null, got float",
        ),
        (
            request(items=[{"item_id": "a", "C20": ""}]),
            "items[0].C20: expected hex string or null, got ''",
        ),
        (
            request(items=[{"item_id": "a", "C15": "0x1234ab"}]),
            "items[0].C15: expected hex string or null, got '0x1234ab'",
        ),
        (
            request(items=[{"item_id": "a", "C15": "1234 abc"}]),
            "items[0].C15: expected hex string or null, got '1234 abc'",
        ),
        (
            request(
                items=[{"item_id": "a", "C15": "12345678a"}, {"item_id": "b", "C16": "1" * 17}]
            ),
            "items[1].C16: expected hex string or null, got '11111111111111111'",
        ),
        (
            request(
                items=[{"item_id": "a", "C15": "١٢٣٤٥٦٧٨"}]
            ),  # Arabic-Indic digits: int() takes them
            "items[0].C15: expected hex string or null, got '١٢٣٤٥٦٧٨'",
        ),
        (
            request(items=[{"item_id": "a", "C14": "abcdefgh"}]),
            "items[0].C14: expected hex string or null, got 'abcdefgh'",
        ),
        (
            request(
                items=[{"item_id": "a", "C14": "g0000000", "C15": None}]
            ),  # the fast path's stand-in
            "items[0].C14: expected hex string or null, got 'g0000000'",
        ),
    ],
)
def test_field_level_reasons(codec, doc, expected):
    assert reason(codec, orjson.dumps(doc)) == expected


def test_long_bad_token_is_shortened_in_the_reason(codec):
    doc = request(items=[{"item_id": "a", "C14": "z" * 500}])
    got = reason(codec, orjson.dumps(doc))
    assert got.startswith("items[0].C14: expected hex string or null, got 'zzz") and len(got) < 120


def test_max_items_must_be_positive():
    with pytest.raises(ValueError):
        CtrCodec(max_items=0)


# ---------------------------------------------------------------------------- valid input
def test_valid_request_shapes_and_metadata(codec):
    items = [{"item_id": f"it{k}", "I7": k, "C14": f"{k:08x}"} for k in range(5)]
    doc = request(items, tenant="t1", priority=2, deadline_ms=40, user_id="u1", extra={"x": 1})
    d = codec.decode(orjson.dumps(doc), {"h": b"v"})
    assert isinstance(d, Decoded)
    assert (d.request_id, d.rows, d.priority, d.deadline_ms, d.tenant) == ("r1", 5, 2, 40, "t1")
    assert d.extra == {"item_ids": [f"it{k}" for k in range(5)]}
    assert isinstance(d.payload, CtrPayload)
    assert d.payload.dense.shape == (5, 13) and d.payload.dense.dtype == np.float32
    assert d.payload.cat.shape == (5, 26) and d.payload.cat.dtype == np.int64
    assert d.payload.dense[:, 6].tolist() == [0, 1, 2, 3, 4]
    assert (d.payload.dense[:, 0] == 3).all()  # context repeated on every item row


def test_optional_metadata_defaults(codec):
    d = codec.decode(orjson.dumps(request(priority=None, deadline_ms=None, tenant=None)), None)
    assert (d.priority, d.deadline_ms, d.tenant) == (0, None, None)


def test_missing_features_map_to_nan_and_reserved_ids(codec):
    absent = codec.decode(orjson.dumps(request(context={}, items=[{"item_id": "a"}])), None)
    nulls = {"item_id": "a", **{k: None for k in F.ITEM_DENSE + F.ITEM_CAT}}
    null_ctx = {k: None for k in F.CONTEXT_DENSE + F.CONTEXT_CAT}
    explicit = codec.decode(orjson.dumps(request(context=null_ctx, items=[nulls])), None)
    for d in (absent, explicit):
        assert np.isnan(d.payload.dense).all()
        assert d.payload.cat.tolist() == [list(range(26))]
    # the model sees a missing count as 0 with its missing flag set
    assert F.dense_transform(absent.payload.dense).tolist() == [[0.0] * 13 + [1.0] * 13]


def test_hashing_matches_the_documented_formula(codec):
    rng = np.random.default_rng(0)
    ctx = {
        k: f"{int(v):08x}" for k, v in zip(F.CONTEXT_CAT, rng.integers(0, 2**32, 13), strict=True)
    }
    items = [
        {
            "item_id": str(j),
            **{
                k: f"{int(v):08X}"
                for k, v in zip(F.ITEM_CAT, rng.integers(0, 2**32, 13), strict=True)
            },
        }
        for j in range(3)
    ]
    items[1]["C20"] = "1a"  # short tokens are legal (slow path)
    d = codec.decode(orjson.dumps(request(items, context=ctx)), None)
    spec = json.loads(SPEC.read_text())["hashing"]
    salts = [int(s, 16) for s in spec["salts"]]
    assert salts == [int(s) for s in F.FIELD_SALTS]
    mult, table, reserved = int(spec["multiplier"], 16), spec["table_size"], spec["n_reserved"]
    for row, item in enumerate(items):
        tokens = [ctx[k] for k in F.CONTEXT_CAT] + [item[k] for k in F.ITEM_CAT]
        for f, tok in enumerate(tokens):
            h = (((int(tok, 16) ^ salts[f]) * mult) % 2**64) >> 32
            assert d.payload.cat[row, f] == reserved + ((h * (table - reserved)) >> 32)


def test_token_case_and_length_do_not_matter_for_the_value(codec):
    def ids(tok: str) -> int:
        return int(codec.decode(orjson.dumps(request(context={"C1": tok})), None).payload.cat[0, 0])

    assert ids("0000abcd") == ids("0000ABCD") == ids("abcd") == ids("000000000000abcd")


def test_parse_tokens_fast_and_slow_paths_agree():
    rng = np.random.default_rng(1)
    vals = rng.integers(0, 2**32, 400)
    tokens: list[str | None] = [f"{int(v):08x}" for v in vals]
    for k in rng.choice(400, 60, replace=False):
        tokens[int(k)] = None
    fast_v, fast_p = F.parse_tokens(tokens)
    slow_v, slow_p = F._parse_tokens_slow(tokens)
    assert (fast_p == slow_p).all() and (fast_v == slow_v).all()
    assert fast_p.sum() == 340 and (fast_v[fast_p] == vals[fast_p].astype(np.uint64)).all()


def test_dense_values_extremes(codec):
    doc = orjson.dumps(request(context={"I1": 1e300, "I2": -5, "I3": 2.5, "I4": 0, "I5": -1e300}))
    doc = doc.replace(b'"I4":0', b'"I4":100000000000000000000')  # beyond int64
    d = codec.decode(doc, None).payload.dense[0]
    assert d[0] == F.DENSE_CLIP and d[1] == -5 and d[2] == 2.5 and d[3] == F.DENSE_CLIP
    assert d[4] == -F.DENSE_CLIP and np.isnan(d[5])
    t = F.dense_transform(d[None, :])[0]
    assert t[1] == t[4] == 0.0 and t[0] == pytest.approx(np.log1p(F.DENSE_CLIP), rel=1e-6)


# ---------------------------------------------------------------------------- collate / split
def _decode_many(codec: CtrCodec, factory: CtrRequestFactory, n: int) -> list[Decoded]:
    return [codec.decode(factory.make(i)[1], None) for i in range(n)]


def test_collate_split_round_trip_keeps_order(codec, factory):
    decoded = _decode_many(codec, factory, 12)
    feeds = codec.collate([d.payload for d in decoded])
    total = sum(d.rows for d in decoded)
    assert feeds["dense"].shape == (total, 13) and feeds["cat"].shape == (total, 26)
    np.testing.assert_array_equal(feeds["cat"], np.concatenate([d.payload.cat for d in decoded]))
    prob = np.arange(total, dtype=np.float32)  # score = global row number
    results = codec.split({"prob": prob}, decoded)
    offset = 0
    for d, res in zip(decoded, results, strict=True):
        assert res["request_id"] == d.request_id
        assert res["item_ids"] == d.extra["item_ids"]
        assert res["scores"] == list(range(offset, offset + d.rows))
        offset += d.rows


def test_padding_rows_are_neutral_and_never_reach_results(codec, factory):
    decoded = _decode_many(codec, factory, 3)
    total = sum(d.rows for d in decoded)
    feeds = codec.collate([d.payload for d in decoded], pad_to_rows=total + 7)
    assert feeds["dense"].shape == (total + 7, 13)
    assert (feeds["dense"][total:] == 0).all()
    assert (feeds["cat"][total:] == np.arange(26)).all()
    prob = np.concatenate([np.full(total, 0.5), np.full(7, -1.0)]).astype(np.float32)
    results = codec.split({"prob": prob}, decoded)
    assert sum(len(r["scores"]) for r in results) == total
    assert all(s == 0.5 for r in results for s in r["scores"])
    with pytest.raises(ValueError):
        codec.collate([d.payload for d in decoded], pad_to_rows=total - 1)
    with pytest.raises(ValueError):
        codec.split({"prob": prob[: total - 1]}, decoded)


def test_collate_of_nothing_with_padding(codec):
    feeds = codec.collate([], pad_to_rows=4)
    assert feeds["cat"].shape == (4, 26) and (feeds["cat"] == np.arange(26)).all()


# ---------------------------------------------------------------------------- generator
def test_generator_output_always_decodes(codec):
    for seed in (0, 1, 99):
        f = CtrRequestFactory(
            seed, mean_items=12, max_items=60, tenant="t", priority=4, deadline_ms=80
        )
        ids = set()
        for i in range(300):
            key, value = f.make(i)
            d = codec.decode(value, None)
            doc = orjson.loads(value)
            assert key == doc["user_id"].encode()
            assert d.request_id == f"req-{seed}-{i}" and d.request_id not in ids
            ids.add(d.request_id)
            assert 1 <= d.rows <= 60 and d.rows == len(doc["items"])
            assert len(set(d.extra["item_ids"])) == d.rows  # candidates are distinct
            assert (d.priority, d.deadline_ms, d.tenant) == (4, 80, "t")


def test_generator_is_deterministic_and_seeded():
    a, b, c = CtrRequestFactory(5), CtrRequestFactory(5), CtrRequestFactory(6)
    assert [a.make(i) for i in (0, 1, 700)] == [b.make(i) for i in (700, 1, 0)][::-1]
    assert a.make(3)[1] != c.make(3)[1]


def test_generator_item_counts_and_missing_rates(codec):
    f = CtrRequestFactory(11, mean_items=20, max_items=200)
    decoded = [codec.decode(f.make(i)[1], None) for i in range(600)]
    rows = np.array([d.rows for d in decoded])
    assert 16 < rows.mean() < 24 and rows.min() >= 1 and rows.max() <= 200
    dense = np.concatenate([d.payload.dense for d in decoded])
    cat = np.concatenate([d.payload.cat for d in decoded])
    # I12 is missing ~77 % of the time, I8 never; C22 ~75 %, C1 never (synth.py)
    assert 0.7 < np.isnan(dense[:, 11]).mean() < 0.84 and not np.isnan(dense[:, 7]).any()
    assert 0.68 < (cat[:, 21] == 21).mean() < 0.82 and not (cat[:, 0] == 0).any()


# ---------------------------------------------------------------------------- hostile numbers
BIG = "1" + "0" * 400  # a 401-digit integer: beyond 64 bits and beyond the double range


def _raw(extra: str, context: str = "{}", item: str = '{"item_id": "a"}') -> bytes:
    """A request with JSON text that orjson.dumps could not write (huge literals)."""
    return f'{{"request_id": "r1", "context": {context}, "items": [{item}]{extra}}}'.encode()


@pytest.mark.parametrize("literal", ["18446744073709551616", "9223372036854775808", BIG, "9" * 5000])
def test_huge_deadline_saturates_instead_of_being_refused(codec, literal):
    # It can only tighten the SLO; saturating keeps it an int64 every reader can hold.
    assert codec.decode(_raw(f', "deadline_ms": {literal}')).deadline_ms == 2**63 - 1


@pytest.mark.parametrize(
    ("literal", "shown"),
    [
        ("18446744073709551616", "18446744073709551616"),
        (BIG, "100000000000...(401 digits)"),
        ("-" + BIG, "-10000000000...(401 digits)"),
        ("9" * 5000, "999999999999...(5000 digits)"),
    ],
)
def test_huge_priority_is_out_of_range_naming_the_value_not_a_float(codec, literal, shown):
    assert reason(codec, _raw(f', "priority": {literal}')) == f"priority: expected int 0..9, got {shown}"


def test_negative_huge_deadline_is_refused_naming_the_value(codec):
    assert reason(codec, _raw(f', "deadline_ms": -{BIG}')) == "deadline_ms: expected int > 0, got -10000000000...(401 digits)"


def test_float_literals_still_read_as_float(codec):
    assert reason(codec, _raw(', "priority": 1e400')) == "priority: expected int 0..9, got float"
    assert reason(codec, _raw(', "deadline_ms": 1.8446744073709552e19')) == "deadline_ms: expected int > 0, got float"


@pytest.mark.parametrize("literal", ["1e309", BIG, "9" * 5000, "-1e309", "-" + BIG])
def test_counts_beyond_the_double_range_saturate(codec, literal):
    d = codec.decode(_raw("", context=f'{{"I1": {literal}}}', item=f'{{"item_id": "a", "I7": {literal}}}'))
    sign = -1 if literal.startswith("-") else 1
    assert d.payload.dense[0, 0] == d.payload.dense[0, 6] == sign * F.DENSE_CLIP


def test_fallback_parse_refuses_what_orjson_refuses(codec):
    # The stdlib parser runs only for huge numbers, and must not let through what
    # orjson would refuse: NaN, unpaired surrogates (unwritable in the result).
    assert reason(codec, _raw("", context='{"I1": 1e309, "I2": NaN}')).startswith("malformed JSON: ")
    bad = _raw("", context='{"I1": 1e309}', item='{"item_id": "a\\ud800"}')
    assert reason(codec, bad).startswith("malformed JSON: ")


def test_deep_nesting_is_refused_with_the_documented_limit(codec):
    deep = "[" * 1100 + "]" * 1100
    assert reason(codec, _raw(f', "x": {deep}')) == "JSON nested deeper than 1024 levels (documented limit)"
    ok = "[" * 1000 + "]" * 1000  # unknown fields are ignored up to the limit
    assert codec.decode(_raw(f', "x": {ok}')).request_id == "r1"


def test_deep_document_with_a_huge_number_still_parses_exactly(codec):
    # The exact parser recurses per level: it must reach orjson's own depth limit.
    ok = "[" * 1020 + "]" * 1020
    assert reason(codec, _raw(f', "x": {ok}, "priority": {BIG}')) == "priority: expected int 0..9, got 100000000000...(401 digits)"
