"""JSON parsing shared by the JSON codecs (CTR JSON, the CTR binary header, CTR ids,
text): orjson on the hot path, and the exact but slow stdlib parse only once orjson has
refused a message or handed back a float where the schema wants an integer.

Why the second parser: orjson turns an integer literal of 2^64 or more into a float
and refuses one beyond the double range (a 400-digit integer, or ``1e309``) as
"number is infinity". Our schemas say "integer" and "counts above 1e9 saturate" for
any size, so those messages must not be refused as malformed JSON, nor a huge
integer reported as "got float". The stdlib parser keeps the literal's text; it runs
only on those messages, so the hot path is exactly orjson's.

Nesting: orjson refuses documents nested deeper than 1024 levels; that is the
documented limit (docs/schemas/ctr_request.md, docs/schemas/text_request.md), refused
with ``DEPTH_REASON`` instead of a parser message.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from pipeline.codecs.base import DecodeError

DEPTH_LIMIT = 1024  # orjson's own limit; documented as ours
DEPTH_REASON = f"JSON nested deeper than {DEPTH_LIMIT} levels (documented limit)"
INT64_MAX = 2**63 - 1  # the largest integer every JSON consumer of our results reads
_SHOWN_DIGITS = 24  # a longer integer is shown by its head and its number of digits


class IntText(str):
    """An integer literal as written in the JSON text (beyond what orjson reads)."""

    __slots__ = ()


def loads(value: bytes) -> Any:
    """orjson.loads, except that numbers beyond the double range are read (integers as
    floats, as orjson does below that range; 1e309 as inf) instead of refused, and too
    deep a document raises DecodeError(DEPTH_REASON). Other failures raise orjson's
    JSONDecodeError (a json.JSONDecodeError), or the stdlib's when the fallback ran."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        if exc.msg.startswith("depth limit exceeded"):
            raise DecodeError(DEPTH_REASON) from None
        if not exc.msg.startswith("number is infinity"):
            raise
    return _exact_loads(value, _saturating_int)


def int_literal(value: bytes, key: str) -> IntText | None:
    """The text of top-level ``key`` if the message wrote it as an integer literal (which
    orjson gave as a float because it is beyond 64 bits). Error path only."""
    found = exact_field(value, key)
    return found if isinstance(found, IntText) else None


def exact_field(value: bytes, key: str) -> Any:
    """Top-level ``key`` of the message as written: every integer literal, at any depth,
    an IntText (orjson reads those beyond 64 bits as floats); None when the message
    has no such field or does not parse. Error path only."""
    try:
        doc = _exact_loads(value, IntText)
    except (json.JSONDecodeError, DecodeError):
        return None
    return doc.get(key) if type(doc) is dict else None


class _Constant(str):
    """A NaN, Infinity or -Infinity literal, kept to say where it was."""

    __slots__ = ()


def nonfinite_literal(value: bytes) -> tuple[str, str] | None:
    """Where the message's first NaN, Infinity or -Infinity literal is, and which
    ("features[1]", "NaN"), if the message is JSON but for such literals; else None.
    JSON has no such numbers, so orjson refuses the message as malformed at a column;
    this names the field instead. Error path only."""
    try:
        text = bytes(value).decode("utf-8")
        with _recursion_room(DEPTH_LIMIT + 64):
            doc = json.loads(text, parse_int=str, parse_float=str, parse_constant=_Constant)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, _Constant):
            return path or "value", str(v)
        if type(v) is dict:
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in reversed(list(v.items())))
        elif type(v) is list:
            stack.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def show_int(text: str) -> str:
    """An integer's text for a one-line reason: whole up to 24 characters, else its head
    and its number of digits ("123456789012...(400 digits)")."""
    if len(text) <= _SHOWN_DIGITS:
        return text
    digits = len(text) - text.startswith("-")
    return f"{text[:12]}...({digits} digits)"


def _saturating_int(text: str) -> int | float:
    # What orjson does below the double range: integers that fit 64 bits stay ints,
    # larger ones become floats; beyond the double range float() gives +-inf.
    if len(text) <= 20:
        number = int(text)
        if -(2**63) <= number < 2**64:
            return number
    return float(text)


def _refuse_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; orjson refuses them and so must the fallback.
    raise ValueError(f"{name} is not valid JSON")


def _exact_loads(value: bytes, parse_int: Callable[[str], Any]) -> Any:
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as bad:
        raise json.JSONDecodeError("str is not valid UTF-8", "", bad.start) from None
    try:
        with _recursion_room(DEPTH_LIMIT + 64):
            doc = json.loads(text, parse_int=parse_int, parse_constant=_refuse_constant)
            if parse_int is _saturating_int:
                _refuse_lone_surrogates(doc, text)
    except RecursionError:
        raise DecodeError(DEPTH_REASON) from None
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise
        raise json.JSONDecodeError(str(exc), text, 0) from None
    return doc


def _refuse_lone_surrogates(doc: Any, text: str) -> None:
    # orjson refuses "\ud800" without its pair; the stdlib keeps it, and such a string
    # could not be written into the result document. A dump finds any.
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise json.JSONDecodeError("unpaired surrogate in a string escape", text, 0) from None


@contextmanager
def _recursion_room(depth: int) -> Iterator[None]:
    """The stdlib parser recurses once per level; orjson accepts 1024 levels, more than
    the default recursion limit of 1000, so a document orjson took must parse here."""
    before = sys.getrecursionlimit()
    if before < depth + 200:
        sys.setrecursionlimit(depth + 200)
    try:
        yield
    finally:
        if sys.getrecursionlimit() != before:
            sys.setrecursionlimit(before)
