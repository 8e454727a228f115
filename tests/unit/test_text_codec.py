"""TextCodec: dead-letter reasons, length buckets, truncation, collate padding only to
the bucket edge (with mask), split, and the text request generator. Tokenizer only:
no model is loaded here (tests/unit/test_text_model.py runs the model)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from models.text.model import MAX_LENGTH, load_tokenizer
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.codecs.text import TextCodec, collate_padded_to_longest, padded_token_ratio
from pipeline.loadgen.text import INVALID_KINDS, TextRequestFactory

CLS, SEP = 101, 102


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec()


def msg(**fields: object) -> bytes:
    return orjson.dumps({"request_id": "r-1", **fields})


def ids(n: int) -> np.ndarray:
    """A payload of n tokens ([CLS] ... [SEP]) as decode() produces."""
    return np.array([CLS] + [2000 + i for i in range(n - 2)] + [SEP], dtype=np.int64)


# --- dead letters -------------------------------------------------------------------

EXPECTED_REASONS = {
    "empty_text": "text: empty string",
    "overlong": "text: 100001 characters exceeds max_chars=100000",
    "missing_text": "text: missing",
    "mistyped_text": "text: expected string, got int",
}


@pytest.mark.parametrize("kind", INVALID_KINDS)
def test_generator_invalid_kinds_get_the_documented_reason(codec: TextCodec, kind: str) -> None:
    _, value = TextRequestFactory(seed=3).make_invalid(kind)
    with pytest.raises(DecodeError) as err:
        codec.decode(value, None)
    if kind == "non_utf8":
        assert str(err.value) == f"value: invalid UTF-8 at byte {value.index(0xE9)}"
    else:
        assert str(err.value) == EXPECTED_REASONS[kind]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "value: missing (tombstone)"),
        (b"{", "value: not valid JSON: unexpected end of data: line 1 column 2 (char 1)"),
        (b"[1, 2]", "value: expected a JSON object, got array"),
        (orjson.dumps({"text": "hi"}), "request_id: missing"),
        (orjson.dumps({"request_id": 7, "text": "hi"}), "request_id: expected string, got int"),
        (orjson.dumps({"request_id": "", "text": "hi"}), "request_id: empty string"),
        (msg(text=None), "text: missing"),
        (msg(text=["hi"]), "text: expected string, got array"),
        (msg(text=" \n\t "), "text: no tokens (only whitespace or control characters)"),
        (msg(text="hi", priority=10), "priority: 10 out of range 0..9"),
        (msg(text="hi", priority="1"), "priority: expected integer 0..9, got string"),
        (msg(text="hi", priority=True), "priority: expected integer 0..9, got bool"),
        (msg(text="hi", deadline_ms=0), "deadline_ms: must be > 0, got 0"),
        (msg(text="hi", deadline_ms=2.5), "deadline_ms: expected positive integer, got float"),
        (msg(text="hi", tenant=3), "tenant: expected string, got int"),
    ],
)
def test_invalid_fields_name_the_field(codec: TextCodec, value: bytes | None, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        codec.decode(value, None)
    assert str(err.value) == reason


def test_non_utf8_offset_points_at_the_bad_byte(codec: TextCodec) -> None:
    value = b'{"request_id": "r", "text": "ok \xff\xfe"}'
    with pytest.raises(DecodeError, match=rf"^value: invalid UTF-8 at byte {value.index(0xFF)}$"):
        codec.decode(value, None)


def test_max_chars_and_size_precheck() -> None:
    small = TextCodec(max_chars=50)
    _, value = TextRequestFactory(0).make_invalid("overlong", max_chars=50)
    with pytest.raises(DecodeError, match=r"^text: 51 characters exceeds max_chars=50$"):
        small.decode(value, None)
    huge = msg(text="x" * (50 * 6 + 70_000))  # refused before JSON parsing
    with pytest.raises(DecodeError, match=r"^value: \d+ bytes exceeds the size limit of \d+$"):
        small.decode(huge, None)


def test_empty_text_can_be_embedded_on_request() -> None:
    d = TextCodec(on_empty="embed").decode(msg(text=""), None)
    assert d.payload.tolist() == [CLS, SEP] and d.bucket == 16


# --- decode, buckets, truncation ------------------------------------------------------

def test_decode_fills_decoded(codec: TextCodec) -> None:
    d = codec.decode(msg(text="A man is eating food.", priority=3, deadline_ms=250, tenant="acme",
                         unknown_field={"ignored": True}), {"h": b"v"})
    assert isinstance(d, Decoded)
    assert (d.request_id, d.rows, d.priority, d.deadline_ms, d.tenant) == ("r-1", 1, 3, 250, "acme")
    assert d.payload.dtype == np.int64 and d.payload[0] == CLS and d.payload[-1] == SEP
    assert d.extra == {"tokens": 8, "truncated": False} and d.bucket == 16


def test_null_optional_fields_count_as_absent(codec: TextCodec) -> None:
    d = codec.decode(msg(text="hi", priority=None, deadline_ms=None, tenant=None), None)
    assert (d.priority, d.deadline_ms, d.tenant) == (0, None, None)


@pytest.mark.parametrize(("tokens", "edge"), [(3, 16), (16, 16), (17, 32), (32, 32), (33, 64),
                                              (100, 128), (129, 256), (256, 256)])
def test_bucket_is_smallest_edge_that_holds(codec: TextCodec, tokens: int, edge: int) -> None:
    assert codec.bucket_for(tokens) == edge


def test_decoded_bucket_matches_token_count(codec: TextCodec) -> None:
    # "word" is one word piece: n words -> n + 2 tokens
    for words, edge in [(14, 16), (15, 32), (62, 64), (126, 128), (127, 256)]:
        d = codec.decode(msg(text=" ".join(["word"] * words)), None)
        assert (d.extra["tokens"], d.bucket) == (words + 2, edge)


def test_long_text_is_truncated_at_model_max_and_flagged(codec: TextCodec) -> None:
    d = codec.decode(msg(text="word " * 400), None)
    assert d.extra == {"tokens": MAX_LENGTH, "truncated": True} and d.bucket == 256
    assert d.payload[0] == CLS and d.payload[-1] == SEP and len(d.payload) == 256
    exact = codec.decode(msg(text="word " * 254), None)  # 254 + [CLS] + [SEP] fits exactly
    assert exact.extra == {"tokens": 256, "truncated": False}


def test_prefix_tokenisation_equals_full_tokenisation(codec: TextCodec) -> None:
    full = load_tokenizer()
    factory = TextRequestFactory(seed=2)
    reviews = " ".join(factory.text(i)[0] for i in range(400) if factory.text(i)[1] != "short")
    texts = [reviews[:n] for n in (2047, 2049, 2500, 20_000)] + [
        "x" * 3000,  # no space before the prefix limit: full tokenisation
        "word " * 100 + " " * 3000 + "end",  # the prefix does not overflow
        "Ünïcödé Straße 東京 " * 300,  # normalisation and CJK splitting are per character
    ]
    for text in texts:
        ids, truncated = codec.tokenize(text)
        enc = full.encode(text)
        assert ids.tolist() == enc.ids and truncated == bool(enc.overflowing), text[:40]


def test_overlength_reject_mode() -> None:
    strict = TextCodec(on_overlength="reject")
    with pytest.raises(DecodeError, match=r"^text: longer than the maximum of 256 tokens$"):
        strict.decode(msg(text="word " * 255), None)
    assert strict.decode(msg(text="word " * 254), None).extra["tokens"] == 256


def test_custom_edges_cap_the_length() -> None:
    c = TextCodec(bucket_edges=(8, 64))
    assert c.max_tokens == 64 and c.bucket_edges == (8, 64)
    d = c.decode(msg(text="word " * 100), None)
    assert d.extra == {"tokens": 64, "truncated": True} and d.bucket == 64
    assert TextCodec(bucket_edges=(16, 512)).bucket_edges == (16, 256)  # never past the model


@pytest.mark.parametrize("edges", [(), (32, 16), (16, 16), (2, 16)])
def test_bad_edges_are_refused(edges: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        TextCodec(bucket_edges=edges)


# --- collate / split --------------------------------------------------------------------

def test_collate_pads_only_to_the_bucket_edge_with_mask(codec: TextCodec) -> None:
    payloads = [ids(5), ids(9), ids(12)]
    feeds = codec.collate(payloads)
    assert set(feeds) == {"input_ids", "attention_mask"}
    assert feeds["input_ids"].shape == (3, 16) and feeds["input_ids"].dtype == np.int64
    assert feeds["attention_mask"].dtype == np.int64
    assert feeds["attention_mask"].sum(axis=1).tolist() == [5, 9, 12]
    for row, p in zip(feeds["input_ids"], payloads, strict=True):
        assert row[: len(p)].tolist() == p.tolist() and not row[len(p):].any()
    assert padded_token_ratio(feeds) == pytest.approx(1 - 26 / 48)


def test_collate_pad_to_rows_adds_all_padding_rows(codec: TextCodec) -> None:
    feeds = codec.collate([ids(20), ids(30)], pad_to_rows=8)
    assert feeds["input_ids"].shape == (8, 32)
    assert not feeds["attention_mask"][2:].any() and not feeds["input_ids"][2:].any()
    with pytest.raises(ValueError):
        codec.collate([ids(20), ids(30)], pad_to_rows=1)
    with pytest.raises(ValueError):
        codec.collate([])


def test_mixed_bucket_batch_pads_to_the_longest_requests_edge(codec: TextCodec) -> None:
    assert codec.collate([ids(5), ids(40)])["input_ids"].shape == (2, 64)


def test_pad_to_longest_baseline(codec: TextCodec) -> None:
    feeds = collate_padded_to_longest([ids(5), ids(9), ids(12)], pad_to_rows=4)
    assert feeds["input_ids"].shape == (4, 12)
    assert feeds["attention_mask"].sum(axis=1).tolist() == [5, 9, 12, 0]
    assert codec.collate_padded_to_longest([ids(7)])["input_ids"].shape == (1, 7)
    assert padded_token_ratio(collate_padded_to_longest([ids(7), ids(7)])) == 0.0


def test_split_one_result_per_request(codec: TextCodec) -> None:
    decoded = [codec.decode(msg(text="hello there"), None),
               codec.decode(orjson.dumps({"request_id": "r-2", "text": "word " * 300}), None)]
    emb = np.zeros((4, 384), dtype=np.float32)  # 2 padding rows, dropped
    emb[0, 0], emb[1, 1] = 1.0, 1.0
    results = codec.split({"embedding": emb}, decoded)
    assert [r["request_id"] for r in results] == ["r-1", "r-2"]
    assert results[0]["embedding"][0] == 1.0 and len(results[1]["embedding"]) == 384
    assert [(r["tokens"], r["truncated"]) for r in results] == [(4, False), (256, True)]
    assert all(isinstance(x, float) for x in results[0]["embedding"])
    orjson.dumps(results)  # JSON-ready
    with pytest.raises(ValueError):
        codec.split({"embedding": emb[:1]}, decoded)


# --- generator ----------------------------------------------------------------------------

def test_generator_is_deterministic_and_valid(codec: TextCodec) -> None:
    a, b = TextRequestFactory(seed=7), TextRequestFactory(seed=7)
    assert [a.make(i) for i in (5, 0, 99)] == [b.make(i) for i in (5, 0, 99)]
    assert TextRequestFactory(seed=8).make(5) != a.make(5)
    decoded = [codec.decode(a.make(i)[1], None) for i in range(600)]
    kinds = [a.text(i)[1] for i in range(600)]
    assert 0.6 < kinds.count("short") / 600 < 0.8 and kinds.count("long") > 20
    assert any(d.extra["truncated"] for d in decoded)
    assert {d.bucket for d in decoded} == {16, 32, 64, 128, 256}
    short = [d for d, k in zip(decoded, kinds, strict=True) if k == "short"]
    assert all(5 <= d.extra["tokens"] <= 22 and d.priority == 0 and d.deadline_ms for d in short)


def test_generator_rejects_unknown_invalid_kind() -> None:
    with pytest.raises(ValueError):
        TextRequestFactory(0).make_invalid("bogus")


# --- hostile texts: bounded work, exact pieces ---------------------------------------

def _alphabet() -> list[str]:
    """Characters that stress where a text may be cut: blanks, ASCII and Unicode
    punctuation, CJK, accents and combining marks, zero-width and control characters
    (deleted by the normaliser, so never a cut), other scripts, emoji."""
    return [
        *"abcdefghij", *"ÄéñüßÅ", "e\u0301", "\u0301", *"中文字東京", *"あいうカタ", *"한국",
        *"ไทย", *"!?.,;:-'\"()[]", *"。、「」！（）", *"«»¿¡·", "\u2014", "\u2026",
        " ", "  ", "\n", "\t", "\u3000", "\u00a0", "\u200b", "\u200d", "\x00", "\x1c",
        "\ufffd", "😀", "🇫🇷", "İ", "Σ", "ﬁ", "①", "$", "+", "～",
    ]


def test_chunked_tokenisation_equals_tokenising_the_whole_text(codec: TextCodec) -> None:
    # The chunks are cut only where the tokenizer splits anyway; if a cut ever split
    # a word, the pieces (and embedding) of a truncated text would differ from today's.
    full = load_tokenizer()
    rng = np.random.default_rng(22)
    alphabet = _alphabet()
    for case in range(120):
        # runs of one character (long words, long blank runs) as well as mixtures
        weights = rng.dirichlet(np.full(len(alphabet), 0.3 if case % 2 else 3.0))
        n = int(rng.integers(900, 6000))
        text = "".join(rng.choice(alphabet, size=n, p=weights))[: codec.read_chars]
        ids, truncated = codec.tokenize(text)
        enc = full.encode(text)
        assert (ids.tolist(), truncated) == (enc.ids, bool(enc.overflowing)), repr(text[:60])


class _CountingTokenizer:
    """The codec's tokenizer, counting the characters it is given."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.chars = 0

    def encode(self, text: str, **kw: object) -> object:
        self.chars += len(text)
        return self.inner.encode(text, **kw)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "most_chars"),
    [
        ("中" * 100_000, 2 * 1024),  # one token a character: stops after the first chunk
        ("!" * 100_000, 2 * 1024),
        ("。" * 100_000, 2 * 1024),
        ("a" * 100_000, 16_384),  # one [UNK] word: only the characters read
        (" " * 99_999 + "x", 2 * 16_384),  # no token anywhere: chunks, then once whole
    ],
)
def test_tokenizer_work_is_bounded_whatever_the_text(text: str, most_chars: int) -> None:
    # 100k CJK characters cost ~0.4 s when tokenised whole; the bound is on the
    # characters handed to the tokenizer (timings are in bench/text_cost.py).
    codec = TextCodec()
    counting = _CountingTokenizer(codec._tokenizer)
    codec._tokenizer = counting  # type: ignore[assignment]
    codec.tokenize(text)
    assert counting.chars <= most_chars


