"""Feature store: user and item features in Redis hashes, looked up once per batch.

Key layout (prefix `redis.key_prefix`, default "tb:"):

    tb:user:<user_id>   hash  I1..I6, C1..C13     the request-context features
    tb:item:<item_id>   hash  I7..I13, C14..C26   the candidate-item features

Values are strings: dense counts as decimal numbers ("42", "3.5"), categorical tokens
as hex ("68fd1e64"), exactly what an inline request would carry. An absent field is a
missing feature; an absent key is a miss (`tidebatch_feature_misses_total{kind}`) and
all its features are missing. "Missing" is the codec's encoding (dense NaN, cat = the
field's reserved id), so a feature the store lacks scores as if the request had sent
null. A value that does not parse counts in `tidebatch_feature_invalid_total` and is
treated as missing: the hook degrades, it never fails a batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from consumers.records import SourceRecord
from models.ctr import features as F
from pipeline.codecs.base import Decoded
from pipeline.redisio.codec import N_USER_CAT, N_USER_DENSE, CtrIdPayload
from pipeline.redisio.link import RedisLink
from pipeline.redisio.metrics import RedisMetrics

USER_FIELDS: tuple[str, ...] = F.CONTEXT_DENSE + F.CONTEXT_CAT  # 19
ITEM_FIELDS: tuple[str, ...] = F.ITEM_DENSE + F.ITEM_CAT  # 20
KIND_FIELDS: dict[str, tuple[str, ...]] = {"user": USER_FIELDS, "item": ITEM_FIELDS}
_FIRST_CAT_FIELD = {"user": 0, "item": N_USER_CAT}  # C1 is field 0, C14 is field 13


def feature_key(prefix: str, kind: str, entity_id: str) -> str:
    return f"{prefix}{kind}:{entity_id}"


def _split_line(line: str, width: int) -> list[str] | None:
    """One key's line of the lookup script's reply; None for "!" or a bad field count
    (a value containing a tab), which then reads as an absent key."""
    if line == "!":
        return None
    values = line.split("\t")
    return values if len(values) == width else None


def _hmget_row(reply: Any) -> list[str] | None:
    """One HMGET reply of the pipeline lookup in the script's shape; an error reply
    (e.g. WRONGTYPE) reads as an absent key."""
    if not isinstance(reply, list):
        return None
    return [v or "" for v in reply]


class FeatureTable:
    """Featurised rows of one kind for the distinct ids of a batch: dense float32 and
    hashed cat ids, vectorised over the whole batch (a few numpy calls, whatever the
    number of keys). Rows are the stored strings per field ("" = absent field; None =
    absent key). The featurisation is the codec's: features.parse_tokens and
    features.hash_ids for the tokens, and CtrCodec's dense rule (float64, NaN =
    missing, clip at DENSE_CLIP, then float32); the tests compare it to inline."""

    def __init__(self, kind: str, rows: Sequence[list[str] | None]) -> None:
        fields = KIND_FIELDS[kind]
        width = len(fields)
        n_dense = sum(1 for f in fields if f.startswith("I"))
        self.invalid = 0
        blank = [""] * width
        grid = np.array([r if r is not None else blank for r in rows], dtype=object).reshape(len(rows), width)
        self.missing = int((grid == "").all(axis=1).sum())
        self.dense = self._dense(grid[:, :n_dense])
        self.cat = self._cat(grid[:, n_dense:], _FIRST_CAT_FIELD[kind])

    def _dense(self, strings: np.ndarray) -> np.ndarray:
        flat = np.where(strings == "", "nan", strings).ravel()
        try:
            dense = flat.astype(np.float64)  # float() per value, in numpy's C loop
        except ValueError:  # a value that is not a number: find it, count it, skip it
            dense = np.array([self._number(v) for v in flat], dtype=np.float64)
        dense = dense.reshape(strings.shape)
        np.minimum(dense, F.DENSE_CLIP, out=dense)  # the codec's rule: saturate, then cast
        return dense.astype(np.float32)

    def _number(self, value: str) -> float:
        try:
            return float(value)
        except ValueError:
            self.invalid += 1
            return float("nan")

    def _cat(self, strings: np.ndarray, first_field: int) -> np.ndarray:
        tokens = [t or None for t in strings.ravel().tolist()]
        try:
            values, present = F.parse_tokens(tokens)
        except F.HexTokenError:  # a stored token the codec would refuse: drop the bad ones
            values, present = F.parse_tokens([self._token(t) for t in tokens])
        fields = np.arange(first_field, first_field + strings.shape[1])
        return F.hash_ids(values.reshape(strings.shape), present.reshape(strings.shape), fields)

    def _token(self, token: str | None) -> str | None:
        try:
            F.parse_tokens([token])
        except F.HexTokenError:
            self.invalid += 1
            return None
        return token


# One EVALSHA per batch: HMGET of every distinct key, server-side, answered as ONE bulk
# string (keys by "\n", fields by "\t", "" = absent field, "!" = not a hash). Parsing
# one string is ~30x cheaper in Python than the 20 bulk replies per key of a plain
# HMGET pipeline (redis-py's pure-Python RESP parser; measured in docs/REDIS.md).
# Read-only; pcall so one key of the wrong type cannot fail the batch's lookup.
LOOKUP_LUA = r"""
local n_user = tonumber(ARGV[1])
local n_user_fields = tonumber(ARGV[2])
local user_fields, item_fields = {}, {}
for i = 1, n_user_fields do user_fields[i] = ARGV[2 + i] end
for i = 3 + n_user_fields, #ARGV do item_fields[#item_fields + 1] = ARGV[i] end
local out = {}
for i, key in ipairs(KEYS) do
  local fields = item_fields
  if i <= n_user then fields = user_fields end
  local ok, vals = pcall(redis.call, 'HMGET', key, unpack(fields))
  if ok then
    for j = 1, #fields do if not vals[j] then vals[j] = '' end end
    local line = table.concat(vals, '\t')
    if string.find(line, '\n', 1, true) then line = '!' end
    out[i] = line
  else
    out[i] = '!'
  end
