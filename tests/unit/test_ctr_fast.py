"""The CTR JSON fast path (pipeline/codecs/ctr_fast.py, ctr_scan.py) against the
reference decode (CtrCodec.decode): the same features bit for bit for every valid
request, the same one-line reason for every invalid one, whatever else shares the poll;
and generated requests do take the fast path (else the comparison proves nothing)."""

from __future__ import annotations

import json
import random

import numpy as np
import orjson
import pytest

from models.ctr import features as F
from pipeline.codecs import ctr_fast, ctr_scan
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.codecs.ctr import CtrCodec
from pipeline.codecs.ctr_binary import encode
from pipeline.loadgen.ctr import INVALID_KINDS, CtrRequestFactory

MAX_ITEMS = 50


def _same(a: Decoded | Exception, b: Decoded | Exception) -> None:
    """b (decode_many's) is what a (decode's) is, bit for bit."""
    if isinstance(a, Exception):
        assert type(b) is type(a) and str(b) == str(a)
        return
    assert isinstance(b, Decoded), f"decode_many refused a request decode takes: {b}"
    assert (b.request_id, b.rows, b.priority, b.deadline_ms, b.tenant, b.bucket, b.extra) == (
        a.request_id, a.rows, a.priority, a.deadline_ms, a.tenant, a.bucket, a.extra
    )
    for x, y in ((a.payload.dense, b.payload.dense), (a.payload.cat, b.payload.cat)):
        assert x.dtype == y.dtype and x.shape == y.shape and y.flags.c_contiguous
        assert x.tobytes() == y.tobytes()  # bit for bit: NaN payloads and -0.0 too


def _reference(codec: CtrCodec, value: bytes | None) -> Decoded | Exception:
    try:
        return codec.decode(value)
    except DecodeError as exc:
        return exc


def _check_poll(values: list[bytes | None], codec: CtrCodec | None = None) -> list[Decoded | Exception]:
    codec = codec or CtrCodec(max_items=MAX_ITEMS)
    many = codec.decode_many([(v, None) for v in values])
    for value, got in zip(values, many, strict=True):
        _same(_reference(codec, value), got)
    return many


def _taken(values: list[bytes | None]) -> list[bool]:
    return [d is not None for d in ctr_fast.decode_json(values, MAX_ITEMS)]


# ---------------------------------------------------------------------------- generated
@pytest.mark.parametrize("seed,mean_items", [(1, 20), (2, 1), (3, 5), (4, 40)])
def test_generated_requests_take_the_fast_path_with_the_reference_features(seed: int, mean_items: float) -> None:
    factory = CtrRequestFactory(seed=seed, mean_items=mean_items, max_items=MAX_ITEMS)
    values = [factory.make(i)[1] for i in range(300)]
    assert all(_taken(values))
    _check_poll(values)


def test_tenant_priority_and_deadline_are_read() -> None:
    factory = CtrRequestFactory(seed=7, mean_items=3, max_items=MAX_ITEMS, tenant="acme", priority=4, deadline_ms=250)
    values = [factory.make(i)[1] for i in range(20)]
    assert all(_taken(values))
    many = _check_poll(values)
    assert {(d.tenant, d.priority, d.deadline_ms) for d in many} == {("acme", 4, 250)}  # type: ignore[union-attr]


def _base(seed: int = 11) -> dict:
    """A generated request whose first feature keys are surely there (the edge cases
    below rewrite them in its bytes)."""
    doc = CtrRequestFactory(seed=seed, mean_items=4, max_items=MAX_ITEMS).make_doc(0)
    doc["context"] = {**doc["context"], "C1": "0000abcd", "I1": 7}
    doc["items"] = [{"item_id": "first", "C14": "00001234", "C15": "0000beef", "I7": 2}, *doc["items"]]
    return doc