def test_only_read_chars_are_read_and_the_rest_flags_truncated(codec: TextCodec) -> None:
    assert codec.read_chars == 64 * 256
    d = codec.decode(msg(text="word " + " " * 20_000 + "end"), None)
    assert d.extra == {"tokens": 3, "truncated": True}  # "end" is past the characters read
    with pytest.raises(DecodeError, match=r"^text: no tokens in its first 16384 characters"):
        codec.decode(msg(text=" " * 20_000 + "end"), None)
    with pytest.raises(DecodeError, match=r"^text: longer than the 16384 characters read per text$"):
        TextCodec(on_overlength="reject").decode(msg(text="a" * 20_000), None)


@pytest.mark.parametrize(
    ("field", "literal", "reason"),
    [
        ("priority", "18446744073709551616", "priority: 18446744073709551616 out of range 0..9"),
        ("priority", "1" + "0" * 400, "priority: 100000000000...(401 digits) out of range 0..9"),
        ("priority", "1e400", "priority: expected integer 0..9, got float"),
        ("deadline_ms", "-" + "1" * 30, "deadline_ms: must be > 0, got -11111111111...(30 digits)"),
        ("x", "[" * 1100 + "]" * 1100, "value: JSON nested deeper than 1024 levels (documented limit)"),
    ],
)
def test_huge_integers_and_deep_nesting(codec: TextCodec, field: str, literal: str, reason: str) -> None:
    value = f'{{"request_id": "r", "text": "hi", "{field}": {literal}}}'.encode()
    with pytest.raises(DecodeError) as err:
        codec.decode(value, None)
    assert str(err.value) == reason


def test_huge_deadline_saturates(codec: TextCodec) -> None:
    for literal in ("9223372036854775808", "18446744073709551616", "9" * 5000):
        value = f'{{"request_id": "r", "text": "hi", "deadline_ms": {literal}}}'.encode()
        assert codec.decode(value, None).deadline_ms == 2**63 - 1
