"""A `generate` request from its Kafka record: JSON in, a Generation
(pipeline/generation/stream.py) or one line saying why not. Pure.

    {"request_id": str,              optional; default topic/partition/offset
     "prompt": str,                  required, not empty
     "max_new_tokens": int,          required, 1 .. the limit, and prompt + it <= context
     "temperature": number >= 0,     optional, default 0 (greedy)
     "stop": str | [str, ...],       optional, at most MAX_STOPS, each 1..MAX_STOP_BYTES bytes
     "seed": int,                    optional, default one from request_id
     "priority": int,                optional, default 0 (lower first)
     "deadline_ms": int > 0}         optional: admission budget from the record's timestamp

The prompt must fit the decoder's context with room for max_new_tokens: the KV cache
of a sequence is one row of at most `context` tokens (pipeline/generation/runner.py),
and the scheduler reserves prompt + max_new_tokens at admission
(pipeline/generation/budget.py), so a request that cannot fit is refused here, before
it waits, not after.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from models.decoder import tokenizer
from pipeline.codecs.base import DecodeError
from pipeline.codecs.jsonnum import loads
from pipeline.generation.stream import Generation, stop_bytes

MAX_STOPS = 4
MAX_STOP_BYTES = 32
MAX_TEMPERATURE = 10.0
_KEYS = {"request_id", "prompt", "max_new_tokens", "temperature", "stop", "seed", "priority", "deadline_ms"}


class BadRequest(ValueError):
    """Why a request is refused: one line, the dead letter's reason."""


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    gen: Generation
    priority: int
    deadline_ms: int | None


def _int(doc: dict, key: str, lo: int, hi: int, default: int | None = None) -> int | None:
    value = doc.get(key, default)
    if value is None and default is None and key not in doc:
        return None
    if isinstance(value, float) and value.is_integer() and not lo <= value <= hi:
        value = int(value)  # an integer literal beyond 2^64 reads as a float (pipeline/codecs/jsonnum.py)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise BadRequest(f"{key} must be in {lo}..{hi}, got {value}")
    return value


def parse_request(value: bytes | None, fallback_id: str, *, context: int, max_new_tokens: int) -> ParsedRequest:
    """The request in `value`, or BadRequest. `max_new_tokens`: the configured limit."""
    if not value:
        raise BadRequest("empty record: a generate request is a JSON object")
    try:
        doc = loads(value)
    except (json.JSONDecodeError, DecodeError, ValueError) as exc:
        raise BadRequest(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"a generate request is a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}; fields: {', '.join(sorted(_KEYS))}")
    rid = doc.get("request_id", fallback_id)
    if not isinstance(rid, str) or not rid:
        raise BadRequest("request_id must be a non-empty string")
    prompt = doc.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string" if "prompt" in doc else "prompt is missing")
    if not prompt:
        raise BadRequest("empty prompt")
    ids = tokenizer.encode(prompt)
    if "max_new_tokens" not in doc:
        raise BadRequest("max_new_tokens is missing")
    n = _int(doc, "max_new_tokens", 1, max_new_tokens)
    assert n is not None
    if len(ids) + n > context:
        raise BadRequest(f"prompt ({len(ids)} tokens) + max_new_tokens ({n}) is over the decoder's "
                         f"{context}-token context")
    temperature = doc.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
            math.isfinite(temperature) and 0.0 <= temperature <= MAX_TEMPERATURE):
        raise BadRequest(f"temperature must be a number in 0..{MAX_TEMPERATURE:g}, got {temperature!r}"[:200])
    stops = _stops(doc.get("stop", []))
    seed = _int(doc, "seed", 0, 2**63 - 1)
    priority = _int(doc, "priority", 0, 9, 0)
    deadline_ms = _int(doc, "deadline_ms", 1, 2**63 - 1)
    gen = Generation(rid, ids, n, float(temperature), stop_bytes(stops), seed)
    return ParsedRequest(gen, priority or 0, deadline_ms)


def _stops(stop: object) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest("stop must be a string or a list of strings")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
    for s in stops:
        if not 1 <= len(s.encode("utf-8")) <= MAX_STOP_BYTES:
            raise BadRequest(f"a stop string is 1..{MAX_STOP_BYTES} bytes of UTF-8")
    return stops
