"""Camera frames' Kafka headers (camera.py has the schema): camera_id and frame_id
required, capture_ts_ms, priority and deadline_ms optional integers; UTF-8 text, with
spaces and tabs around a value ignored. A bad header is a DecodeError naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pipeline.codecs.base import DecodeError
from pipeline.codecs.jsonnum import INT64_MAX, show_int

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() and int() take other scripts too
_BLANKS = " \t"


def parse_headers(headers: Mapping[str, bytes]) -> dict[str, Any]:
    """camera_id, frame_id, capture_ts_ms, priority (default 0) and deadline_ms of a
    frame; an absent optional header is None."""
    priority = _header_int(headers, "priority", 0, 9, "an integer 0..9")
    return {
        "camera_id": _required_text(headers, "camera_id"),
        "frame_id": _required_text(headers, "frame_id"),
        "capture_ts_ms": _header_int(
            headers, "capture_ts_ms", 0, INT64_MAX, "an integer 0..2^63-1 (ms since the epoch)"
        ),
        "priority": 0 if priority is None else priority,
        "deadline_ms": _header_int(headers, "deadline_ms", 1, INT64_MAX, "a positive integer (ms)", saturate=True),
    }


def _header_text(headers: Mapping[str, bytes], name: str) -> str | None:
    raw = headers.get(name)
    if raw is None:
        return None
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError(f"header {name!r} is not valid UTF-8") from None
    return text.strip(_BLANKS)


def _header_int(
    headers: Mapping[str, bytes], name: str, lo: int, hi: int, what: str, saturate: bool = False
) -> int | None:
    """An integer header in lo..hi (hi <= INT64_MAX, so the value serialises anywhere).
    Above hi: refused as out of range, or hi itself where ``saturate`` (a deadline that
    long never tightens anything)."""
    text = _header_text(headers, name)
    if text is None or text == "":
        return None
    if not _DIGITS.fullmatch(text):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise DecodeError(f"header {name!r}: expected {what}, got {shown!r}")
    significant = text.lstrip("0") or "0"
    # Compare by length first: int() of thousands of digits is slow and, past 4300,
    # refused by Python itself.
    number = int(significant) if len(significant) <= 19 else INT64_MAX + 1
    if number > hi and saturate:
        return hi
    if not lo <= number <= hi:
        raise DecodeError(f"header {name!r}: {show_int(significant)} is out of range, expected {what}")
    return number


def _required_text(headers: Mapping[str, bytes], name: str) -> str:
    text = _header_text(headers, name)
    if text is None:
        raise DecodeError(f"missing required header {name!r}")
    if not text:
        raise DecodeError(f"header {name!r} is empty")
    return text