def _random_docs(rng: random.Random, n: int) -> list[dict]:
    """Requests with every feature drawn from a wide mix: absent, null, tokens of 1..16
    digits in either case, counts negative, zero and up to 7 digits."""
    docs = []
    for r in range(n):
        def fields(keys: tuple[str, ...], cat: bool) -> dict:
            out: dict = {}
            for k in keys:
                roll = rng.random()
                if roll < 0.15:
                    continue
                if roll < 0.3:
                    out[k] = None
                elif cat:
                    digits = rng.choice([8, 8, 8, 1, 2, 15, 16])
                    token = f"{rng.getrandbits(4 * digits):0{digits}x}"
                    out[k] = token.upper() if rng.random() < 0.2 else token
                else:
                    out[k] = rng.choice([0, -0, 1, -3, 9_999_999, -9_999_999, rng.randrange(10**6)])
            return out

        items = [{"item_id": f"it{r}-{j}", **fields(F.ITEM_DENSE, False), **fields(F.ITEM_CAT, True)}
                 for j in range(rng.randint(1, 6))]
        docs.append({"request_id": f"r{r}", "context": {**fields(F.CONTEXT_DENSE, False), **fields(F.CONTEXT_CAT, True)},
                     "items": items})
    return docs


def test_random_feature_mixes_match_bit_for_bit() -> None:
    values = [orjson.dumps(d) for d in _random_docs(random.Random(5), 400)]
    taken = _taken(values)
    assert sum(taken) > 0.8 * len(values)  # only 8-digit-free oddities may be doubted
    _check_poll(values)


