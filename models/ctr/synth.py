"""The synthetic Criteo-shaped world the CTR model is trained on and load-tested with.

numpy only. The offline build (models/ctr/build.py) draws its training rows here and
the load generator (pipeline/loadgen/ctr.py) draws its requests here, so the traffic a
worker sees comes from the same distributions the model was fitted to.

Entities and fields
-------------------
* users: N_USERS, popularity Zipf(s=0.9); ``user_id`` = "u" + 8 hex digits.
* items: N_ITEMS, popularity Zipf(s=1.0); ``item_id`` = "it" + 8 hex digits.
* each categorical field has a vocabulary of V values whose frequency is Zipf(s) over
  value ranks 0..V-1, a missing probability, and a *binding*:
    - "user"       C1-C5:   a fixed attribute of the user (same on every request)
    - "request"    C6-C13:  drawn per request (site, app, device, hour, ...)
    - "item"       C14-C20: a fixed attribute of the item (advertiser, category, ...)
    - "impression" C21-C26: drawn per (request, item) pair (slot, creative, ...)
  A bound attribute is a deterministic hash of (field, entity) pushed through the
  field's Zipf inverse CDF, so its marginal over traffic is still ~Zipf.
* a value's token is ``splitmix64(WORLD_SEED, field, rank) & 0xffffffff`` printed as 8
  hex digits, the look of Criteo's anonymised tokens.
* dense counts: floor(lognormal(mu, sigma)), missing with a per-field probability
  (I1-I6 per request, I7-I13 per impression).

Everything here is a pure function of its inputs and the generator passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.ctr.features import CAT_FIELDS, DENSE_FIELDS, N_CAT, N_DENSE, splitmix64

WORLD_SEED = 20240917
N_USERS = 1_000_000
USER_ZIPF_S = 0.9
N_ITEMS = 100_000
ITEM_ZIPF_S = 1.0


@dataclass(frozen=True, slots=True)
class CatFieldSpec:
    vocab: int
    zipf_s: float
    p_missing: float
    binding: str  # "user" | "request" | "item" | "impression"


@dataclass(frozen=True, slots=True)
class DenseFieldSpec:
    mu: float
    sigma: float
    p_missing: float


# Vocabulary sizes, skews and missing rates loosely follow the Criteo display-ads data
# (a few tiny fields, several 10^3..10^4 ones, some 35-75 % missing).
CAT_SPECS: tuple[CatFieldSpec, ...] = (
    CatFieldSpec(1_000, 1.10, 0.00, "user"),  # C1
    CatFieldSpec(500, 1.05, 0.00, "user"),  # C2
    CatFieldSpec(20_000, 1.10, 0.35, "user"),  # C3
    CatFieldSpec(8_000, 1.10, 0.03, "user"),  # C4
    CatFieldSpec(30, 1.20, 0.00, "user"),  # C5
    CatFieldSpec(10, 1.30, 0.12, "request"),  # C6
    CatFieldSpec(5_000, 1.05, 0.00, "request"),  # C7
    CatFieldSpec(500, 1.20, 0.00, "request"),  # C8
    CatFieldSpec(3, 1.50, 0.00, "request"),  # C9
    CatFieldSpec(20_000, 1.05, 0.00, "request"),  # C10
    CatFieldSpec(3_000, 1.10, 0.00, "request"),  # C11
    CatFieldSpec(30_000, 1.10, 0.35, "request"),  # C12
    CatFieldSpec(2_000, 1.10, 0.00, "request"),  # C13
    CatFieldSpec(30, 1.20, 0.00, "item"),  # C14
    CatFieldSpec(3_000, 1.10, 0.00, "item"),  # C15
    CatFieldSpec(30_000, 1.10, 0.03, "item"),  # C16
    CatFieldSpec(10, 1.30, 0.00, "item"),  # C17
    CatFieldSpec(4_000, 1.10, 0.00, "item"),  # C18
    CatFieldSpec(2_000, 1.10, 0.45, "item"),  # C19
    CatFieldSpec(15, 1.30, 0.45, "item"),  # C20
    CatFieldSpec(30_000, 1.10, 0.03, "impression"),  # C21
    CatFieldSpec(20, 1.20, 0.75, "impression"),  # C22
    CatFieldSpec(15, 1.30, 0.00, "impression"),  # C23
    CatFieldSpec(10_000, 1.10, 0.03, "impression"),  # C24
    CatFieldSpec(100, 1.20, 0.45, "impression"),  # C25
    CatFieldSpec(8_000, 1.10, 0.45, "impression"),  # C26
)
DENSE_SPECS: tuple[DenseFieldSpec, ...] = (
    DenseFieldSpec(0.5, 1.2, 0.45),  # I1
    DenseFieldSpec(1.5, 1.5, 0.00),  # I2
    DenseFieldSpec(2.0, 1.3, 0.20),  # I3
    DenseFieldSpec(1.5, 1.0, 0.20),  # I4
    DenseFieldSpec(7.0, 2.0, 0.03),  # I5
    DenseFieldSpec(3.0, 1.5, 0.22),  # I6
    DenseFieldSpec(1.5, 1.3, 0.04),  # I7
    DenseFieldSpec(2.5, 1.0, 0.00),  # I8
    DenseFieldSpec(3.5, 1.2, 0.04),  # I9
    DenseFieldSpec(0.3, 0.7, 0.45),  # I10
    DenseFieldSpec(1.0, 1.0, 0.04),  # I11
    DenseFieldSpec(0.2, 1.0, 0.77),  # I12
    DenseFieldSpec(2.0, 1.2, 0.20),  # I13
)
assert len(CAT_SPECS) == N_CAT and len(DENSE_SPECS) == N_DENSE

CONTEXT_CAT_IDX = np.arange(0, 13)
ITEM_CAT_IDX = np.arange(13, 26)
CONTEXT_DENSE_IDX = np.arange(0, 6)
ITEM_DENSE_IDX = np.arange(6, 13)

_M64 = np.uint64
_GOLDEN = _M64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> _M64(30))) * _M64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _M64(27))) * _M64(0x94D049BB133111EB)
    return x ^ (x >> _M64(31))


def _stream_key(*parts: int) -> np.uint64:
    key = WORLD_SEED
    for p in parts:
        key = splitmix64(key ^ p)
    return _M64(key)


def _u01(x: np.ndarray) -> np.ndarray:
    """uint64 -> uniform [0, 1) from the top 53 bits."""
    return (x >> _M64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _zipf_cdf(n: int, s: float) -> np.ndarray:
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(w)
    return cdf / cdf[-1]


class World:
    """Samplers for the synthetic world; holds the Zipf CDF tables (built once, ~0.1 s)."""

    def __init__(self) -> None:
        self.user_cdf = _zipf_cdf(N_USERS, USER_ZIPF_S)
        self.item_cdf = _zipf_cdf(N_ITEMS, ITEM_ZIPF_S)
        # All 26 value CDFs in one sorted array, field f's shifted by +f: one
        # searchsorted over u + f then draws every field of every row at once.
        cdfs = [_zipf_cdf(s.vocab, s.zipf_s) + f for f, s in enumerate(CAT_SPECS)]
        self.cat_cdf = np.concatenate(cdfs)
        self.cat_offset = np.cumsum([0] + [len(c) for c in cdfs[:-1]])
        self.vocab = np.array([s.vocab for s in CAT_SPECS])
        self.cat_p_missing = np.array([s.p_missing for s in CAT_SPECS])
        self.bound = np.array([s.binding in ("user", "item") for s in CAT_SPECS])
        self.value_key = np.array([_stream_key(1, f) for f in range(N_CAT)], dtype=np.uint64)
        self.missing_key = np.array([_stream_key(2, f) for f in range(N_CAT)], dtype=np.uint64)
        self.dense_mu = np.array([s.mu for s in DENSE_SPECS])
        self.dense_sigma = np.array([s.sigma for s in DENSE_SPECS])
        self.dense_p_missing = np.array([s.p_missing for s in DENSE_SPECS])

    # -- entities --------------------------------------------------------------------
    def draw_users(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.searchsorted(self.user_cdf, rng.random(n), side="right")

    def draw_items(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.searchsorted(self.item_cdf, rng.random(n), side="right")

    # -- categorical ranks (-1 = missing) ----------------------------------------------
    def cat_ranks(
        self, rng: np.random.Generator, fields: np.ndarray, entity: np.ndarray
    ) -> np.ndarray:
        """Value ranks, -1 where missing, shape [n, k]. ``fields`` ([k], or [n, k] when
        rows mix context and item fields) is each cell's field index; ``entity`` [n] is
        the row's user or item rank, which fixes the user/item-bound attributes."""
        entity = np.asarray(entity)
        fields = np.asarray(fields)
        shape = (len(entity), fields.shape[-1])
        u = rng.random(shape)
        miss_u = rng.random(shape)
        bound = self.bound[fields]
        if bound.any():
            # bound attributes: a fixed function of (field, entity) instead of the draw
            e = entity.astype(np.uint64)[:, None]
            h = _u01(_mix64(np.stack([e ^ self.value_key[fields], e ^ self.missing_key[fields]])))
            u = np.where(bound, h[0], u)
            miss_u = np.where(bound, h[1], miss_u)
        idx = np.searchsorted(self.cat_cdf, u + fields, side="right")
        ranks = np.minimum(idx - self.cat_offset[fields], self.vocab[fields] - 1)
        return np.where(miss_u < self.cat_p_missing[fields], -1, ranks)

    def dense_counts(self, rng: np.random.Generator, fields: np.ndarray, n: int) -> np.ndarray:
        """[n, len(fields)] float64 counts, NaN where missing."""
        k = len(fields)
        z = rng.standard_normal((n, k))
        counts = np.floor(np.exp(self.dense_mu[fields] + self.dense_sigma[fields] * z))
        return np.where(rng.random((n, k)) < self.dense_p_missing[fields], np.nan, counts)


