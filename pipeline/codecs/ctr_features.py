"""The ctr model's arrays from a request's checked fields (see models/ctr/features.py):
``dense`` float32 [n,13] raw counts with NaN for missing, ``cat`` int64 [n,26] hashed
ids, context columns repeated on every item row. ``featurise_dense`` and
``featurise_cat`` build them for one JSON request, and name the first bad feature value
when a type check fails; ``featurise_binary`` builds them for many binary requests at
once (ctr_binary.py), with one hash for all.

On the hot path (ctr.py, "Speed"): per-value work stays in C, and the per-value error
search runs only once a request is known to be invalid.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from models.ctr import features as F
from pipeline.codecs import ctr_binary
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.codecs.ctr_fields import BinaryHeader, type_name

_N_CTX_CAT = len(F.CONTEXT_CAT)  # 13
_N_ITEM_CAT = len(F.ITEM_CAT)  # 13
_N_CTX_DENSE = len(F.CONTEXT_DENSE)  # 6
_N_ITEM_DENSE = len(F.ITEM_DENSE)  # 7
_NUMBER_TYPES = frozenset({int, float, type(None)})


@dataclass(slots=True)
class CtrPayload:
    dense: np.ndarray  # float32 [n, 13], NaN = missing
    cat: np.ndarray  # int64 [n, 26]


def _short(value: str, limit: int = 40) -> str:
    return repr(value) if len(value) <= limit else repr(value[: limit - 3]) + "..."


# ---------------------------------------------------------------------------- JSON requests
def featurise_dense(context: dict[str, Any], items: list[dict[str, Any]]) -> np.ndarray:
    """dense [n, 13]: 6 context counts then 7 per item; a value not a number or null is
    refused."""
    ctx_vals = list(map(context.get, F.CONTEXT_DENSE))
    item_vals = list(chain.from_iterable(map(it.get, F.ITEM_DENSE) for it in items))
    ctx_types = set(map(type, ctx_vals))
    item_types = set(map(type, item_vals))
    if not ctx_types <= _NUMBER_TYPES:
        raise _first_bad(context, "context", F.CONTEXT_DENSE, "number or null")
    if not item_types <= _NUMBER_TYPES:
        raise _first_bad_item(items, F.ITEM_DENSE, "number or null")
    n = len(items)
    # Only a float can overflow float32 (orjson ints are < 2**64 < 3.4e38), so counts
    # sent as ints go straight to float32; np.array turns None into NaN ("missing").
    wide = float in ctx_types or float in item_types
    dense = np.empty((n, F.N_DENSE), dtype=np.float64 if wide else np.float32)
    dense[:, :_N_CTX_DENSE] = np.array(ctx_vals, dtype=dense.dtype)
    dense[:, _N_CTX_DENSE:] = np.array(item_vals, dtype=dense.dtype).reshape(n, _N_ITEM_DENSE)
    if not wide:
        return dense
    # clip before the float32 cast so absurd values saturate instead of overflowing to inf
    # (NaN passes through; the graph clips negatives to 0 anyway)
    np.clip(dense, -F.DENSE_CLIP, F.DENSE_CLIP, out=dense)
    return dense.astype(np.float32)


@functools.lru_cache(maxsize=256)
def _field_layout(n: int) -> np.ndarray:
    """Field index of each token in the flat list of a request with n items."""
    return np.concatenate([np.arange(_N_CTX_CAT), np.tile(np.arange(_N_CTX_CAT, F.N_CAT), n)])


def featurise_cat(context: dict[str, Any], items: list[dict[str, Any]]) -> np.ndarray:
    """cat [n, 26]: 13 context tokens then 13 per item, hashed; a value not a hex string
    or null is refused."""
    # one flat list: 13 context tokens, then 13 per item (row-major); one parse, one hash
    toks = list(map(context.get, F.CONTEXT_CAT))
    toks.extend(chain.from_iterable(map(it.get, F.ITEM_CAT) for it in items))
    try:
        values, present = F.parse_tokens(toks)  # also the type check
    except F.HexTokenError as exc:
        raise _bad_token(exc) from None
    return _cat_matrix(values, present, len(items))


def _cat_matrix(values: np.ndarray, present: np.ndarray, n: int) -> np.ndarray:
    """[n, 26] hashed ids from 13 context tokens then 13 per item (flat, row-major)."""
    ids = F.hash_ids(values, present, _field_layout(n))
    cat = np.empty((n, F.N_CAT), dtype=np.int64)
    cat[:, :_N_CTX_CAT] = ids[:_N_CTX_CAT]
    cat[:, _N_CTX_CAT:] = ids[_N_CTX_CAT:].reshape(n, _N_ITEM_CAT)
    return cat


# ---------------------------------------------------------------------------- binary requests
def featurise_binary(requests: list[tuple[int, BinaryHeader, ctr_binary.BinaryParts]]) -> list[Decoded]:
    """Model rows for checked binary requests: each field of all requests joined into
    one array, context columns repeated onto their items' rows, one hash for all; each
    request's payload is a row slice of the shared arrays."""
    counts = np.fromiter((len(h.item_ids) for _, h, _ in requests), dtype=np.intp, count=len(requests))
    total = int(counts.sum())

    def joined(field: int, dtype: str, width: int) -> np.ndarray:
        return np.frombuffer(b"".join([p[field] for _, _, p in requests]), dtype).reshape(-1, width)

    tokens = np.empty((total, F.N_CAT), dtype=np.uint64)
    tokens[:, :_N_CTX_CAT] = np.repeat(joined(0, "<u8", _N_CTX_CAT), counts, axis=0)
    tokens[:, _N_CTX_CAT:] = joined(1, "<u8", _N_ITEM_CAT)
    present = np.empty((total, F.N_CAT), dtype=np.bool_)
    present[:, :_N_CTX_CAT] = np.repeat(joined(4, "|b1", _N_CTX_CAT), counts, axis=0)
    present[:, _N_CTX_CAT:] = joined(5, "|b1", _N_ITEM_CAT)
    cat = F.hash_ids(tokens, present)
    # No clip here, unlike JSON floats (which must not overflow the float32 cast):
    # these already are float32, and the graph clips counts to DENSE_CLIP itself.
    dense = np.empty((total, F.N_DENSE), dtype=np.float32)
    dense[:, :_N_CTX_DENSE] = np.repeat(joined(2, "<f4", _N_CTX_DENSE), counts, axis=0)
    dense[:, _N_CTX_DENSE:] = joined(3, "<f4", _N_ITEM_DENSE)
    out: list[Decoded] = []
    at = 0
    for _, head, _ in requests:
        n = len(head.item_ids)
        out.append(
            Decoded(
                request_id=head.request_id,
                rows=n,
                payload=CtrPayload(dense[at : at + n], cat[at : at + n]),
                priority=head.priority,
                deadline_ms=head.deadline_ms,
                tenant=head.tenant,
                extra={"item_ids": head.item_ids},
            )
        )
        at += n
    return out


