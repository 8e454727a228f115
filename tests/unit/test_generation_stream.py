"""A request's text and chunks as tokens arrive (pipeline/generation/stream.py), on a
fake clock: chunks by size and by flush interval, never a split UTF-8 character, never
a byte that may start a stop string, and their texts add up to the final text."""

from __future__ import annotations

import numpy as np

from models.decoder.tokenizer import EOS
from pipeline.generation.stream import Chunk, Generation, request_seed, sample, stop_bytes


def _feed(gen: Generation, text: str, chunk_tokens: int, flush_s: float, dt: float = 0.01) -> list[Chunk]:
    out, now = [], 0.0
    for b in text.encode("utf-8"):
        now += dt
        if gen.push(b):
            break
        c = gen.chunk(now, chunk_tokens, flush_s)
        if c:
            out.append(c)
    last = gen.last_chunk()
    return out + ([last] if last else [])


def _joined(chunks: list[Chunk]) -> str:
    offset = 0
    for c in chunks:
        assert c.offset == offset
        offset += len(c.text.encode("utf-8"))
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    return "".join(c.text for c in chunks)


def test_chunks_by_size_add_up_to_the_text() -> None:
    g = Generation("a", [1], 100)
    chunks = _feed(g, "abcdefghij", chunk_tokens=4, flush_s=10.0)
    assert [c.text for c in chunks] == ["abcd", "efgh", "ij"]
    assert [c.tokens for c in chunks] == [4, 8, 10]
    assert _joined(chunks) == g.text == "abcdefghij"


def test_a_chunk_is_flushed_after_the_interval() -> None:
    g = Generation("a", [1], 100)
    g.push(ord("x"))
    assert g.chunk(0.0, 16, 0.05) is None  # one byte waiting since 0.0
    assert g.chunk(0.04, 16, 0.05) is None
    c = g.chunk(0.05, 16, 0.05)
    assert c is not None and c.text == "x"
    g.push(ord("y"))
    assert g.chunk(0.06, 16, 0.05) is None  # the interval counts from the new byte


def test_no_chunk_splits_a_character() -> None:
    text = "é€😀aé"
    g = Generation("a", [1], 100)
    chunks = _feed(g, text, chunk_tokens=1, flush_s=0.0)
    assert all("\ufffd" not in c.text for c in chunks)
    assert _joined(chunks) == text


def test_a_stop_string_is_held_back_and_left_out() -> None:
    g = Generation("a", [1], 100, stop=stop_bytes(["\n\n", "END"]))
    chunks = _feed(g, "one EN two\n\nthree", chunk_tokens=1, flush_s=0.0)
    assert g.stop_hit == b"\n\n"
    assert g.text == "one EN two"
    assert _joined(chunks) == "one EN two"
    assert all("\n" not in c.text for c in chunks)


def test_eos_ends_and_is_not_text() -> None:
    g = Generation("a", [1], 100)
    assert not g.push(ord("h"))
    assert g.push(EOS)
    assert g.text == "h" and g.tokens == [ord("h"), EOS]


def test_seeds_and_sampling() -> None:
    assert request_seed("r1") == request_seed("r1") != request_seed("r2")
    assert request_seed("r1", 5) == 5
    logits = np.array([0.0, 3.0, 1.0])
    assert sample(logits, 0.0, np.random.default_rng(0)) == 1
    draws = [sample(logits, 1.0, np.random.default_rng(s)) for s in range(200)]
    assert set(draws) == {0, 1, 2} and draws.count(1) > 100
    again = [sample(logits, 1.0, np.random.default_rng(s)) for s in range(200)]
    assert draws == again
