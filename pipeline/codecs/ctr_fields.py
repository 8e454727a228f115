"""Reading and validating a CTR request document (ctr.py has the schema): the JSON
request, or the JSON header of a binary one (ctr_binary.py). Each function checks one
field, or the document itself, and raises DecodeError with its one-line reason; the
slow search for which value is wrong runs only once a check has failed.

Shared with the Redis-backed codec (pipeline/redisio/codec.py), which reads the same
fields of its own requests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from pipeline.codecs import jsonnum
from pipeline.codecs.base import DecodeError

MAX_REQUEST_ID_CHARS = 128
_TYPE_NAMES = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    str: "string",
    list: "array",
    dict: "object",
}


class BinaryHeader(NamedTuple):
    """The checked fields of a binary request's JSON header."""

    request_id: str
    priority: int
    deadline_ms: int | None
    tenant: str | None
    item_ids: list[str]


def type_name(value: object) -> str:
    """A JSON value's type as a reason names it: "null", "int", "array", ..."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def parse_json(value: bytes | None) -> dict[str, Any]:
    """The message value as a JSON object; empty, bad UTF-8, malformed or not an object
    is refused."""
    if value is None or len(value) == 0:
        raise DecodeError("empty message value")
    try:
        doc = jsonnum.loads(value)
    except json.JSONDecodeError as exc:
        raise DecodeError(_json_error(value, exc)) from None
    if type(doc) is not dict:
        raise DecodeError(f"expected a JSON object at top level, got {type_name(doc)}")
    return doc


def _json_error(value: bytes, exc: json.JSONDecodeError) -> str:
    # orjson reports bad UTF-8 as "str is not valid UTF-8" at char 0; find the byte.
    try:
        bytes(value).decode("utf-8")
    except UnicodeDecodeError as bad:
        byte = bytes(value)[bad.start]
        return f"value is not valid UTF-8 (byte 0x{byte:02x} at offset {bad.start})"
    return f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"


def missing_or_type(doc: Mapping[str, Any], key: str, expected: str) -> DecodeError:
    """The reason doc[key] was refused: absent, or not of the expected type."""
    if key not in doc:
        return DecodeError(f"missing field {key!r}")
    return DecodeError(f"{key}: expected {expected}, got {type_name(doc[key])}")


def items_list(doc: Mapping[str, Any], max_items: int, key: str = "items") -> list[Any]:
    """doc[key]: a list of 1..max_items entries (their contents checked later)."""
    items = doc.get(key)
    if type(items) is not list:
        raise missing_or_type(doc, key, "array")
    if not items:
        raise DecodeError(f"{key}: expected at least 1 item, got 0")
    if len(items) > max_items:
        raise DecodeError(f"too many items: {len(items)} > max_items {max_items}")
    return items


def read_request_id(doc: Mapping[str, Any]) -> str:
    rid = doc.get("request_id")
    if type(rid) is str and 0 < len(rid) <= MAX_REQUEST_ID_CHARS:
        return rid
    if "request_id" not in doc:
        raise DecodeError("missing field 'request_id'")
    if type(rid) is not str:
        raise DecodeError(f"request_id: expected non-empty string, got {type_name(rid)}")
    if not rid:
        raise DecodeError("request_id: expected non-empty string, got ''")
    raise DecodeError(
        f"request_id: expected at most {MAX_REQUEST_ID_CHARS} characters, got {len(rid)}"
    )


def read_meta(doc: Mapping[str, Any], raw: bytes) -> tuple[int, int | None, str | None]:
    """priority, deadline_ms, tenant; null or absent = default. user_id is checked only.
    ``raw`` is the JSON text of ``doc``, read again only on the error path (an integer
    beyond 64 bits that orjson gave as a float)."""
    priority = doc.get("priority")
    if priority is None:
        priority = 0
    elif type(priority) is not int or not 0 <= priority <= 9:
        raise DecodeError(f"priority: expected int 0..9, got {_shown_number(priority, raw, 'priority')}")
    deadline = doc.get("deadline_ms")
    if deadline is not None and (type(deadline) is not int or not 0 < deadline <= jsonnum.INT64_MAX):
        deadline = _saturated_deadline(deadline, raw)
    tenant = doc.get("tenant")
    if tenant is not None and type(tenant) is not str:
        raise DecodeError(f"tenant: expected string or null, got {type_name(tenant)}")
    user_id = doc.get("user_id")
    if user_id is not None and type(user_id) is not str:
        raise DecodeError(f"user_id: expected string or null, got {type_name(user_id)}")
    return priority, deadline, tenant


def _saturated_deadline(deadline: object, raw: bytes) -> int:
    """A deadline_ms that is not a plain int64 > 0: any larger integer saturates to
    INT64_MAX (a budget that long never tightens the SLO, and the value stays one every
    reader of the result can hold); anything else is refused."""
    if type(deadline) is int and deadline > 0:
        return jsonnum.INT64_MAX
    if type(deadline) is float:
        literal = jsonnum.int_literal(raw, "deadline_ms")
        if literal is not None and not literal.startswith("-"):
            return jsonnum.INT64_MAX
    raise DecodeError(f"deadline_ms: expected int > 0, got {_shown_number(deadline, raw, 'deadline_ms')}")


def _shown_number(value: object, raw: bytes, key: str) -> str:
    """The refused value of an integer field for a reason: the int, or the integer
    literal that orjson read as a float (shortened), else the type's name."""
    if type(value) is int:
        return jsonnum.show_int(str(value))
    if type(value) is float:
        literal = jsonnum.int_literal(raw, key)
        if literal is not None:
            return jsonnum.show_int(literal)
    return type_name(value)


def read_item_ids(items: list[dict[str, Any]]) -> list[str]:
    """The item_id of every item (objects, checked by the caller): non-empty strings."""
    ids = [it.get("item_id") for it in items]
    if set(map(type, ids)) == {str} and "" not in ids:
        return ids
    for i, (it, iid) in enumerate(zip(items, ids, strict=True)):
        if "item_id" not in it:
            raise DecodeError(f"missing field 'items[{i}].item_id'")
        if type(iid) is not str or not iid:
            got = "''" if iid == "" else type_name(iid)
            raise DecodeError(f"items[{i}].item_id: expected non-empty string, got {got}")
    raise AssertionError("unreachable")


def read_binary_item_ids(doc: Mapping[str, Any], max_items: int) -> list[str]:
    """A binary header's item_ids: 1..max_items non-empty strings."""
    ids = items_list(doc, max_items, "item_ids")
    if set(map(type, ids)) == {str} and "" not in ids:
        return ids
    i, bad = next((i, v) for i, v in enumerate(ids) if type(v) is not str or not v)
    got = "''" if bad == "" else type_name(bad)
    raise DecodeError(f"item_ids[{i}]: expected non-empty string, got {got}")