# ---------------------------------------------------------------------------- error paths
def _first_bad(obj: dict[str, Any], where: str, keys: Sequence[str], expected: str) -> DecodeError:
    for key in keys:
        v = obj.get(key)
        if type(v) not in _NUMBER_TYPES:
            return DecodeError(f"{where}.{key}: expected {expected}, got {type_name(v)}")
    raise AssertionError("no bad value found")


def _first_bad_item(items: list[dict[str, Any]], keys: Sequence[str], expected: str) -> DecodeError:
    for i, it in enumerate(items):
        for key in keys:
            v = it.get(key)
            if type(v) not in _NUMBER_TYPES:
                return DecodeError(f"items[{i}].{key}: expected {expected}, got {type_name(v)}")
    raise AssertionError("no bad value found")


def _bad_token(exc: F.HexTokenError) -> DecodeError:
    """Name the field of the bad token from its position in the flat token list."""
    pos = exc.index
    if pos < _N_CTX_CAT:
        where = f"context.{F.CONTEXT_CAT[pos]}"
    else:
        i, j = divmod(pos - _N_CTX_CAT, _N_ITEM_CAT)
        where = f"items[{i}].{F.ITEM_CAT[j]}"
    token = exc.token
    if type(token) is not str:
        got = type_name(token)
    else:
        got = "''" if token == "" else _short(token)
    return DecodeError(f"{where}: expected hex string or null, got {got}")
