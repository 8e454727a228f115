"""Dead-letter and late copies always fit their topic (consumers/dead_letter.py): a copy
Kafka refuses would leave its request without an outcome."""

from __future__ import annotations

import hashlib

from consumers.dead_letter import (
    C_CLASS,
    C_CONNECTOR,
    C_EXCEPTION,
    C_MESSAGE,
    C_OFFSET,
    C_PARTITION,
    C_STACKTRACE,
    C_STAGE,
    C_TASK,
    C_TOPIC,
    H_ERROR,
    H_KEY_BYTES,
    H_OFFSET,
    H_REPLAYED_FROM,
    H_REPLAYED_ORIGIN,
    H_STAGE,
    H_TRUNCATED,
    H_VALUE_BYTES,
    H_VALUE_SHA256,
    KEY_PREFIX_BYTES,
    MAX_STACKTRACE_CHARS,
    MAX_WHERE_CHARS,
    RECORD_OVERHEAD_BYTES,
    Origin,
    dead_letter_copy,
    late_copy,
    record_bytes,
)
from consumers.records import SourceRecord
from pipeline.codecs.base import DecodeError
from pipeline.delivery.limits import DEAD_LETTER_HEADROOM_BYTES

LIMIT = 1_000_000


def _rec(value: bytes | None, key: bytes | None = b"user-1", headers: dict[str, bytes] | None = None) -> SourceRecord:
    return SourceRecord("ctr.requests", 3, 41, key, value, headers or {}, 1_700_000_000_000)


def test_a_copy_that_fits_is_the_original_bytes_with_original_headers_first() -> None:
    rec = _rec(b"{bad json", headers={"trace": b"abc", "tidebatch.error": b"old hop"})
    copy = dead_letter_copy(rec, "malformed JSON", "decode", LIMIT, 65536)
    assert (copy.key, copy.value, copy.truncated) == (b"user-1", b"{bad json", False)
    names = [k for k, _ in copy.headers]
    assert names[0] == "trace" and names.count(H_ERROR) == 1  # our own old headers are not kept
    assert dict(copy.headers)[H_ERROR] == b"malformed JSON"
    assert dict(copy.headers)[H_OFFSET] == b"41"


def test_the_one_megabyte_repro_is_cut_to_a_prefix_with_size_and_hash() -> None:
    value = b"{" + b"x" * 999_899
    copy = dead_letter_copy(_rec(value), "malformed JSON: unexpected end of data", "decode", LIMIT, 65536)
    headers = dict(copy.headers)
    assert copy.truncated and copy.value == value[:65536]
    assert headers[H_TRUNCATED] == b"value"
    assert headers[H_VALUE_BYTES] == b"999900"
    assert headers[H_VALUE_SHA256] == hashlib.sha256(value).hexdigest().encode()
    assert headers[H_STAGE] == b"decode"
    assert record_bytes(copy.key, copy.value, copy.headers) <= LIMIT


def test_a_tight_limit_gets_a_shorter_prefix_never_an_oversized_copy() -> None:
    value = b"y" * 50_000
    copy = dead_letter_copy(_rec(value), "too big", "admit", 20_000, 65536)
    assert 0 < len(copy.value or b"") < 20_000
    assert record_bytes(copy.key, copy.value, copy.headers) <= 20_000


def test_huge_headers_and_key_are_given_up_after_the_value() -> None:
    rec = _rec(b"v" * 10, key=b"k" * 1_200_000, headers={"big": b"h" * 700_000})
    copy = dead_letter_copy(rec, "request too large", "admit", LIMIT, 65536)
    headers = dict(copy.headers)
    assert "big" not in headers
    assert headers[H_TRUNCATED] == b"headers,key"  # the 10-byte value was kept whole
    assert headers[H_KEY_BYTES] == b"1200000" and copy.key == b"k" * KEY_PREFIX_BYTES
    assert copy.value == b"v" * 10
    assert record_bytes(copy.key, copy.value, copy.headers) <= LIMIT


def test_the_minimal_copy_has_no_value_and_only_our_headers() -> None:
    rec = _rec(b"z" * 100, headers={"trace": b"abc"})
    copy = dead_letter_copy(rec, "refused", "publish", LIMIT, 65536, minimal=True)
    headers = dict(copy.headers)
    assert copy.value == b"" and "trace" not in headers
    assert headers[H_TRUNCATED] == b"value,headers" and headers[H_VALUE_BYTES] == b"100"


def test_late_copies_fit_the_same_way() -> None:
    copy = late_copy(_rec(b"q" * 2_000_000), 12.5, LIMIT, 1024)
    assert copy.truncated and len(copy.value or b"") == 1024
    assert record_bytes(copy.key, copy.value, copy.headers) <= LIMIT


