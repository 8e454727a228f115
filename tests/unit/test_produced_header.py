"""The `tidebatch.produced_ms` request header (consumers/records.py): a producer's
produce() time as ASCII digits; anything else reads as absent, never as an error."""

from __future__ import annotations

import pytest

from consumers.records import H_PRODUCED_MS, SourceRecord, produced_ms


def test_the_header_is_read_as_an_integer() -> None:
    assert produced_ms({H_PRODUCED_MS: b"1700000000123"}) == 1_700_000_000_123
    assert produced_ms({H_PRODUCED_MS: b"0"}) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"", b"-5", b"+5", b" 12", b"12 ", b"1_000", b"1.5", b"12ms", b"\xd9\xa1\xd9\xa2",  # Arabic-Indic digits
        b"9" * 20,  # past int64
        b"9" * 5000,  # int() would refuse it (Python's digit limit) with a ValueError
    ],
)
def test_anything_but_plain_ascii_digits_is_absent(raw: bytes) -> None:
    assert produced_ms({H_PRODUCED_MS: raw}) is None


def test_no_header_is_absent() -> None:
    assert produced_ms({}) is None
    assert produced_ms({"produced_ms": b"12"}) is None  # only the tidebatch. name counts


def test_a_record_is_create_time_unless_its_backend_says_otherwise() -> None:
    # Positional construction (tests, pipeline/profiling/stages.py) keeps working.
    rec = SourceRecord("t", 0, 1, None, b"v", {}, 5)
    assert rec.log_append_time is False