# ---------------------------------------------------------------------------- edge cases
def _edge_cases() -> dict[str, bytes | None]:
    base = _base()
    raw = orjson.dumps(base)

    def doc(change) -> bytes:
        d = json.loads(raw)
        change(d)
        return orjson.dumps(d)

    def ctx(key, value):
        return doc(lambda d: d["context"].__setitem__(key, value))

    def item(key, value, i=0):
        return doc(lambda d: d["items"][i].__setitem__(key, value))

    cases: dict[str, bytes | None] = {
        "plain": raw,
        "none": None,
        "empty": b"",
        "not an object": b"[1, 2]",
        "string": b'"x"',
        "invalid utf-8": raw.replace(b'"request_id"', b'"request_id\xff"'),
        "invalid utf-8 in an unknown field": raw[:-1] + b',"x":"\xc0\xaf"}',
        "unicode item id": item("item_id", "caf\u00e9-\u4e2d"),
        "unicode key": ctx("C\u00e91", "00ff00ff"),
        "fullwidth digit key": ctx("C\uff11", "00ff00ff"),
        "NaN literal": raw[:-1] + b',"x":NaN}',
        "Infinity in a count": raw.replace(b'"context":{', b'"context":{"I1":Infinity,', 1),
        "malformed": raw[:-3],
        "trailing garbage": raw + b"x",
        "trailing blank": raw + b" \n",
        "pretty printed": json.dumps(base, indent=2).encode(),
        "json.dumps separators": json.dumps(base).encode(),
        "tab around colon": raw.replace(b'"C14":', b'"C14"\t:\t', 1),
        "escaped token": raw.replace(b'"C1":"', b'"C1":"\\u0030', 1),
        "escape in a token": raw.replace(b'"C1":"', b'"C1":"\\u0041', 1),
        "escaped key": raw.replace(b'"C14":', b'"\\u0043\\u00314":', 1),
        "quote in an item id": item("item_id", 'a"b'),
        "brace in an item id": item("item_id", "a{b}"),
        "unbalanced braces in an item id": item("item_id", "a{{[b"),
        "colon in an item id": item("item_id", "C14:x"),
        "key-like item id": item("item_id", "C14"),
        "missing request_id": doc(lambda d: d.pop("request_id")),
        "long request_id": doc(lambda d: d.__setitem__("request_id", "r" * 129)),
        "request_id 128": doc(lambda d: d.__setitem__("request_id", "r" * 128)),
        "request_id int": doc(lambda d: d.__setitem__("request_id", 5)),
        "priority 9": doc(lambda d: d.__setitem__("priority", 9)),
        "priority 10": doc(lambda d: d.__setitem__("priority", 10)),
        "priority float": doc(lambda d: d.__setitem__("priority", 1.0)),
        "priority bool": doc(lambda d: d.__setitem__("priority", True)),
        "priority huge": raw[:-1] + b',"priority":' + b"9" * 30 + b"}",
        "deadline huge": raw[:-1] + b',"deadline_ms":' + b"9" * 30 + b"}",
        "deadline int64 max": doc(lambda d: d.__setitem__("deadline_ms", 2**63 - 1)),
        "deadline 2**63": doc(lambda d: d.__setitem__("deadline_ms", 2**63)),
        "deadline 0": doc(lambda d: d.__setitem__("deadline_ms", 0)),
        "tenant int": doc(lambda d: d.__setitem__("tenant", 3)),
        "user_id null": doc(lambda d: d.__setitem__("user_id", None)),
        "user_id list": doc(lambda d: d.__setitem__("user_id", [])),
        "context null": doc(lambda d: d.__setitem__("context", None)),
        "context empty": doc(lambda d: d.__setitem__("context", {})),
        "context missing": doc(lambda d: d.pop("context")),
        "items empty": doc(lambda d: d.__setitem__("items", [])),
        "items not a list": doc(lambda d: d.__setitem__("items", {})),
        "item not an object": doc(lambda d: d["items"].append(3)),
        "item without id": doc(lambda d: d["items"][1].pop("item_id")),
        "item id empty": item("item_id", ""),
        "item empty but id": doc(lambda d: d["items"].__setitem__(0, {"item_id": "x"})),
        "max items": doc(lambda d: d.__setitem__("items", [{"item_id": f"i{k}", "C14": "0a"} for k in range(MAX_ITEMS)])),
        "too many items": doc(lambda d: d.__setitem__("items", [{"item_id": f"i{k}"} for k in range(MAX_ITEMS + 1)])),
        "token int": item("C14", 12345),
        "token empty": ctx("C1", ""),
        "token 17 digits": ctx("C2", "1" * 17),
        "token 16 digits": ctx("C2", "f" * 16),
        "token 1 digit": item("C26", "a"),
        "token upper": item("C20", "ABCDEF01"),
        "token non-hex 8": item("C20", "ABCDEFG1"),
        "token with a blank": item("C20", "ABC EF01"),
        "token 0x": item("C20", "0x123456"),
        "token bool": item("C15", True),
        "token object": item("C15", {"a": 1}),
        "token list": ctx("C3", ["a"]),
        "count float": ctx("I1", 1.5),
        "count float integral": item("I7", 3.0),
        "count exponent": raw.replace(b'"context":{', b'"context":{"I2":1e3,', 1),
        "count string": item("I8", "3"),
        "count bool": item("I9", False),
        "count negative": item("I9", -12),
        "count minus zero": raw.replace(b'"I1":7', b'"I1":-0', 1),
        "count 7 digits": item("I10", 9_999_999),
        "count 8 digits": item("I10", 12_345_678),
        "count 2**53+1": item("I10", 2**53 + 1),
        "count 2**64": raw.replace(b'"context":{', b'"context":{"I4":18446744073709551616,', 1),
        "count 400 digits": raw.replace(b'"context":{', b'"context":{"I4":' + b"7" * 400 + b",", 1),
        "count 1e309": raw.replace(b'"context":{', b'"context":{"I4":1e309,', 1),
        "count big in an unknown field": raw[:-1] + b',"x":' + b"9" * 400 + b"}",
        "duplicate token key": raw.replace(b'"C14":', b'"C14":"00000001","C14":', 1),
        "duplicate token key, null last": raw.replace(b'"C15":', b'"C15":"0000000f","C15":null,"x15":', 1),
        "duplicate count key": raw.replace(b'"context":{', b'"context":{"I1":5,"I1":null,', 1),
        "duplicate request_id": raw.replace(b'{"request_id"', b'{"request_id":"first","request_id"', 1),
        "duplicate item_id": raw.replace(b'"item_id":', b'"item_id":"one","item_id":', 1),
        "duplicate context": raw[:-1] + b',"context":{"C1":"0000abcd"}}',
        "duplicate items": raw[:-1] + b',"items":[{"item_id":"z","C14":"0000abcd"}]}',
        "context keys in an item": item("C1", "0000abcd"),
        "item keys in the context": ctx("C14", "0000abcd"),
        "C0 and C27 and I14": doc(lambda d: d["context"].update({"C0": "1", "C27": "2", "I14": 3, "C01": "4"})),
        "nested extra with feature keys": doc(lambda d: d["items"][0].update({"x": {"C14": "ffffffff", "I7": 1}})),
        "extra array": doc(lambda d: d.update({"x": [{"C1": "ffffffff"}]})),
        "extra top-level feature keys": doc(lambda d: d.update({"C1": "ffffffff", "I1": 4})),
        "deep nesting": raw[:-1] + b',"x":' + b"[" * 1100 + b"]" * 1100 + b"}",
        "nesting 1000": raw[:-1] + b',"x":' + b"[" * 1000 + b"]" * 1000 + b"}",
        "lone surrogate": raw.replace(b'"item_id":"', b'"item_id":"\\ud800', 1),
        "BOM": b"\xef\xbb\xbf" + raw,
        "control character in a string": item("item_id", "a\x01b"),
    }
    return cases