def test_a_reason_becomes_one_bounded_line() -> None:
    copy = dead_letter_copy(_rec(b"x"), "line one\nline two " + "w" * 5000, "decode", LIMIT, 10)
    reason = dict(copy.headers)[H_ERROR].decode()
    assert "\n" not in reason and reason.startswith("line one line two") and len(reason) <= 1000


# ----------------------------------------------------------------------------- Connect headers
ORIGIN = Origin("tidebatch-ctr", "worker-0", "pipeline.codecs.ctr.CtrCodec")


def test_a_dead_letter_carries_kafka_connects_context_headers_alongside_ours() -> None:
    rec = _rec(b"{bad", headers={"trace": b"abc"})
    copy = dead_letter_copy(rec, "malformed JSON", "decode", LIMIT, 65536, origin=ORIGIN, error=DecodeError("x"))
    h = dict(copy.headers)
    assert h[H_ERROR] == b"malformed JSON" and h[H_STAGE] == b"decode"  # today's, unchanged
    assert (h[C_TOPIC], h[C_PARTITION], h[C_OFFSET]) == (b"ctr.requests", b"3", b"41")
    assert (h[C_CONNECTOR], h[C_TASK], h[C_CLASS]) == (b"tidebatch-ctr", b"worker-0", b"pipeline.codecs.ctr.CtrCodec")
    assert h[C_STAGE] == b"VALUE_CONVERTER" and h[C_MESSAGE] == b"malformed JSON"
    assert h[C_EXCEPTION] == b"pipeline.codecs.base.DecodeError"
    assert C_STACKTRACE not in h  # a DecodeError raised nowhere has no traceback


def test_without_an_exception_the_stage_names_the_error_class() -> None:
    h = dict(dead_letter_copy(_rec(b"v"), "request is 600123 bytes", "admit", LIMIT, 10, origin=ORIGIN).headers)
    assert h[C_EXCEPTION] == b"tidebatch.RequestTooLarge" and h[C_STAGE] == b"KAFKA_CONSUME"


def test_an_internal_error_carries_the_end_of_its_stack_trace() -> None:
    try:
        raise KeyError("boom")
    except KeyError as exc:
        copy = dead_letter_copy(_rec(b"v"), "internal error: KeyError", "publish", LIMIT, 10, error=exc)
    h = dict(copy.headers)
    assert h[C_EXCEPTION] == b"builtins.KeyError" and h[C_STAGE] == b"KAFKA_PRODUCE"
    assert b"KeyError: 'boom'" in h[C_STACKTRACE] and len(h[C_STACKTRACE]) <= MAX_STACKTRACE_CHARS
    assert C_CONNECTOR not in h  # no origin given


def _deep(n: int) -> None:
    if n:
        _deep(n - 1)
    raise RuntimeError("é" * 3000)


def test_our_headers_at_their_worst_fit_the_headroom_the_entry_limit_leaves() -> None:
    """pipeline/delivery/limits.py keeps the entry limit DEAD_LETTER_HEADROOM_BYTES below the
    dead-letter topic's, so that every decoded request can be dead-lettered whole."""
    name = "t" * 249
    marks = {H_REPLAYED_FROM: b"f" * 10_000, H_REPLAYED_ORIGIN: "é".encode() * 10_000}  # a replay's, forged
    rec = SourceRecord(name, 2**31 - 1, 2**63 - 1, b"k", b"v" * 100, marks, 2**63 - 1)
    wide = Origin("g" * 5000, "é" * 5000, "c" * 5000)
    try:
        _deep(50)
    except RuntimeError as raised:
        exc = raised
    copy = dead_letter_copy(rec, "é" * 5000, "inference", LIMIT, 65536, origin=wide, error=exc)
    own = [(k, v) for k, v in copy.headers]
    assert len(dict(own)[H_REPLAYED_FROM]) == MAX_WHERE_CHARS  # kept, bounded
    size = record_bytes(None, None, own) - RECORD_OVERHEAD_BYTES
    assert size <= DEAD_LETTER_HEADROOM_BYTES - 1024, size  # and room for the cut-down notes
    # A copy of the largest request the entry limit lets in is sent whole.
    limit = 1_000_000
    entry = limit - DEAD_LETTER_HEADROOM_BYTES
    big = SourceRecord(name, 0, 0, None, b"x" * (entry - RECORD_OVERHEAD_BYTES), {}, 0)
    whole = dead_letter_copy(big, "é" * 5000, "inference", limit, 65536, origin=wide, error=exc)
    assert not whole.truncated and record_bytes(whole.key, whole.value, whole.headers) <= limit


def test_the_minimal_copy_keeps_the_connect_headers() -> None:
    copy = dead_letter_copy(_rec(b"z" * 100), "refused", "publish", LIMIT, 65536, minimal=True, origin=ORIGIN)
    h = dict(copy.headers)
    assert h[C_CONNECTOR] == b"tidebatch-ctr" and h[C_EXCEPTION] == b"tidebatch.RecordRefused"
