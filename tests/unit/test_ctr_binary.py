"""The binary form of CTR requests (pipeline/codecs/ctr_binary.py): the same features
as the JSON form, bit for bit, and precise reasons for everything malformed."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from pipeline.codecs import ctr_binary as B
from pipeline.codecs.base import DecodeError
from pipeline.codecs.ctr import CtrCodec
from pipeline.loadgen.ctr import CtrRequestFactory

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture
def codec() -> CtrCodec:
    return CtrCodec(max_items=50)


def doc(**top: object) -> dict:
    d: dict = {
        "request_id": "r1",
        "user_id": "u9",
        "priority": 2,
        "deadline_ms": 80,
        "tenant": "shop",
        "context": {"I1": 3, "C1": "68fd1e64", "C2": None, "I2": 2.5e12},
        "items": [
            {"item_id": "a", "I7": 1, "C14": "0000abcd"},
            {"item_id": "b", "I8": None, "C15": "ffffffffffffffff", "C16": "AB"},
        ],
    }
    d.update(top)
    return d


def reason(codec: CtrCodec, value: bytes) -> str:
    with pytest.raises(DecodeError) as exc:
        codec.decode(value)
    return str(exc.value)


def test_generated_requests_decode_the_same_in_both_forms():
    json_codec = CtrCodec()
    factory = CtrRequestFactory(seed=8)
    for i in range(300):
        value = factory.make(i)[1]
        a = json_codec.decode(value)
        b = json_codec.decode(B.encode(orjson.loads(value)))
        assert np.array_equal(a.payload.cat, b.payload.cat)
        assert np.array_equal(a.payload.dense, b.payload.dense, equal_nan=True)
        assert (a.request_id, a.rows, a.extra, a.priority, a.deadline_ms, a.tenant) == (
            b.request_id, b.rows, b.extra, b.priority, b.deadline_ms, b.tenant
        )


def test_metadata_missing_values_long_tokens_and_clipping_match_the_json_form(codec):
    d = doc()
    a, b = codec.decode(orjson.dumps(d)), codec.decode(B.encode(d))
    assert np.array_equal(a.payload.cat, b.payload.cat)
    assert np.array_equal(a.payload.dense, b.payload.dense, equal_nan=True)
    assert (b.priority, b.deadline_ms, b.tenant, b.extra["item_ids"]) == (2, 80, "shop", ["a", "b"])


def test_layout_is_aligned_and_sized_as_documented():
    value = B.encode(doc())
    (h,) = struct.unpack_from("<I", value, 4)
    assert value[:4] == B.MAGIC and (8 + h) % 8 == 0
    assert len(value) == 8 + h + B.FIXED_BYTES + 2 * B.BYTES_PER_ITEM == 8 + h + 141 + 290


def _with_header(value: bytes, header: dict) -> bytes:
    """The same arrays behind another header (padded like the encoder pads)."""
    (h,) = struct.unpack_from("<I", value, 4)
    head = orjson.dumps(header)
    head += b" " * (-(8 + len(head)) % 8)
    return B.MAGIC + struct.pack("<I", len(head)) + head + value[8 + h :]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda v: v[:6], "binary request: 6 bytes is shorter than its 8-byte prefix"),
        (lambda v: v[:8] + b"{}", "binary request: header length"),
        (lambda v: v[:-1], "binary request: expected"),
        (lambda v: v + b"\0", "binary request: expected"),
        (lambda v: v[:-1] + b"\x02", "binary request: token presence bytes must be 0 or 1"),
        (lambda v: _with_header(v, {"item_ids": ["a", "b"]}), "missing field 'request_id'"),
        (lambda v: _with_header(v, {"request_id": "r", "item_ids": "ab"}), "item_ids: expected array, got string"),
        (lambda v: _with_header(v, {"request_id": "r"}), "missing field 'item_ids'"),
        (lambda v: _with_header(v, {"request_id": "r", "item_ids": []}), "item_ids: expected at least 1 item, got 0"),
        (lambda v: _with_header(v, {"request_id": "r", "item_ids": ["a", 7]}), "item_ids[1]: expected non-empty string, got int"),
        (lambda v: _with_header(v, {"request_id": "r", "item_ids": ["", "b"]}), "item_ids[0]: expected non-empty string, got ''"),
        (lambda v: _with_header(v, {"request_id": "r", "item_ids": ["a"]}), "binary request: expected"),
        (lambda v: _with_header(v, {"request_id": "r", "priority": 12, "item_ids": ["a", "b"]}), "priority: expected int 0..9, got 12"),
        (lambda v: B.MAGIC + struct.pack("<I", 2) + b"[]" + v[8:], "binary header: expected a JSON object at top level"),
        (lambda v: B.MAGIC + struct.pack("<I", 2) + b"{x" + v[8:], "binary header: malformed JSON"),
    ],
)
def test_malformed_binary_requests_have_precise_reasons(codec, mutate, expected):
    assert reason(codec, mutate(B.encode(doc()))).startswith(expected)


def test_too_many_items_in_the_binary_form(codec):
    d = doc(items=[{"item_id": f"i{k}"} for k in range(51)])
    assert reason(codec, B.encode(d)) == "too many items: 51 > max_items 50"


def test_encoder_refuses_what_it_cannot_represent():
    with pytest.raises(ValueError, match="token"):
        B.encode(doc(items=[{"item_id": "a", "C14": "xyz"}]))
    with pytest.raises(ValueError, match="counts"):
        B.encode(doc(items=[{"item_id": "a", "I7": "3"}]))


def test_produce_sends_the_binary_form_for_ctr_only():
    from pipeline.app.produce import produce
    from pipeline.errors import UserError

    with pytest.raises(UserError, match="applies to the ctr pipeline"):
        produce("127.0.0.1:1", "text", rate=1.0, count=1, encoding="binary")
    with pytest.raises(UserError, match="unknown encoding"):
        produce("127.0.0.1:1", "ctr", rate=1.0, count=1, encoding="avro")


def test_decode_many_equals_decode_one_by_one_with_errors_in_place(codec):
    """A poll's binary requests are featurised together; a bad one in the middle is
    its own DecodeError and moves nobody else's rows."""
    factory = CtrRequestFactory(seed=21)
    values: list[bytes | None] = []
    for i in range(12):
        _, value = factory.make(i)
        values.append(value if i % 3 == 0 else B.encode(orjson.loads(value)))  # JSON among binary
    values.insert(4, B.encode(doc())[:-3])  # truncated binary
    values.insert(7, b"{not json")
    values.insert(9, None)
    got = codec.decode_many([(v, None) for v in values])
    assert len(got) == len(values)
    for value, outcome in zip(values, got, strict=True):
        try:
            want = codec.decode(value)
        except DecodeError as exc:
            assert isinstance(outcome, DecodeError) and str(outcome) == str(exc)
            continue
        assert outcome.request_id == want.request_id and outcome.rows == want.rows
        assert (outcome.priority, outcome.deadline_ms, outcome.tenant) == (want.priority, want.deadline_ms, want.tenant)
        assert outcome.extra == want.extra
        assert np.array_equal(outcome.payload.cat, want.payload.cat)
        assert np.array_equal(outcome.payload.dense, want.payload.dense, equal_nan=True)
        assert outcome.payload.cat.flags.c_contiguous and outcome.payload.dense.flags.c_contiguous
    # and the batch stacks exactly like one-by-one payloads
    ok = [d for d in got if not isinstance(d, Exception)]
    singles = [codec.decode(v) for v in values if not isinstance(codec.decode_many([(v, None)])[0], Exception)]
    a = codec.collate([d.payload for d in ok])
    b = codec.collate([d.payload for d in singles])
    assert np.array_equal(a["cat"], b["cat"]) and np.array_equal(a["dense"], b["dense"], equal_nan=True)


def _with_raw_header(value: bytes, header: bytes) -> bytes:
    (h,) = struct.unpack_from("<I", value, 4)
    header += b" " * (-(8 + len(header)) % 8)
    return B.MAGIC + struct.pack("<I", len(header)) + header + value[8 + h :]


def test_binary_header_huge_integers_and_depth(codec):
    value = B.encode(doc())
    ids = '"item_ids": ["a", "b"]'
    big = "1" + "0" * 400
    deadline = _with_raw_header(value, f'{{"request_id": "r", {ids}, "deadline_ms": {big}}}'.encode())
    assert codec.decode(deadline).deadline_ms == 2**63 - 1
    assert codec.decode_many([(deadline, None)])[0].deadline_ms == 2**63 - 1
    prio = _with_raw_header(value, f'{{"request_id": "r", {ids}, "priority": 18446744073709551616}}'.encode())
    assert reason(codec, prio) == "priority: expected int 0..9, got 18446744073709551616"
    deep = _with_raw_header(value, f'{{"request_id": "r", {ids}, "x": {"[" * 1100 + "]" * 1100}}}'.encode())
    assert reason(codec, deep) == "binary header: JSON nested deeper than 1024 levels (documented limit)"