def token_values(fields: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """uint64 token value (< 2**32) of each (field, rank); ranks [..., len(fields)].
    Missing ranks (-1) give an arbitrary value the caller masks out."""
    f = np.asarray(fields, dtype=np.uint64)
    r = np.asarray(ranks).astype(np.uint64)
    x = _mix64((f << _M64(40)) ^ r ^ _stream_key(3))
    return x & _M64(0xFFFFFFFF)


USER_KIND = 4
ITEM_KIND = 5
_ENTITY_KEYS = {USER_KIND: _stream_key(USER_KIND), ITEM_KIND: _stream_key(ITEM_KIND)}


def entity_tokens(ranks: np.ndarray, is_user: np.ndarray | bool) -> np.ndarray:
    """32-bit opaque token of each user (is_user) or item rank."""
    keys = np.where(is_user, _ENTITY_KEYS[USER_KIND], _ENTITY_KEYS[ITEM_KIND]).astype(np.uint64)
    return _mix64(np.asarray(ranks, dtype=np.uint64) ^ keys) & _M64(0xFFFFFFFF)


def user_id(rank: int) -> str:
    return f"u{int(entity_tokens(np.array([rank]), True)[0]):08x}"


def item_ids(ranks: np.ndarray) -> list[str]:
    return [f"it{v:08x}" for v in entity_tokens(ranks, False).tolist()]


@dataclass(slots=True)
class Rows:
    """Training rows: one (context, item) impression each."""

    users: np.ndarray  # [n] user ranks
    items: np.ndarray  # [n] item ranks
    cat_ranks: np.ndarray  # [n, 26] value ranks, -1 missing
    dense: np.ndarray  # [n, 13] float64 raw counts, NaN missing


def draw_rows(world: World, rng: np.random.Generator, n: int) -> Rows:
    """n independent impressions, each with its own context: the per-row marginal of
    the (context, item) pairs the load generator groups into requests."""
    users = world.draw_users(rng, n)
    items = world.draw_items(rng, n)
    cat = np.empty((n, N_CAT), dtype=np.int64)
    cat[:, :13] = world.cat_ranks(rng, CONTEXT_CAT_IDX, users)
    cat[:, 13:] = world.cat_ranks(rng, ITEM_CAT_IDX, items)
    dense = np.empty((n, N_DENSE), dtype=np.float64)
    dense[:, :6] = world.dense_counts(rng, CONTEXT_DENSE_IDX, n)
    dense[:, 6:] = world.dense_counts(rng, ITEM_DENSE_IDX, n)
    return Rows(users, items, cat, dense)


__all__ = [
    "CAT_FIELDS",
    "CAT_SPECS",
    "DENSE_FIELDS",
    "DENSE_SPECS",
    "Rows",
    "World",
    "draw_rows",
    "entity_tokens",
    "item_ids",
    "token_values",
    "user_id",
]
