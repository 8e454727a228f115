"""Text events -> sentence embeddings (all-MiniLM-L6-v2, models/text/).

Event (Kafka message value, UTF-8 JSON object; docs/schemas/text_request.md):

    {"request_id": "r-1",          required, non-empty string, echoed in the result
     "text": "A man is eating.",   required, string, 1..max_chars characters
     "priority": 0,                optional, integer 0..9 (lower runs first), default 0
     "deadline_ms": 250,           optional, integer > 0: this request's own budget
     "tenant": "acme"}             optional, string
    Unknown fields are ignored; an optional field that is null counts as absent.

Result (one per request, from split()):

    {"request_id": "r-1", "embedding": [384 floats, unit length],
     "tokens": 8, "truncated": false}

`tokens` counts word pieces including [CLS] and [SEP]. A text longer than the model's
maximum (256 tokens) keeps its first 254 word pieces plus [SEP] and is flagged
`"truncated": true` (on_overlength="truncate", the default, what sentence-transformers
does), or is rejected (on_overlength="reject"). Only the first read_chars (64 x 256 =
16,384) characters are read, so the tokenizer's work per message is bounded: 100k CJK
characters cost ~3 ms instead of ~0.4 s, 1 MB without spaces ~9 ms instead of ~0.6 s
(bench/text_cost.py; table in docs/schemas/text_request.md); a longer text is flagged
truncated too. Integers of any size are integers (jsonnum.py); deadline_ms above
2^63-1 saturates; documents nested over 1024 levels are refused.

Dead-letter reasons (DecodeError messages):
    value: missing (tombstone)              value is None
    value: invalid UTF-8 at byte N          N = offset of the first bad byte
    value: not valid JSON: ...              | value: expected a JSON object, got list
    value: N bytes exceeds the size limit   cheap pre-check, before parsing
    request_id: missing | request_id: expected string, got int | request_id: empty string
    text: missing | text: expected string, got int
    text: empty string                      see "Empty text" below
    text: no tokens (only whitespace or control characters)
    text: N characters exceeds max_chars=M  default M = 100000
    text: no tokens in its first 16384 characters (...)   a longer text, likewise
    text: longer than the maximum of 256 tokens   only with on_overlength="reject"
    text: longer than the 16384 characters read per text   likewise
    value: JSON nested deeper than 1024 levels (documented limit)
    priority: expected integer 0..9, got str | priority: 12 out of range 0..9
    deadline_ms: expected positive integer, got float | deadline_ms: must be > 0, got 0
    tenant: expected string, got int

Empty text goes to the dead-letter topic by default (on_empty="reject"). The embedding
of "" is the embedding of "[CLS] [SEP]": one fixed vector that carries no meaning, is
the nearest neighbour of every other empty document and quietly pollutes a search
index. An empty text is almost always an upstream bug, and the DLQ makes it visible
and replayable. on_empty="embed" restores sentence-transformers' behaviour.

Shape buckets: a request's bucket is the smallest edge of `bucket_edges` (default
16/32/64/128/256) that holds its token count; a batch is padded only up to its bucket
edge, with attention_mask 0 on the padding (masked out of attention and of the mean
pooling inside the graph, so padding never changes an embedding).
pad_to="longest" is the baseline without buckets (bench/camera_text.py): every request
shares one bucket, and a batch is padded to its longest request.
"""

from __future__ import annotations

import bisect
import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from models.text.model import EMBEDDING_DIM, MAX_LENGTH, PAD_ID, load_tokenizer
from pipeline.codecs import jsonnum
from pipeline.codecs.base import Decoded, DecodeError, Sample

DEFAULT_BUCKET_EDGES: tuple[int, ...] = (16, 32, 64, 128, 256)
DEFAULT_MAX_CHARS = 100_000
# UTF-8 is at most 4 bytes a character; JSON escapes can make it 6 ("\u00e9"). The
# slack covers the other fields. Anything bigger is refused before it is parsed.
_BYTES_PER_CHAR_LIMIT = 6
_BYTES_SLACK = 64 * 1024
# Characters read per text: 64 per token of the cap (16,384 for 256 tokens). Prose
# needs ~4.5 per word piece, so only a text that is mostly blanks, control characters
# or 100+-character "words" ([UNK]) reaches it with room left under the token cap.
# The tokenizer costs ~0.3-0.75 us per character even where it yields no token (1 MB
# without spaces: 0.75 s), so reading everything would not be bounded.
_READ_CHARS_PER_TOKEN = 64
# Text is tokenised in chunks of about this many characters, cut where the tokenizer
# splits anyway, until the token cap is exceeded: 100k CJK characters (one token each)
# cost ~0.5 s when tokenised whole.
_CHUNK_CHARS = 1024
_CUT_WINDOW = 256  # how far back from a chunk's end a cut is looked for


