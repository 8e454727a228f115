"""Dead-letter and late copies always fit their topic (consumers/dead_letter.py): a copy
Kafka refuses would leave its request without an outcome."""

from __future__ import annotations

import hashlib

from consumers.dead_letter import (
    H_ERROR,
    H_KEY_BYTES,
    H_OFFSET,
    H_STAGE,
    H_TRUNCATED,
    H_VALUE_BYTES,
    H_VALUE_SHA256,
    KEY_PREFIX_BYTES,
    dead_letter_copy,
    late_copy,
    record_bytes,
)
from consumers.records import SourceRecord

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