EDGE = _edge_cases()


@pytest.mark.parametrize("name", sorted(EDGE))
def test_edge_case_matches_the_reference_alone_and_in_a_poll(name: str) -> None:
    value = EDGE[name]
    factory = CtrRequestFactory(seed=3, mean_items=3, max_items=MAX_ITEMS)
    around = [factory.make(i)[1] for i in range(6)]
    _check_poll([value])
    # between valid requests: nothing of it may leak into their rows, nor keep them
    # from the fast path
    poll = [*around[:3], value, *around[3:]]
    _check_poll(poll)
    taken = _taken(poll)
    assert taken[:3] + taken[4:] == [True] * 6


def test_plain_edge_cases_take_the_fast_path() -> None:
    """The fast path is not only for the generator's shape."""
    plain = ["plain", "unicode item id", "unicode key", "fullwidth digit key", "request_id 128", "priority 9",
             "deadline int64 max", "user_id null", "context empty", "item empty but id", "max items",
             "token 16 digits", "token 1 digit", "token upper", "count negative", "count minus zero",
             "count 7 digits", "count big in an unknown field", "duplicate request_id", "duplicate item_id",
             "context keys in an item", "item keys in the context", "C0 and C27 and I14",
             "extra top-level feature keys", "key-like item id", "colon in an item id"]
    assert all(_taken([EDGE[name] for name in plain]))


def test_invalid_kinds_of_the_load_generator_keep_their_reasons() -> None:
    factory = CtrRequestFactory(seed=9, mean_items=3)
    values = [factory.make_invalid(kind, max_items=MAX_ITEMS) for kind in INVALID_KINDS]
    many = _check_poll([*values, factory.make(0)[1]])
    assert all(isinstance(d, DecodeError) for d in many[:-1])


def test_binary_and_json_requests_share_a_poll_in_order() -> None:
    factory = CtrRequestFactory(seed=4, mean_items=3, max_items=MAX_ITEMS)
    values: list[bytes | None] = []
    for i in range(12):
        value = factory.make(i)[1]
        values.append(encode(orjson.loads(value)) if i % 3 == 0 else value)
    many = _check_poll(values)
    assert [d.request_id for d in many] == [f"req-4-{i}" for i in range(12)]  # type: ignore[union-attr]


def test_payloads_collate_like_the_reference() -> None:
    codec = CtrCodec(max_items=MAX_ITEMS)
    factory = CtrRequestFactory(seed=6, mean_items=5, max_items=MAX_ITEMS)
    values = [factory.make(i)[1] for i in range(10)]
    many = codec.decode_many([(v, None) for v in values])
    ref = [codec.decode(v) for v in values]
    a = codec.collate([d.payload for d in ref], pad_to_rows=sum(d.rows for d in ref) + 3)
    b = codec.collate([d.payload for d in many], pad_to_rows=sum(d.rows for d in ref) + 3)  # type: ignore[union-attr]
    for key in ("dense", "cat"):
        assert a[key].tobytes() == b[key].tobytes()
    assert np.isnan(b["dense"]).any()  # missing counts were in the sample


