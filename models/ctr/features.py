"""Criteo-shaped feature definition of the CTR model, shared by training and serving.

numpy only: the serving codec imports this module, and so does the offline build, so
that the categorical hashing is *the same code* on both sides.

Features
--------
13 dense features I1..I13 (non-negative counts, may be missing) and 26 categorical
features C1..C26 (Criteo-style 8-hex-digit tokens such as "68fd1e64", may be missing).
A request carries them the way a ranking request does:

* ``context`` (user / device / site, one per request): I1-I6 and C1-C13
* each candidate item: ``item_id`` plus I7-I13 and C14-C26

Model inputs (column order = field order above):

* ``dense`` float32 [N, 13]: the *raw* counts, NaN where missing. The transform lives in
  the ONNX graph (so the model file is self-contained): ``log1p(clip(x, 0, DENSE_CLIP))``
  with missing -> 0, plus a per-field "is missing" indicator the model sees separately
  (a missing count and a zero count mean different things).
* ``cat`` int64 [N, 26]: hashed ids into one shared embedding table of TABLE_SIZE rows.

Categorical hashing (``hash_ids``), for field f (0-based) and token value v = int(token, 16):

    h  = ((v XOR SALT[f]) * 0x9E3779B97F4A7C15  mod 2**64) >> 32        # 32 bits
    id = N_RESERVED + (h * (TABLE_SIZE - N_RESERVED)) >> 32              # range reduction

A missing token maps to the reserved id ``f`` (ids 0..25 are never produced by the
hash), so "missing" is learnt per field. SALT[f] are splitmix64 outputs of
(SALT_SEED, f), written out in spec.json.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

N_DENSE = 13
N_CAT = 26
DENSE_FIELDS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, N_DENSE + 1))
CAT_FIELDS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, N_CAT + 1))

# The split of features between the request context and each candidate item.
CONTEXT_DENSE: tuple[str, ...] = DENSE_FIELDS[:6]  # I1..I6
ITEM_DENSE: tuple[str, ...] = DENSE_FIELDS[6:]  # I7..I13
CONTEXT_CAT: tuple[str, ...] = CAT_FIELDS[:13]  # C1..C13
ITEM_CAT: tuple[str, ...] = CAT_FIELDS[13:]  # C14..C26

HASH_BITS = 16
TABLE_SIZE = 1 << HASH_BITS  # one table shared by all fields: 65536 x 16 floats = 4 MiB
N_RESERVED = N_CAT  # ids 0..25: "field f is missing"
MISSING_IDS: np.ndarray = np.arange(N_CAT, dtype=np.int64)
SALT_SEED = 0x7469646562617463  # "tidebatc"
HASH_MULTIPLIER = 0x9E3779B97F4A7C15  # 2**64 / golden ratio (Fibonacci hashing)
DENSE_CLIP = 1.0e9  # counts above this saturate; log1p(1e9) ~ 20.7

_MASK64 = (1 << 64) - 1
# ASCII only, no prefix, no blanks: int(x, 16) alone would take "٣", "0x1", " 1", "1_0"
_HEX_TOKEN = re.compile(r"[0-9a-fA-F]{1,16}\Z")


def splitmix64(x: int) -> int:
    """One splitmix64 step (Steele et al.); used to derive salts and synthetic tokens."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


FIELD_SALTS: np.ndarray = np.array(
    [splitmix64(SALT_SEED ^ (f + 1)) for f in range(N_CAT)], dtype=np.uint64
)
_MULT = np.uint64(HASH_MULTIPLIER)
_SHIFT32 = np.uint64(32)
_RANGE = np.uint64(TABLE_SIZE - N_RESERVED)
_RESERVED = np.uint64(N_RESERVED)