def _cut_class() -> str:
    """Characters before which the text can be cut without changing a word piece: the
    BERT normaliser makes ASCII blanks a split and puts blanks around CJK ideographs,
    and its pre-tokenizer isolates every punctuation character (ASCII punctuation or a
    Unicode P* category). Only old, stable blocks are taken from unicodedata, so the
    tokenizer's own (older) Unicode tables agree. Zero-width and control characters
    are not cuts: the normaliser deletes them, joining their neighbours."""
    blocks = [(0x00A1, 0x00BF), (0x2010, 0x2027), (0x2030, 0x205E), (0x3000, 0x303F),
              (0xFE30, 0xFE4F), (0xFF01, 0xFF65)]
    punct = "".join(
        chr(c) for lo, hi in blocks for c in range(lo, hi + 1)
        if unicodedata.category(chr(c))[0] == "P" or unicodedata.category(chr(c)) == "Zs"
    )
    # BERT's CJK ideograph ranges (the normaliser's handle_chinese_chars), as re escapes.
    cjk = (r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002b73f"
           r"\U0002b740-\U0002b81f\U0002b820-\U0002ceaf\U0002f800-\U0002fa1f")
    return r"[ \t\n\r!-/:-@\[-`{-~" + re.escape(punct) + cjk + "]"


_CUT = re.compile(_cut_class())


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "bool", int: "int",
            float: "float", type(None): "null"}.get(type(value), type(value).__name__)


