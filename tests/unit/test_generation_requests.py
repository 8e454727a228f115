"""`generate` requests from their records (pipeline/generation/requests.py): what is
taken, and a one-line reason for each thing refused (issue 25: empty prompt,
max_new_tokens 0 or huge, prompt longer than the context, bad JSON)."""

from __future__ import annotations

import orjson
import pytest

from pipeline.generation.requests import BadRequest, parse_request


def _parse(doc: object, raw: bytes | None = None):
    value = raw if raw is not None else orjson.dumps(doc)
    return parse_request(value, "t/0/7", context=256, max_new_tokens=200)


def test_a_full_request() -> None:
    p = _parse({"request_id": "r1", "prompt": "héllo", "max_new_tokens": 20, "temperature": 0.7,
                "stop": ["\n", "END"], "seed": 3, "priority": 2, "deadline_ms": 1500})
    assert p.gen.request_id == "r1" and p.gen.prompt == list("héllo".encode())
    assert p.gen.max_new_tokens == 20 and p.gen.temperature == 0.7 and p.gen.seed == 3
    assert p.gen.stop == (b"\n", b"END") and p.priority == 2 and p.deadline_ms == 1500


def test_defaults() -> None:
    p = _parse({"prompt": "a", "max_new_tokens": 1, "stop": "x"})
    assert p.gen.request_id == "t/0/7" and p.gen.temperature == 0.0 and p.gen.stop == (b"x",)
    assert p.priority == 0 and p.deadline_ms is None and p.gen.seed is None


@pytest.mark.parametrize(("doc", "raw", "why"), [
    (None, b"", "empty record"),
    (None, b"{nope", "not JSON"),
    ([1, 2], None, "JSON object"),
    ({"prompt": "", "max_new_tokens": 5}, None, "empty prompt"),
    ({"max_new_tokens": 5}, None, "prompt is missing"),
    ({"prompt": 5, "max_new_tokens": 5}, None, "prompt must be a string"),
    ({"prompt": "a"}, None, "max_new_tokens is missing"),
    ({"prompt": "a", "max_new_tokens": 0}, None, "max_new_tokens must be in 1..200"),
    (None, b'{"prompt": "a", "max_new_tokens": 1000000000000000000000000000000}', "must be in 1..200, got 1"),
    ({"prompt": "a", "max_new_tokens": 2.5}, None, "max_new_tokens must be an integer"),
    ({"prompt": "a", "max_new_tokens": True}, None, "max_new_tokens must be an integer"),
    ({"prompt": "y" * 250, "max_new_tokens": 10}, None, "over the decoder's 256-token context"),
    ({"prompt": "y" * 300, "max_new_tokens": 1}, None, "context"),
    ({"prompt": "a", "max_new_tokens": 1, "temperature": -1}, None, "temperature"),
    ({"prompt": "a", "max_new_tokens": 1, "temperature": "hot"}, None, "temperature"),
    ({"prompt": "a", "max_new_tokens": 1, "stop": ["a"] * 5}, None, "at most 4 stop strings"),
    ({"prompt": "a", "max_new_tokens": 1, "stop": [""]}, None, "stop string is 1..32 bytes"),
    ({"prompt": "a", "max_new_tokens": 1, "stop": 3}, None, "stop must be"),
    ({"prompt": "a", "max_new_tokens": 1, "request_id": ""}, None, "request_id"),
    ({"prompt": "a", "max_new_tokens": 1, "deadline_ms": 0}, None, "deadline_ms"),
    ({"prompt": "a", "max_new_tokens": 1, "colour": "red"}, None, "unknown field 'colour'"),
])
def test_a_bad_request_is_refused_with_one_line(doc: object, raw: bytes | None, why: str) -> None:
    with pytest.raises(BadRequest) as err:
        _parse(doc, raw)
    assert why in str(err.value)
    assert "\n" not in str(err.value)
