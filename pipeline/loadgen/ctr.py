"""CTR request payloads for the load generator (no Kafka here: the producing loop only
asks for ``(key, value)`` pairs).

Requests come from the same synthetic world the shipped model was trained on
(models/ctr/synth.py, the same samplers): Zipf-popular users and items, Zipf
categorical tokens, log-normal counts, the same missing rates. A request is one user
context plus a varying number of distinct candidate items (log-normal, mean about
``mean_items``, clipped to 1..``max_items``). Missing features are sent as ``null`` in
about half of the requests and left out in the others: both are legal, and real
producers do both.

``make(i)`` is a pure function of ``(seed, i)``: replaying an index gives the same bytes,
and request ids ``req-{seed}-{i}`` are unique per factory seed. For speed, requests are
drawn BLOCK at a time with one generator keyed by ``(seed, i // BLOCK)`` (all the numpy
work vectorised over the block); the last blocks are cached, so sequential ``make``
calls cost about one dict build + one orjson.dumps each.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from typing import Any

import numpy as np
import orjson

from models.ctr import features as F
from models.ctr import synth

BLOCK = 256  # requests drawn together
ITEM_COUNT_SIGMA = 0.75  # log-normal spread of the number of items per request
_CACHED_BLOCKS = 4

# kind -> what make_invalid returns and the reason CtrCodec gives for it
INVALID_KINDS: dict[str, str] = {
    "malformed_json": "a valid request cut short -> 'malformed JSON: unexpected end of data at ...'",
    "missing_field": "a valid request without 'items' -> \"missing field 'items'\"",
    "mistyped_field": "items[0].C14 is the int 12345 -> 'items[0].C14: expected hex string or null, got int'",
    "too_many_items": "max_items + 1 items -> 'too many items: 1001 > max_items 1000'",
    "non_utf8": "a 0xff byte inside user_id -> 'value is not valid UTF-8 (byte 0xff at offset N)'",
    "empty": "a zero-length value -> 'empty message value'",
}

_CTX_KEYS: tuple[str, ...] = F.CONTEXT_DENSE + F.CONTEXT_CAT
_ITEM_KEYS: tuple[str, ...] = ("item_id",) + F.ITEM_DENSE + F.ITEM_CAT
_CTX_FIELDS = np.arange(0, 13)
_ITEM_FIELDS = np.arange(13, 26)


@functools.cache
def _world() -> synth.World:
    # the Zipf tables take ~0.1 s and 10 MB: build them once per process
    return synth.World()


class CtrRequestFactory:
    """Deterministic generator of CTR request messages. Not thread-safe (it caches
    blocks): give each producing thread its own factory, with its own seed."""

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
        # log-normal mean = exp(mu + sigma^2 / 2) = mean_items (before rounding/clipping)
        self._mu = math.log(self.mean_items) - ITEM_COUNT_SIGMA**2 / 2
        self._blocks: OrderedDict[int, list[bytes]] = OrderedDict()

    # ------------------------------------------------------------------------ valid
    def make(self, i: int) -> tuple[bytes, bytes]:
        """Request number ``i`` (>= 0): (key = user_id, value = JSON bytes)."""
        if i < 0:
            raise ValueError(f"request index must be >= 0, got {i}")
        return self._block(i // BLOCK)[i % BLOCK]

    def make_doc(self, i: int) -> dict[str, Any]:
        """Request number ``i`` as a fresh dict (for tests and invalid variants)."""
        return orjson.loads(self.make(i)[1])

    def _block(self, b: int) -> list[tuple[bytes, bytes]]:
        block = self._blocks.get(b)
        if block is None:
            rng = _rng(self.seed, b)
            counts = self._item_counts(rng, BLOCK)
            docs = self._draw_docs(rng, counts, first_index=b * BLOCK)
            block = [(d["user_id"].encode(), orjson.dumps(d)) for d in docs]
            self._blocks[b] = block
            if len(self._blocks) > _CACHED_BLOCKS:
                self._blocks.popitem(last=False)
        return block

    def _item_counts(self, rng: np.random.Generator, k: int) -> np.ndarray:
        n = np.rint(rng.lognormal(self._mu, ITEM_COUNT_SIGMA, k)).astype(np.int64)
        return np.clip(n, 1, self.max_items)

    def _draw_docs(
        self, rng: np.random.Generator, counts: np.ndarray, first_index: int
    ) -> list[dict[str, Any]]:
        """One document per entry of ``counts`` (its number of items), vectorised."""
        world = self._world
        k = len(counts)
        users = world.draw_users(rng, k)
        item_lists = _distinct_items(world, rng, counts)
        # one row per request context, then one per item: [ctx_0, items_0..., ctx_1, ...]
        entity_list: list[int] = []
        for u, its in zip(users.tolist(), item_lists, strict=True):
            entity_list.append(u)
            entity_list.extend(its)
        entity = np.array(entity_list, dtype=np.int64)
        is_ctx = np.zeros(len(entity), dtype=bool)
        is_ctx[np.cumsum(counts + 1) - (counts + 1)] = True
        fields = np.where(is_ctx[:, None], _CTX_FIELDS, _ITEM_FIELDS)
        ranks = world.cat_ranks(rng, fields, entity)
        tokens = _hex_rows(synth.token_values(fields, ranks), ranks < 0)
        ids = _entity_ids(entity, is_ctx)
        ctx_dense = _counts(world.dense_counts(rng, synth.CONTEXT_DENSE_IDX, k))
        item_dense = _counts(world.dense_counts(rng, synth.ITEM_DENSE_IDX, int(counts.sum())))
        explicit_null = (rng.random(k) < 0.5).tolist()

        docs: list[dict[str, Any]] = []
        row = item_row = 0
        for r in range(k):
            n = int(counts[r])
            null = explicit_null[r]
            doc: dict[str, Any] = {
                "request_id": f"req-{self.seed}-{first_index + r}",
                "user_id": ids[row],
            }
            if self.tenant is not None:
                doc["tenant"] = self.tenant
            if self.priority is not None:
                doc["priority"] = self.priority
            if self.deadline_ms is not None:
                doc["deadline_ms"] = self.deadline_ms
            doc["context"] = _record(_CTX_KEYS, ctx_dense[r] + tokens[row], null)
            doc["items"] = [
                _record(
                    _ITEM_KEYS,
                    [ids[row + 1 + j], *item_dense[item_row + j], *tokens[row + 1 + j]],
                    null,
                )
                for j in range(n)
            ]
            docs.append(doc)
            row += n + 1
            item_row += n
        return docs

    # ------------------------------------------------------------------------ invalid
    def make_invalid(self, kind: str, *, max_items: int = 1000) -> bytes:
        """A message value the CtrCodec must reject; kinds and reasons: INVALID_KINDS.
        ``max_items`` is the codec's limit that "too_many_items" exceeds by one."""
        if kind == "empty":
            return b""
        if kind == "too_many_items":
            rng = _rng(self.seed, -1)
            doc = self._draw_docs(rng, np.array([max_items + 1]), first_index=0)[0]
            doc["request_id"] = f"req-{self.seed}-too-many"
            return orjson.dumps(doc)
        doc = self.make_doc(0)
        if kind == "malformed_json":
            return orjson.dumps(doc)[:-7]
        if kind == "missing_field":
            del doc["items"]
            return orjson.dumps(doc)
        if kind == "mistyped_field":
            doc["items"][0]["C14"] = 12345
            return orjson.dumps(doc)
        if kind == "non_utf8":
            doc["user_id"] = "BAD-UTF8-HERE"
            return orjson.dumps(doc).replace(b"BAD-UTF8-HERE", b"u\xff")
        raise ValueError(f"unknown invalid kind {kind!r}; kinds: {', '.join(INVALID_KINDS)}")