def test_a_poll_of_one_or_two_is_left_to_the_reference() -> None:
    """A group costs ~100 numpy calls: for one request that was 2.6x the reference's
    time (bench/ctr_codec.py --poll 1), so short polls go the reference way."""
    factory = CtrRequestFactory(seed=8, mean_items=3, max_items=MAX_ITEMS)
    values = [factory.make(i)[1] for i in range(ctr_fast.MIN_GROUP)]
    for n in range(1, ctr_fast.MIN_GROUP):
        assert _taken(values[:n]) == [False] * n
        _check_poll(values[:n])
    assert all(_taken(values))


def test_a_short_last_group_joins_the_one_before(monkeypatch: pytest.MonkeyPatch) -> None:
    factory = CtrRequestFactory(seed=12, mean_items=2, max_items=MAX_ITEMS)
    values = [factory.make(i)[1] for i in range(41)]
    monkeypatch.setattr(ctr_fast, "GROUP_BYTES", sum(map(len, values[:20])))
    sizes: list[int] = []
    real_scan = ctr_scan.scan

    def recording_scan(group: list[bytes], n_items: np.ndarray) -> ctr_scan.Scan:
        sizes.append(len(group))
        return real_scan(group, n_items)

    monkeypatch.setattr(ctr_scan, "scan", recording_scan)
    assert all(_taken(values))
    assert sizes == [20, 21]  # not 20, 20 and 1
    _check_poll(values)


def test_a_failing_fast_path_costs_speed_not_the_poll(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Admission calls decode_many with no guard of its own (pipeline/worker/admission.py):
    an exception out of the fast path must fall back to decode, with a warning."""
    factory = CtrRequestFactory(seed=13, mean_items=3, max_items=MAX_ITEMS)
    values = [factory.make(i)[1] for i in range(8)]

    def broken_scan(group: list[bytes], n_items: np.ndarray) -> ctr_scan.Scan:
        raise IndexError("injected")

    monkeypatch.setattr(ctr_scan, "scan", broken_scan)
    with caplog.at_level("WARNING", logger="pipeline.codecs.ctr"):
        _check_poll([*values, b"{"])
    assert "CTR JSON fast path failed (IndexError: injected)" in caplog.text


def test_every_key_reads_as_its_feature_and_nothing_else_does() -> None:
    """ctr_scan._feature_keys reads a key's last five bytes as one word: every
    feature key (C1..C26, I1..I13) gets its code and its object, and no other key of
    one to three characters, nor any junk before a colon, is taken for one."""
    names = {f"C{i}": i - 1 for i in range(1, F.N_CAT + 1)}
    names.update({f"I{i}": F.N_CAT + i - 1 for i in range(1, F.N_DENSE + 1)})
    context = set(F.CONTEXT_CAT) | set(F.CONTEXT_DENSE)
    rng = random.Random(7)
    alphabet = 'CIci0123456789"{,:x'
    keys = list(names) + [f"{c}{n}" for c in "CIci" for n in ("0", "00", "01", "27", "14", "99", "")]
    keys += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    texts = [f'{{"{k}":1' for k in keys] + ["".join(rng.choice(alphabet) for _ in range(8)) for _ in range(3000)]
    buf = b"".join([b" " * 16, *(t.encode() + b" " for t in texts), b" " * 16])
    colons, at = [], 16
    for t in texts:
        colons.append(at + t.index(":") if ":" in t else -1)
        at += len(t) + 1
    keep = [i for i, c in enumerate(colons) if c >= 0]
    code, side = ctr_scan._feature_keys(buf, np.array([colons[i] for i in keep], dtype=np.intp))
    for j, i in enumerate(keep):
        before = texts[i][: texts[i].index(":")]
        # what the scan may read: the last four or five bytes before the colon
        feature = next((n for n in names if before.endswith(f'"{n}"')), None)
        if feature is None:
            assert side[j] == 0, texts[i]
        else:
            assert code[j] == names[feature], texts[i]
            assert side[j] == (1 if feature in context else 2), texts[i]
