"""What a schema-registry codec refuses and why (one line each), how unknown writer
schemas are fetched off the decoding thread (pipeline/registry/schema_fetch.py), and how
the worker's admission holds a request that waits for one (pipeline/worker/waiting.py):
known ids flow on, a settled fetch lets the request through, a deadline that passes
first dead-letters it with the reason. Fake clocks, no threads, no sleeps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from consumers.records import SourceRecord
from pipeline.codecs.base import Decoded, DecodeError, NotReady
from pipeline.codecs.ctr import CtrCodec
from pipeline.codecs.schema_records import RecordWriter
from pipeline.codecs.schema_wire import SchemaWireCodec
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.registry import schema_fetch
from pipeline.registry.schema_fetch import FORGET_REFUSAL_S, SchemaFetcher
from pipeline.worker.admission import Admission


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ctr() -> tuple[SchemaWireCodec, SchemaFetcher, RecordWriter]:
    client = SchemaRegistryClient.new_client({"url": "mock://waits"})
    fetcher = SchemaFetcher(Clock(), thread=False)
    codec = SchemaWireCodec("avro", CtrCodec(), client, fetcher, "ctr", "ctr.scores")
    return codec, fetcher, RecordWriter("avro", codec.request, client, "ctr.requests")


def reason(codec: SchemaWireCodec, value: bytes | None) -> str:
    with pytest.raises(DecodeError) as refused:
        codec.decode(value)
    assert not isinstance(refused.value, NotReady)
    text = str(refused.value)
    assert "\n" not in text
    return text


def test_each_refusal_is_one_line_naming_its_cause(ctr) -> None:
    codec, fetcher, writer = ctr
    json_request = CtrRequestFactory(seed=1).make(0)[1]
    assert reason(codec, b"") == "empty message value"
    assert reason(codec, json_request) == (
        "not a schema-registry record: magic byte 0x7b (a JSON request?), expected 0x00 "
        "(Confluent wire format: magic byte, schema id, avro payload)")
    assert "magic byte 0x82 (a msgpack request?)" in reason(codec, b"\x82\xa1a\x01\x00\x00")
    assert reason(codec, b"\x00\x00\x01") == ("3-byte value: shorter than the schema-registry header "
                                             "(magic byte + 4-byte schema id), so not a avro record")
    good = writer(orjson.loads(json_request))
    with pytest.raises(NotReady):
        codec.decode(good)
    fetcher.step()
    assert codec.decode(good).request_id == "req-1-0"
    assert reason(codec, good[:40]).startswith("avro record of schema id 1 does not decode: ")
    doc = orjson.loads(json_request)
    del doc["items"][0]["item_id"]
    with pytest.raises(ValueError, match="no value and no default for item_id"):  # Avro writers refuse it
        writer(doc)
    doc = {**orjson.loads(json_request), "items": []}
    assert reason(codec, writer(doc)) == "items: expected at least 1 item, got 0"  # the CTR codec's own words


def test_an_id_the_registry_does_not_have_is_refused_after_one_fetch(ctr) -> None:
    codec, fetcher, _ = ctr
    value = b"\x00\x00\x00\x30\x39" + b"\x02"
    with pytest.raises(NotReady) as waiting:
        codec.decode(value)
    assert str(waiting.value) == "schema id 12345 could not be fetched from the schema registry (no answer yet)"
    assert fetcher.step() is None
    assert waiting.value.ready()
    assert reason(codec, value) == "schema id 12345 is not in the schema registry (HTTP 404: Schema Not Found)"
    fetcher.clock.now += FORGET_REFUSAL_S  # registered since? It is asked again after a while.
    with pytest.raises(NotReady):
        codec.decode(value)


def test_a_schema_of_another_format_is_refused_naming_both(ctr) -> None:
    codec, fetcher, writer = ctr
    from pipeline.codecs.record_types import Record

    other = RecordWriter("jsonschema", Record("Other", ()), codec.reader.client, "other")({})
    with pytest.raises(NotReady):
        codec.decode(other)
    fetcher.step()
    assert reason(codec, other) == ("schema id 1 is a JSON Schema schema, but this pipeline reads avro records "
                                    "(schema_registry.format, or the pipeline's codec)")


def test_the_fetcher_retries_an_unanswered_registry_and_keeps_its_last_error() -> None:
    clock, calls = Clock(), []

    def fetch() -> None:
        calls.append(clock.now)
        if len(calls) < 4:
            raise httpx.ConnectError("[Errno 111] Connection refused")

    fetcher = SchemaFetcher(clock, thread=False)
    fetcher.fetch("schema id 7", fetch)
    fetcher.fetch("schema id 7", fetch)  # once per key
    waits = []
    for _ in range(4):
        waits.append(fetcher.step())
        if fetcher.known("schema id 7"):
            break
        assert fetcher.trouble("schema id 7").endswith("the last: ConnectError: [Errno 111] Connection refused")
        clock.now += waits[-1]
    assert fetcher.known("schema id 7") and calls == pytest.approx([0.0, 0.1, 0.3, 0.7])  # 0.1 s, doubling
    assert waits[:3] == pytest.approx([0.1, 0.2, 0.4]) and waits[3] is None


def test_how_a_fetch_ended_decides() -> None:
    assert schema_fetch.classify("schema id 3", SchemaRegistryError(500, 50001, "store down")) == (
        schema_fetch.RETRY, "HTTP 500: store down")
    assert schema_fetch.classify("schema id 3", SchemaRegistryError(401, 401, "Unauthorized"))[0] == schema_fetch.RETRY
    assert schema_fetch.classify("schema id 3", httpx.ReadTimeout("timed out"))[0] == schema_fetch.RETRY
    # confluent-kafka's client raises httpx2's errors where httpx2 is installed (common/_httpx_compat.py)
    from confluent_kafka.schema_registry.common._httpx_compat import httpx as client_httpx

    assert schema_fetch.classify("schema id 3", client_httpx.ConnectError("[Errno 111] Connection refused")) == (
        schema_fetch.RETRY, "ConnectError: [Errno 111] Connection refused")
    assert schema_fetch.classify("schema id 3", SchemaRegistryError(404, 40403, "Schema not found")) == (
        schema_fetch.REFUSED, "schema id 3 is not in the schema registry (HTTP 404: Schema not found)")
    # fetched, but the record is at fault: its decode says how
    assert schema_fetch.classify("schema id 3", EOFError("short"))[0] == schema_fetch.KNOWN


# ---------------------------------------------------------------------------- the worker's waiting room
class Outcomes:
    def __init__(self) -> None:
        self.dead: list[tuple[int, str]] = []

    def dead_letter(self, rec: SourceRecord, reason: str, stage: str, *, error: Any = None) -> None:
        self.dead.append((rec.offset, reason))

    def late(self, routed: Sequence[tuple[SourceRecord, float]], now_wall: int, rule: str) -> None:
        raise AssertionError("nothing is routed late here")


class WaitingCodec:
    """b"known": decodes; b"new": waits until `fetched`; b"gone": refused once fetched."""

    name = "toy"

    def __init__(self, failing: bool = True) -> None:
        self.fetched = False
        self.failed = failing

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> Decoded:
        if value == b"known" or (value == b"new" and self.fetched):
            return Decoded(str(value), 1, None)
        if value == b"gone" and self.fetched:
            raise DecodeError("schema id 9 is not in the schema registry (HTTP 404: gone)")
        raise NotReady("schema id 9 could not be fetched from the schema registry (ConnectError: refused)",
                       lambda: self.fetched, lambda: self.failed)


def rec(offset: int, value: bytes, ts: int = 1_000) -> SourceRecord:
    return SourceRecord("in", 0, offset, None, value, {}, ts)


def test_known_ids_flow_while_a_request_waits_and_a_settled_fetch_lets_it_through() -> None:
    codec, outcomes = WaitingCodec(), Outcomes()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1 << 20, wait_ms=300.0)
    queued = adm.admit([rec(0, b"new"), rec(1, b"known"), rec(2, b"gone")], now=0.0, now_wall=1_010)
    assert [r.item.rec.offset for r in queued] == [1] and len(adm.waiting) == 2
    assert adm.admit_waiting(0.1, 1_100) == [] and len(adm.waiting) == 2  # nothing settled: they wait
    codec.fetched = True
    queued = adm.admit_waiting(0.2, 1_200)
    assert [r.item.rec.offset for r in queued] == [0] and len(adm.waiting) == 0
    assert outcomes.dead == [(2, "schema id 9 is not in the schema registry (HTTP 404: gone)")]


def test_a_request_still_waiting_at_its_deadline_is_dead_lettered_with_the_reason() -> None:
    codec, outcomes = WaitingCodec(), Outcomes()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1 << 20, wait_ms=300.0)
    assert adm.admit([rec(0, b"new", ts=1_000), rec(1, b"new", ts=1_200)], now=0.0, now_wall=1_250) == []
    assert adm.admit_waiting(0.1, 1_299) == [] and outcomes.dead == []
    assert adm.admit_waiting(0.2, 1_300) == []  # the first one's deadline: its timestamp + 300 ms
    assert outcomes.dead == [(0, "schema id 9 could not be fetched from the schema registry (ConnectError: refused) "
                                 "within the request's deadline (300 ms after its timestamp)")]
    assert len(adm.waiting) == 1


def test_beyond_the_waiting_rooms_limit_a_request_is_refused_at_once() -> None:
    codec, outcomes = WaitingCodec(), Outcomes()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1 << 20)
    adm.waiting.limit = 1
    adm.admit([rec(0, b"new"), rec(1, b"new")], now=0.0, now_wall=1_010)
    assert len(adm.waiting) == 1 and outcomes.dead[0][0] == 1
    assert outcomes.dead[0][1].endswith("(ConnectError: refused) 1 requests wait already (the most held)")


def test_a_slow_first_fetch_is_waited_for_past_the_deadline_a_failed_one_is_not() -> None:
    """A new id mid-stream: its fetch answers after the request's deadline; the request
    is decoded then (late, not lost). Only a fetch that failed ends the wait at the
    deadline, and none waits more than GRACE_MS past it."""
    from pipeline.worker.waiting import GRACE_MS

    codec, outcomes = WaitingCodec(failing=False), Outcomes()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1 << 20, wait_ms=100.0)
    adm.admit([rec(0, b"new", ts=1_000), rec(1, b"gone", ts=1_000)], now=0.0, now_wall=1_050)
    assert adm.admit_waiting(0.5, 1_500) == [] and outcomes.dead == []  # past the deadline, no failure yet
    codec.fetched = True
    assert [r.item.rec.offset for r in adm.admit_waiting(0.6, 1_600)] == [0]
    assert outcomes.dead == [(1, "schema id 9 is not in the schema registry (HTTP 404: gone)")]
    codec.fetched = False
    adm.admit([rec(2, b"new", ts=2_000)], now=1.0, now_wall=2_010)
    assert adm.admit_waiting(2.0, 2_100 + GRACE_MS - 1) == [] and len(adm.waiting) == 1
    adm.admit_waiting(2.0, 2_100 + GRACE_MS)
    assert len(adm.waiting) == 0 and outcomes.dead[-1][0] == 2
