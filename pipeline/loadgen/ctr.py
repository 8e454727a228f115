"""CTR request payloads for the load generator (no Kafka here: the producing loop only
asks for ``(key, value)`` pairs).

Requests come from the same synthetic world the shipped model was trained on
(models/ctr/synth.py): Zipf-popular users and items, Zipf categorical tokens, log-normal
counts, the same missing rates. A request is one user context plus a varying number
of distinct candidate items (log-normal, mean ~ ``mean_items``, 1..``max_items``).
Missing features are sent as ``null`` in about half of the requests and left out in
the others, since both are legal and real producers do both.

``make(i)`` is a pure function of ``(seed, i)``: replaying an index gives the same bytes,
and request ids ``req-{seed}-{i}`` are unique per factory seed.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import orjson

from models.ctr import features as F
from models.ctr import synth

ITEM_COUNT_SIGMA = 0.75  # log-normal spread of the number of items per request

# kind -> what it is and the reason CtrCodec gives (see make_invalid)
INVALID_KINDS: dict[str, str] = {
    "malformed_json": "a valid request cut short -> 'malformed JSON: ...'",
    "missing_field": "a valid request without 'items' -> \"missing field 'items'\"",
    "mistyped_field": "items[0].C14 is the int 12345 -> 'items[0].C14: expected hex string or null, got int'",
    "too_many_items": "max_items + 1 items -> 'too many items: 1001 > max_items 1000'",
    "non_utf8": "a 0xff byte inside user_id -> 'value is not valid UTF-8 (byte 0xff at offset N)'",
    "empty": "a zero-length value -> 'empty message value'",
}

_CTX_KEYS: tuple[str, ...] = F.CONTEXT_DENSE + F.CONTEXT_CAT
_ITEM_KEYS: tuple[str, ...] = ("item_id",) + F.ITEM_DENSE + F.ITEM_CAT


@functools.cache
def _world() -> synth.World:
    # the Zipf tables take ~0.1 s and 10 MB: build them once per process
    return synth.World()


class CtrRequestFactory:
    """Deterministic generator of CTR request messages."""

    def __init__(
        self,
        seed: int,
        mean_items: float = 20,
        max_items: int = 200,
        *,
        tenant: str | None = None,
        priority: int | None = None,
        deadline_ms: int | None = None,
    ) -> None:
        if mean_items < 1:
            raise ValueError(f"mean_items must be >= 1, got {mean_items}")
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self.seed = seed
        self.mean_items = float(mean_items)
        self.max_items = int(max_items)
        self.tenant = tenant
        self.priority = priority
        self.deadline_ms = deadline_ms
        self._world = _world()
        # log-normal mean = exp(mu + sigma^2 / 2) = mean_items
        self._mu = math.log(self.mean_items) - ITEM_COUNT_SIGMA**2 / 2

    # ------------------------------------------------------------------------ valid
    def make(self, i: int) -> tuple[bytes, bytes]:
        """Request number ``i``: (key = user_id, value = JSON bytes)."""
        doc = self.make_doc(i)
        return doc["user_id"].encode(), orjson.dumps(doc)

    def make_doc(self, i: int, n_items: int | None = None) -> dict[str, Any]:
        """The request as a dict (before JSON encoding); ``n_items`` overrides the draw."""
        rng = np.random.default_rng([self.seed, i])
        world = self._world
        user = world.draw_users(rng, 1)
        n = self._n_items(rng) if n_items is None else n_items
        items = self._distinct_items(rng, n)
        explicit_null = bool(rng.random() < 0.5)
        ctx_cat = _hex_tokens(synth.CONTEXT_CAT_IDX, world.cat_ranks(rng, synth.CONTEXT_CAT_IDX, user))
        item_cat = _hex_tokens(synth.ITEM_CAT_IDX, world.cat_ranks(rng, synth.ITEM_CAT_IDX, items))
        ctx_dense = _counts(world.dense_counts(rng, synth.CONTEXT_DENSE_IDX, 1))
        item_dense = _counts(world.dense_counts(rng, synth.ITEM_DENSE_IDX, n))
        doc: dict[str, Any] = {
            "request_id": f"req-{self.seed}-{i}",
            "user_id": synth.user_id(int(user[0])),
        }
        if self.tenant is not None:
            doc["tenant"] = self.tenant
        if self.priority is not None:
            doc["priority"] = self.priority
        if self.deadline_ms is not None:
            doc["deadline_ms"] = self.deadline_ms
        doc["context"] = _record(_CTX_KEYS, ctx_dense[0] + ctx_cat[0], explicit_null)
        ids = synth.item_ids(items)
        doc["items"] = [
            _record(_ITEM_KEYS, [ids[k]] + item_dense[k] + item_cat[k], explicit_null)
            for k in range(n)
        ]
        return doc

    def _n_items(self, rng: np.random.Generator) -> int:
        n = round(float(rng.lognormal(self._mu, ITEM_COUNT_SIGMA)))
        return min(max(n, 1), self.max_items)

    def _distinct_items(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n distinct item ranks in draw order (candidates of one request never repeat)."""
        picked = np.empty(0, dtype=np.int64)
        while len(picked) < n:
            draw = np.concatenate([picked, self._world.draw_items(rng, 2 * n)])
            _, first = np.unique(draw, return_index=True)
            picked = draw[np.sort(first)]
        return picked[:n]

    # ------------------------------------------------------------------------ invalid
    def make_invalid(self, kind: str, *, max_items: int = 1000) -> bytes:
        """A message value the CtrCodec must reject; kinds and reasons: INVALID_KINDS.
        ``max_items`` is the codec's limit that "too_many_items" exceeds by one."""
        if kind == "empty":
            return b""
        if kind == "malformed_json":
            return orjson.dumps(self.make_doc(0, n_items=2))[:-7]
        if kind == "missing_field":
            doc = self.make_doc(0, n_items=2)
            del doc["items"]
            return orjson.dumps(doc)
        if kind == "mistyped_field":
            doc = self.make_doc(0, n_items=2)
            doc["items"][0]["C14"] = 12345
            return orjson.dumps(doc)
        if kind == "too_many_items":
            return orjson.dumps(self.make_doc(0, n_items=max_items + 1))
        if kind == "non_utf8":
            doc = self.make_doc(0, n_items=2)
            doc["user_id"] = "BAD-UTF8-HERE"
            return orjson.dumps(doc).replace(b"BAD-UTF8-HERE", b"u\xff")
        raise ValueError(f"unknown invalid kind {kind!r}; kinds: {', '.join(INVALID_KINDS)}")


def _hex_tokens(fields: np.ndarray, ranks: np.ndarray) -> list[list[str | None]]:
    """Rows of 8-hex-digit tokens (None where the rank is -1 = missing)."""
    values = synth.token_values(fields, ranks).astype(">u4")
    text = values.tobytes().hex()  # one C call instead of one format() per token
    flat: list[str | None] = [text[k : k + 8] for k in range(0, len(text), 8)]
    for k in np.flatnonzero(ranks.ravel() < 0).tolist():
        flat[k] = None
    width = ranks.shape[1]
    return [flat[r : r + width] for r in range(0, len(flat), width)]


def _counts(dense: np.ndarray) -> list[list[int | None]]:
    """Rows of integer counts (None where NaN = missing)."""
    missing = np.isnan(dense)
    ints = np.where(missing, 0, dense).astype(np.int64).tolist()
    for r, c in zip(*np.nonzero(missing), strict=True):
        ints[int(r)][int(c)] = None
    return ints


def _record(keys: tuple[str, ...], values: list[Any], explicit_null: bool) -> dict[str, Any]:
    if explicit_null:
        return dict(zip(keys, values, strict=True))
    return {k: v for k, v in zip(keys, values, strict=True) if v is not None}