end
return table.concat(out, '\n')
"""
LOOKUP_MODES = ("script", "pipeline")


class FeatureLookupHook:
    """WorkerHook: fills the store-sourced columns of CtrIdPayloads with one Redis
    round trip per batch for all distinct keys: one EVALSHA (lookup "script", the
    default) or a pipeline of HMGETs (lookup "pipeline", for servers that forbid
    scripts). Inline-only batches cost nothing."""

    name = "redis-features"

    def __init__(
        self, link: RedisLink, metrics: RedisMetrics, key_prefix: str = "tb:", lookup: str = "script"
    ) -> None:
        if lookup not in LOOKUP_MODES:
            raise ValueError(f"lookup must be one of {LOOKUP_MODES}, got {lookup!r}")
        self.link = link
        self.metrics = metrics
        self.prefix = key_prefix
        self.lookup = lookup
        self._script = link.client.register_script(LOOKUP_LUA)  # no I/O until first use

    def before_inference(self, decoded: Sequence[Decoded]) -> None:
        pending = [
            d.payload for d in decoded if type(d.payload) is CtrIdPayload and not d.payload.filled
        ]
        if not pending:
            return
        t0 = time.perf_counter()
        users = list(dict.fromkeys(p.user_id for p in pending if p.user_id is not None))
        items = list(dict.fromkeys(i for p in pending if p.item_ids is not None for i in p.item_ids))
        fetch = self._fetch_script if self.lookup == "script" else self._fetch_pipeline
        replies = fetch(users, items)
        if replies is None:
            # Redis unavailable: the payloads already hold the "missing" defaults.
            self.metrics.feature_unavailable.labels("user").inc(len(users))
            self.metrics.feature_unavailable.labels("item").inc(len(items))
        else:
            self._fill(pending, users, items, replies)
        for p in pending:
            p.filled = True
        self.metrics.feature_lookup_seconds.observe(time.perf_counter() - t0)

    def after_inference(self, records: Sequence[SourceRecord], docs: list[dict[str, Any]]) -> list[bool]:
        return [True] * len(docs)

    def close(self) -> None:
        pass

    def _keys(self, users: list[str], items: list[str]) -> list[str]:
        return [feature_key(self.prefix, "user", u) for u in users] + [
            feature_key(self.prefix, "item", i) for i in items
        ]

    def _fetch_script(self, users: list[str], items: list[str]) -> list[Any] | None:
        """One EVALSHA for the batch; replies in HMGET shape (None = unusable key).
        After a Redis restart redis-py reloads the script once (NOSCRIPT)."""
        keys = self._keys(users, items)
        args = [len(users), len(USER_FIELDS), *USER_FIELDS, *ITEM_FIELDS]
        reply = self.link.call("features", lambda client: self._script(keys=keys, args=args, client=client))
        if reply is None:
            return None
        lines = reply.split("\n")
        if len(lines) != len(keys):  # a value with a newline slipped through: trust nothing
            return [None] * len(keys)
        widths = [len(USER_FIELDS)] * len(users) + [len(ITEM_FIELDS)] * len(items)
        return [_split_line(line, width) for line, width in zip(lines, widths, strict=True)]

    def _fetch_pipeline(self, users: list[str], items: list[str]) -> list[Any] | None:
        """All HMGETs of the batch in one pipeline: one network round trip."""

        def build(pipe: Any) -> None:
            for uid in users:
                pipe.hmget(feature_key(self.prefix, "user", uid), USER_FIELDS)
            for iid in items:
                pipe.hmget(feature_key(self.prefix, "item", iid), ITEM_FIELDS)

        replies = self.link.run("features", build)
        return None if replies is None else [_hmget_row(r) for r in replies]

    def _fill(self, pending: list[CtrIdPayload], users: list[str], items: list[str], replies: list[Any]) -> None:
        user_table = FeatureTable("user", replies[: len(users)])
        item_table = FeatureTable("item", replies[len(users):])
        self._count("user", len(users), user_table)
        self._count("item", len(items), item_table)
        user_row = {uid: k for k, uid in enumerate(users)}
        item_row = {iid: k for k, iid in enumerate(items)}
        for p in pending:
            if p.user_id is not None:
                k = user_row[p.user_id]
                p.dense[:, :N_USER_DENSE] = user_table.dense[k]
                p.cat[:, :N_USER_CAT] = user_table.cat[k]
            if p.item_ids is not None:
                rows = [item_row[i] for i in p.item_ids]
                p.dense[:, N_USER_DENSE:] = item_table.dense[rows]
                p.cat[:, N_USER_CAT:] = item_table.cat[rows]

    def _count(self, kind: str, looked_up: int, table: FeatureTable) -> None:
        self.metrics.feature_lookups.labels(kind).inc(looked_up)
        if table.missing:
            self.metrics.feature_misses.labels(kind).inc(table.missing)
        if table.invalid:
            self.metrics.feature_invalid.labels(kind).inc(table.invalid)