def _parse_json(value: bytes | None, max_bytes: int) -> dict[str, Any]:
    if value is None:
        raise DecodeError("value: missing (tombstone)")
    if len(value) > max_bytes:
        raise DecodeError(f"value: {len(value)} bytes exceeds the size limit of {max_bytes}")
    try:
        doc = jsonnum.loads(value)
    except DecodeError as exc:  # the documented depth limit
        raise DecodeError(f"value: {exc}") from None
    except json.JSONDecodeError as exc:
        # orjson refuses bad UTF-8 without saying where; find the offset only on failure.
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError as ude:
            raise DecodeError(f"value: invalid UTF-8 at byte {ude.start}") from None
        raise DecodeError(f"value: not valid JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise DecodeError(f"value: expected a JSON object, got {_type_name(doc)}")
    return doc


def _required_str(doc: Mapping[str, Any], key: str) -> str:
    if key not in doc or doc[key] is None:
        raise DecodeError(f"{key}: missing")
    value = doc[key]
    if not isinstance(value, str):
        raise DecodeError(f"{key}: expected string, got {_type_name(value)}")
    return value


def _optional_int(doc: Mapping[str, Any], key: str, lo: int, hi: int | None, raw: bytes) -> int | None:
    """An optional integer field. Without ``hi`` (deadline_ms) any larger integer
    saturates to INT64_MAX; ``raw`` is read again only for an integer literal beyond 64
    bits, which orjson gives as a float."""
    value = doc.get(key)
    if value is None:
        return None
    if type(value) is float:  # orjson's reading of an integer literal beyond 64 bits?
        literal = jsonnum.int_literal(raw, key)
        if literal is None:
            raise DecodeError(f"{key}: expected {_int_wanted(lo, hi)}, got float")
        value = int(literal) if len(literal) <= 20 else (-1 if literal.startswith("-") else jsonnum.INT64_MAX + 1)
        shown = jsonnum.show_int(literal)
    elif type(value) is not int:  # `type is`: a bool (an int subclass) is no priority 1
        raise DecodeError(f"{key}: expected {_int_wanted(lo, hi)}, got {_type_name(value)}")
    else:
        shown = str(value)
    if hi is not None and not lo <= value <= hi:
        raise DecodeError(f"{key}: {shown} out of range {lo}..{hi}")
    if hi is None and value < lo:
        raise DecodeError(f"{key}: must be > {lo - 1}, got {shown}")
    return min(value, jsonnum.INT64_MAX)


def _int_wanted(lo: int, hi: int | None) -> str:
    return f"integer {lo}..{hi}" if hi is not None else "positive integer"


def _optional_str(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is None or isinstance(value, str):
        return value
    raise DecodeError(f"{key}: expected string, got {_type_name(value)}")


def _chunk_end(text: str, pos: int) -> int:
    """Where a chunk that should end near ``pos`` ends: before the last cut character
    in the _CUT_WINDOW characters before pos, else before the next one after it (a
    long run without one is one word, [UNK] past 100 characters), else at the end."""
    if pos >= len(text):
        return len(text)
    back = _CUT.search(text[pos - _CUT_WINDOW : pos][::-1])
    if back is not None:
        return pos - 1 - back.start()
    ahead = _CUT.search(text, pos)
    return len(text) if ahead is None else ahead.start()


def padded_token_ratio(feeds: Mapping[str, np.ndarray]) -> float:
    """Share of the batch's token slots that are padding (rows added by pad_to_rows
    included): 1 - real tokens / (rows x padded length). Compute spent on padding."""
    mask = feeds["attention_mask"]
    return 0.0 if mask.size == 0 else 1.0 - float(mask.sum()) / float(mask.size)


def _pad(payloads: Sequence[np.ndarray], length: int, pad_to_rows: int | None) -> dict[str, np.ndarray]:
    rows = len(payloads) if pad_to_rows is None else pad_to_rows
    if rows < len(payloads):
        raise ValueError(f"pad_to_rows={pad_to_rows} is smaller than the batch ({len(payloads)} requests)")
    ids = np.full((rows, length), PAD_ID, dtype=np.int64)
    mask = np.zeros((rows, length), dtype=np.int64)
    for i, p in enumerate(payloads):
        ids[i, : len(p)] = p
        mask[i, : len(p)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def collate_padded_to_longest(payloads: Sequence[np.ndarray], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
    """The baseline without buckets: pad every row to the batch's longest request."""
    if not payloads:
        raise ValueError("cannot collate an empty batch")
    return _pad(payloads, max(len(p) for p in payloads), pad_to_rows)


class TextCodec:
    """Codec for text events; see the module docstring for the schema and outcomes."""

    name = "text"

    def __init__(
        self,
        bucket_edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
        max_chars: int = DEFAULT_MAX_CHARS,
        on_overlength: Literal["truncate", "reject"] = "truncate",
        on_empty: Literal["reject", "embed"] = "reject",
        max_length: int = MAX_LENGTH,
        pad_to: Literal["bucket", "longest"] = "bucket",
    ) -> None:
        edges = tuple(int(e) for e in bucket_edges)
        if not edges or any(e <= 2 for e in edges) or list(edges) != sorted(set(edges)):
            raise ValueError(f"bucket_edges must be increasing integers > 2, got {bucket_edges!r}")
        if on_overlength not in ("truncate", "reject"):
            raise ValueError(f"on_overlength must be 'truncate' or 'reject', got {on_overlength!r}")
        if on_empty not in ("reject", "embed"):
            raise ValueError(f"on_empty must be 'reject' or 'embed', got {on_empty!r}")
        if max_chars <= 0:
            raise ValueError(f"max_chars must be > 0, got {max_chars}")
        if pad_to not in ("bucket", "longest"):
            raise ValueError(f"pad_to must be 'bucket' or 'longest', got {pad_to!r}")
        self.pad_to = pad_to
        # A text never gets longer than the largest bucket, nor than the model allows.
        self.max_tokens = min(max_length, edges[-1])
        self.bucket_edges = tuple(e for e in edges if e < self.max_tokens) + (self.max_tokens,)
        self.max_chars = max_chars
        self.on_overlength = on_overlength
        self.on_empty = on_empty
        self._max_bytes = max_chars * _BYTES_PER_CHAR_LIMIT + _BYTES_SLACK
        self.read_chars = _READ_CHARS_PER_TOKEN * self.max_tokens
        self._tokenizer = load_tokenizer(self.max_tokens)
        self._cls, self._sep = self._tokenizer.encode("").ids

    def samples(self, seed: int) -> Callable[[int], Sample]:
        """Valid requests (the Codec protocol's optional sample maker, base.py): the
        load generator's, pipeline/loadgen/text.py."""
        from pipeline.loadgen.text import TextRequestFactory

        factory = TextRequestFactory(seed=seed)
        return lambda i: (*factory.make(i), [])

    def bucket_for(self, tokens: int) -> int:
        """The smallest bucket edge >= tokens (tokens is at most max_tokens)."""
        return self.bucket_edges[bisect.bisect_left(self.bucket_edges, tokens)]

    def _bucket(self, tokens: int) -> int:
        # pad_to="longest": one bucket for every length, so batches mix lengths.
        return self.max_tokens if self.pad_to == "longest" else self.bucket_for(tokens)

    def tokenize(self, text: str) -> tuple[np.ndarray, bool]:
        """Word-piece ids with [CLS]/[SEP], truncated to max_tokens; and whether the text
        was cut (over max_tokens word pieces, or over read_chars characters).

        The work is bounded whatever the text. Only the first read_chars characters are
        read. A text longer than one chunk is tokenised chunk by chunk, each cut before
        a character where the tokenizer splits anyway (_CUT), so the chunks' pieces are
        the whole text's; that stops as soon as the cap is exceeded. A text that stays
        under the cap is then tokenised whole, in one call, so its ids (and embedding)
        are exactly those of tokenising it alone. Cost on one core: bench/text_cost.py,
        figures in docs/schemas/text_request.md "Cost"."""
        ids, over_cap, over_chars = self._tokenize(text)
        return ids, over_cap or over_chars

    def _tokenize(self, text: str) -> tuple[np.ndarray, bool, bool]:
        """ids, whether the text has more than max_tokens-2 word pieces, whether it has
        more than read_chars characters."""
        head = text[: self.read_chars]
        over_chars = len(text) > len(head)
        if len(head) > _CHUNK_CHARS:
            first = self._first_pieces(head)
            if first is not None:
                return np.asarray([self._cls, *first, self._sep], dtype=np.int64), True, over_chars
        enc = self._tokenizer.encode(head)
        return np.asarray(enc.ids, dtype=np.int64), bool(enc.overflowing), over_chars

    def _first_pieces(self, head: str) -> list[int] | None:
        """The first max_tokens-2 word pieces of ``head`` if it has more; else None."""
        keep = self.max_tokens - 2
        pieces: list[int] = []
        start = 0
        while start < len(head):
            end = _chunk_end(head, start + _CHUNK_CHARS)
            if start == 0 and end == len(head):
                return None  # one chunk would be the whole text: tokenise it whole
            pieces += self._tokenizer.encode(head[start:end], add_special_tokens=False).ids
            if len(pieces) > keep:
                return pieces[:keep]
            start = end
        return None

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> Decoded:
        doc = _parse_json(value, self._max_bytes)
        request_id = _required_str(doc, "request_id")
        if not request_id:
            raise DecodeError("request_id: empty string")
        text = self._check_text(_required_str(doc, "text"))
        assert value is not None  # _parse_json refused None
        priority = _optional_int(doc, "priority", 0, 9, value)
        deadline_ms = _optional_int(doc, "deadline_ms", 1, None, value)
        tenant = _optional_str(doc, "tenant")
        ids, over_cap, over_chars = self._tokenize(text)
        truncated = over_cap or over_chars
        if truncated and self.on_overlength == "reject":
            if over_cap:
                raise DecodeError(f"text: longer than the maximum of {self.max_tokens} tokens")
            raise DecodeError(f"text: longer than the {self.read_chars} characters read per text")
        if len(ids) <= 2 and self.on_empty == "reject":  # only [CLS] [SEP]
            if over_chars:
                raise DecodeError(
                    f"text: no tokens in its first {self.read_chars} characters (only whitespace or control characters)"
                )
            raise DecodeError("text: no tokens (only whitespace or control characters)")
        return Decoded(
            request_id=request_id, rows=1, payload=ids,
            priority=0 if priority is None else priority, deadline_ms=deadline_ms, tenant=tenant,
            bucket=self._bucket(len(ids)), extra={"tokens": len(ids), "truncated": truncated},
        )

    def _check_text(self, text: str) -> str:
        if not text and self.on_empty == "reject":
            raise DecodeError("text: empty string")
        if len(text) > self.max_chars:
            raise DecodeError(f"text: {len(text)} characters exceeds max_chars={self.max_chars}")
        return text

    def collate(self, payloads: Sequence[np.ndarray], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        """Pad ids and mask up to the batch's bucket edge (not to the longest request,
        not to the model maximum). The batcher never mixes buckets; if a caller does,
        the batch is padded to the edge of its longest request, which is still correct.
        pad_to="longest": to the batch's longest request (the unbucketed baseline)."""
        if not payloads:
            raise ValueError("cannot collate an empty batch")
        if self.pad_to == "longest":
            return collate_padded_to_longest(payloads, pad_to_rows)
        return _pad(payloads, self.bucket_for(max(len(p) for p in payloads)), pad_to_rows)

    def padded_length(self, tokens: Sequence[int]) -> int:
        """Sequence length a batch of requests with these token counts is padded to."""
        longest = max(tokens)
        return longest if self.pad_to == "longest" else self.bucket_for(longest)

    def collate_padded_to_longest(self, payloads: Sequence[np.ndarray], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        return collate_padded_to_longest(payloads, pad_to_rows)

    def split(self, outputs: Mapping[str, np.ndarray], decoded: Sequence[Decoded]) -> list[dict[str, Any]]:
        emb = outputs["embedding"]
        if emb.ndim != 2 or emb.shape[1] != EMBEDDING_DIM or emb.shape[0] < len(decoded):
            raise ValueError(f"embedding output has shape {emb.shape}, need [>={len(decoded)}, {EMBEDDING_DIM}]")
        return [
            {"request_id": d.request_id, "embedding": emb[i].tolist(),
             "tokens": d.extra["tokens"], "truncated": d.extra["truncated"]}
            for i, d in enumerate(decoded)
        ]