def hash_ids(
    values: np.ndarray, present: np.ndarray | None = None, fields: np.ndarray | None = None
) -> np.ndarray:
    """Hash token values (uint64) into int64 table ids, vectorised (a handful of numpy
    ops per call, whatever the size). ``fields`` gives each value's field index 0..25 and
    broadcasts against ``values``; by default the last axis is C1, C2, ... in order.
    Where ``present`` is False the id is the field's reserved missing id (= its index)."""
    values = np.asarray(values, dtype=np.uint64)
    if fields is None:
        fields = np.arange(values.shape[-1])
    # uint64 array arithmetic wraps modulo 2**64 by design (no overflow warning for arrays).
    h = values ^ FIELD_SALTS[fields]
    h *= _MULT
    h >>= _SHIFT32
    h *= _RANGE
    h >>= _SHIFT32
    h += _RESERVED
    ids = h.view(np.int64)  # every id is < 2**16: same bits as int64
    if present is not None:
        ids = np.where(present, ids, MISSING_IDS[fields])
    return ids


class HexTokenError(ValueError):
    """A token that is neither None nor 1..16 hexadecimal digits; ``index`` is its
    position in the list given to ``parse_tokens``."""

    def __init__(self, index: int, token: object) -> None:
        super().__init__(f"token {index} is not a hex string or None: {token!r}")
        self.index = index
        self.token = token


# A missing token becomes this 8-character stand-in on the fast path: 'g' is not a hex
# digit, so the count of 'g' in the joined text proves that no real token contains one.
_MISSING_SENTINEL = "g0000000"
_FILL = {None: _MISSING_SENTINEL}
_G = ord("g")
_SPACE = ord(" ")


def parse_tokens(tokens: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
    """(values, present): int(token, 16) as uint64 (0 where missing) and a bool mask,
    for a list of hex tokens or None. Strict: 1..16 ASCII hex digits, else HexTokenError.

    Fast path, the Criteo shape (every token 8 digits), with no per-token Python:
    " ".join (raises TypeError on any non-string, so it doubles as the type check), one
    ``bytes.fromhex`` (which skips the spaces between byte pairs). The joined text must
    be 9m-1 ASCII characters with a space at every 9th position and fromhex must return
    4m bytes: together that proves every token was exactly 8 hex digits."""
    m = len(tokens)
    if m == 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=bool)
    n_missing = tokens.count(None)
    try:
        joined = " ".join(map(_FILL.get, tokens, tokens) if n_missing else tokens)
        text = joined.encode("ascii")
    except (TypeError, UnicodeEncodeError):  # non-string, unhashable or non-ASCII token
        return _parse_tokens_slow(tokens)
    if len(text) == 9 * m - 1 and text.count(b"g") == n_missing:
        chars = np.frombuffer(text, dtype=np.uint8)
        try:
            raw = bytes.fromhex(joined.replace("g", "0") if n_missing else joined)
        except ValueError:
            raw = b""
        if len(raw) == 4 * m and (chars[8::9] == _SPACE).all():
            values = np.frombuffer(raw, dtype=">u4").astype(np.uint64)
            # all 'g's are sentinels; a token is missing iff it starts with one
            present = chars[::9] != _G if n_missing else np.ones(m, dtype=bool)
            return values, present
    return _parse_tokens_slow(tokens)


def _parse_tokens_slow(tokens: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
    values = np.zeros(len(tokens), dtype=np.uint64)
    present = np.ones(len(tokens), dtype=bool)
    match = _HEX_TOKEN.match
    for i, tok in enumerate(tokens):
        if tok is None:
            present[i] = False
        elif type(tok) is str and match(tok):
            values[i] = int(tok, 16)
        else:
            raise HexTokenError(i, tok)
    return values, present


def parse_hex_tokens(tokens: Sequence[str]) -> np.ndarray:
    """int(token, 16) as uint64 for tokens that must all be present."""
    values, present = parse_tokens(list(tokens))
    if not present.all():
        raise HexTokenError(int(np.flatnonzero(~present)[0]), None)
    return values


def dense_transform(dense: np.ndarray) -> np.ndarray:
    """Reference numpy version of the in-graph dense transform: [N,13] raw counts ->
    [N,26] = log1p(clip(x, 0, DENSE_CLIP)) with NaN -> 0, then the 13 missing flags."""
    dense = np.asarray(dense, dtype=np.float32)
    missing = np.isnan(dense)
    x = np.log1p(np.clip(np.where(missing, 0.0, dense), 0.0, DENSE_CLIP))
    return np.concatenate([x, missing.astype(np.float32)], axis=-1).astype(np.float32)
