"""`tidebatch produce generate`'s requests (pipeline/loadgen/generate.py): every one
is a request the generate worker takes (pipeline/generation/requests.py), a pure
function of (seed, i), with max_new_tokens from the asked distribution."""

from __future__ import annotations

import statistics

import orjson
import pytest

from pipeline.errors import UserError
from pipeline.generation.requests import parse_request
from pipeline.loadgen.generate import CONTEXT, generate_samples


def test_every_request_is_one_the_worker_takes_with_its_id_as_key() -> None:
    make = generate_samples(seed=3)
    for i in range(500):
        key, value, headers = make(i)
        parsed = parse_request(value, "fallback", context=CONTEXT, max_new_tokens=200)
        assert key == f"gen-3-{i}".encode() == parsed.gen.request_id.encode()
        assert parsed.gen.prompt and len(parsed.gen.prompt) <= 48
        assert parsed.deadline_ms is None and headers == []


def test_a_request_is_a_pure_function_of_seed_and_index() -> None:
    a, b = generate_samples(seed=1), generate_samples(seed=1)
    assert [a(i) for i in (7, 3, 900)] == [b(i) for i in (7, 3, 900)]
    assert generate_samples(seed=2)(7)[1] != a(7)[1]


def test_max_new_tokens_follow_the_log_uniform_default_and_a_fixed_one() -> None:
    make = generate_samples(seed=1)
    lengths = [orjson.loads(make(i)[1])["max_new_tokens"] for i in range(4000)]
    assert min(lengths) >= 8 and max(lengths) <= 200
    # log-uniform over 8..200: the median is the geometric mean, sqrt(8 * 200) = 40
    assert 34 <= statistics.median(lengths) <= 46
    assert sum(n <= 16 for n in lengths) > sum(n >= 100 for n in lengths) > 0
    fixed = generate_samples(seed=1, output="fixed:64", deadline_ms=5000)
    docs = [orjson.loads(fixed(i)[1]) for i in range(50)]
    assert {d["max_new_tokens"] for d in docs} == {64} and {d["deadline_ms"] for d in docs} == {5000}


def test_a_bad_distribution_is_one_line() -> None:
    with pytest.raises(UserError, match="bad rows distribution 'loguniform:8'"):
        generate_samples(output="loguniform:8")
