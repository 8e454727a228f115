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
does), or is rejected (on_overlength="reject").

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
    text: longer than the maximum of 256 tokens   only with on_overlength="reject"
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
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import orjson

from consumers.codecs.base import Decoded, DecodeError
from models.text.model import EMBEDDING_DIM, MAX_LENGTH, PAD_ID, load_tokenizer

DEFAULT_BUCKET_EDGES: tuple[int, ...] = (16, 32, 64, 128, 256)
DEFAULT_MAX_CHARS = 100_000
# UTF-8 is at most 4 bytes a character; JSON escapes can make it 6 ("\u00e9"). The
# slack covers the other fields. Anything bigger is refused before it is parsed.
_BYTES_PER_CHAR_LIMIT = 6
_BYTES_SLACK = 64 * 1024
_PREFIX_CHARS_PER_TOKEN = 8


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "bool", int: "int",
            float: "float", type(None): "null"}.get(type(value), type(value).__name__)


def _parse_json(value: bytes | None, max_bytes: int) -> dict[str, Any]:
    if value is None:
        raise DecodeError("value: missing (tombstone)")
    if len(value) > max_bytes:
        raise DecodeError(f"value: {len(value)} bytes exceeds the size limit of {max_bytes}")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
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


def _optional_int(doc: Mapping[str, Any], key: str, lo: int, hi: int | None) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    # bool is an int subclass in Python: `true` must not pass as priority 1.
    if not isinstance(value, int) or isinstance(value, bool):
        want = f"integer {lo}..{hi}" if hi is not None else "positive integer"
        raise DecodeError(f"{key}: expected {want}, got {_type_name(value)}")
    if hi is not None and not lo <= value <= hi:
        raise DecodeError(f"{key}: {value} out of range {lo}..{hi}")
    if hi is None and value < lo:
        raise DecodeError(f"{key}: must be > {lo - 1}, got {value}")
    return value


def _optional_str(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is None or isinstance(value, str):
        return value
    raise DecodeError(f"{key}: expected string, got {_type_name(value)}")


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
        # English averages ~4.5 characters per word piece; 8x the token budget is a
        # prefix that overflows for nearly every text that will be truncated anyway.
        self._prefix_chars = _PREFIX_CHARS_PER_TOKEN * self.max_tokens
        self._tokenizer = load_tokenizer(self.max_tokens)

    def bucket_for(self, tokens: int) -> int:
        """The smallest bucket edge >= tokens (tokens is at most max_tokens)."""
        return self.bucket_edges[bisect.bisect_left(self.bucket_edges, tokens)]

    def _bucket(self, tokens: int) -> int:
        # pad_to="longest": one bucket for every length, so batches mix lengths.
        return self.max_tokens if self.pad_to == "longest" else self.bucket_for(tokens)

    def tokenize(self, text: str) -> tuple[np.ndarray, bool]:
        """Word-piece ids with [CLS]/[SEP], truncated to max_tokens; and whether it was.

        The tokenizer works through the whole text before it truncates: ~0.9 ms per
        1,000 characters, so a 100k-character text would hold the source thread for
        ~90 ms. A long text is therefore first tokenised up to a space near
        _prefix_chars: normalisation is per character and words split at whitespace,
        so the pieces of that prefix are exactly the first pieces of the whole text,
        and if the prefix alone overflows the result is the same as the full one."""
        if len(text) > self._prefix_chars:
            cut = text.rfind(" ", 0, self._prefix_chars)
            if cut > 0:
                enc = self._tokenizer.encode(text[:cut])
                if enc.overflowing:
                    return np.asarray(enc.ids, dtype=np.int64), True
        enc = self._tokenizer.encode(text)
        return np.asarray(enc.ids, dtype=np.int64), bool(enc.overflowing)

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> Decoded:
        doc = _parse_json(value, self._max_bytes)
        request_id = _required_str(doc, "request_id")
        if not request_id:
            raise DecodeError("request_id: empty string")
        text = self._check_text(_required_str(doc, "text"))
        priority = _optional_int(doc, "priority", 0, 9)
        deadline_ms = _optional_int(doc, "deadline_ms", 1, None)
        tenant = _optional_str(doc, "tenant")
        ids, truncated = self.tokenize(text)
        if truncated and self.on_overlength == "reject":
            raise DecodeError(f"text: longer than the maximum of {self.max_tokens} tokens")
        if len(ids) <= 2 and self.on_empty == "reject":  # only [CLS] [SEP]
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