def _rng(seed: int, block: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, block & 0xFFFFFFFFFFFFFFFF, 0x637472])


def _distinct_items(
    world: synth.World, rng: np.random.Generator, counts: np.ndarray
) -> list[list[int]]:
    """Per request, counts[r] distinct item ranks in draw order (the candidates of one
    request never repeat): 2n draws each, topped up in the rare case that is not enough."""
    draws = world.draw_items(rng, 2 * int(counts.sum())).tolist()
    out: list[list[int]] = []
    pos = 0
    for n in counts.tolist():
        picked = dict.fromkeys(draws[pos : pos + 2 * n])
        pos += 2 * n
        while len(picked) < n:
            picked.update(dict.fromkeys(world.draw_items(rng, 2 * n).tolist()))
        out.append(list(picked)[:n])
    return out


def _hex_rows(values: np.ndarray, missing: np.ndarray) -> list[list[str | None]]:
    """Rows of 8-hex-digit tokens, None where ``missing``."""
    text = values.astype(">u4").tobytes().hex()  # one C call instead of one format() per token
    flat: list[str | None] = [text[k : k + 8] for k in range(0, len(text), 8)]
    for k in np.flatnonzero(missing).tolist():
        flat[k] = None
    width = values.shape[1]
    return [flat[r : r + width] for r in range(0, len(flat), width)]


def _entity_ids(entity: np.ndarray, is_user: np.ndarray) -> list[str]:
    text = synth.entity_tokens(entity, is_user).astype(">u4").tobytes().hex()
    prefixes = np.where(is_user, "u", "it").tolist()
    return [p + text[8 * k : 8 * k + 8] for k, p in enumerate(prefixes)]


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
