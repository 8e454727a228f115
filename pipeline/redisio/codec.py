"""CtrIdCodec: the CTR codec, plus requests that carry ids instead of features.

An *inline* request (docs/schemas/ctr_request.md) decodes exactly as CtrCodec decodes
it: this class calls CtrCodec.decode first and only looks further when that refuses
the request. An *id* request leaves features to the feature store:

    {"request_id": "r1", "user_id": "u42",          context absent or null ->
     "items": ["i7", "i9", "i13"]}                   user features from tb:user:u42;
                                                     items as id strings ->
                                                     item features from tb:item:<id>

Either half may still be inline: `"context": {...}` with id items, or a missing
context with inline item objects. A request is id or inline per half, never per
feature: an absent feature inside an inline object means "missing", as in CtrCodec.

The parts that come from the store start as the codec's own "missing" encoding (dense
NaN, cat = the field's reserved missing id); FeatureLookupHook (features.py) fills them
in before inference, one Redis round trip per batch. The inline parts are read and
featurised by CtrCodec's own helpers (pipeline/codecs/ctr_fields.py, ctr_features.py),
so both paths are the same code.

The worker gets this codec when `redis.features.enabled`: the composition root
(pipeline/app/compose.py) puts `id_request_codec`'s answer in place of the CTR
pipeline's CtrCodec, before the warm-up profile runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.ctr import features as F
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.codecs.ctr import CtrCodec, CtrPayload
from pipeline.codecs.ctr_features import featurise_cat, featurise_dense
from pipeline.codecs.ctr_fields import (
    items_list,
    parse_json,
    read_item_ids,
    read_meta,
    read_request_id,
    type_name,
)

N_USER_DENSE = len(F.CONTEXT_DENSE)  # dense columns [0, 6) come from the user / context
N_USER_CAT = len(F.CONTEXT_CAT)  # cat columns [0, 13) likewise


@dataclass(slots=True)
class CtrIdPayload(CtrPayload):
    """A CtrPayload whose user and/or item columns still have to come from the store."""

    user_id: str | None = None  # set: columns of the user come from tb:user:<user_id>
    item_ids: list[str] | None = None  # set: row k's item columns come from tb:item:<item_ids[k]>
    filled: bool = False  # the feature hook has been over it (store values or defaults)


class CtrIdCodec(CtrCodec):
    """CtrCodec that also accepts id-only requests (features from the store)."""

    name = "ctr"

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> Decoded:
        try:
            return super().decode(value, headers)
        except DecodeError:
            doc = parse_json(value)
            if not _wants_store(doc):
                raise
        assert value is not None  # parse_json refused None
        return self._decode_ids(doc, value)

    def _decode_ids(self, doc: dict[str, Any], raw: bytes) -> Decoded:
        request_id = read_request_id(doc)
        priority, deadline_ms, tenant = read_meta(doc, raw)
        user_id = doc.get("user_id")
        context = doc.get("context")
        if context is not None and type(context) is not dict:
            raise DecodeError(f"context: expected object or null, got {type_name(context)}")
        if context is None and not user_id:
            raise DecodeError("user_id: required when 'context' is absent (user features come from the feature store)")
        items = self._items(doc)
        n = len(items)
        dense = np.full((n, F.N_DENSE), np.nan, dtype=np.float32)
        cat = np.empty((n, F.N_CAT), dtype=np.int64)
        cat[:] = F.MISSING_IDS
        if context is not None:
            # one all-missing item row: the context columns are what we keep
            dense[:, :N_USER_DENSE] = featurise_dense(context, [{}])[0, :N_USER_DENSE]
            cat[:, :N_USER_CAT] = featurise_cat(context, [{}])[0, :N_USER_CAT]
        store_items = type(items[0]) is str
        if store_items:
            item_ids = items
        else:
            item_ids = read_item_ids(items)
            dense[:, N_USER_DENSE:] = featurise_dense({}, items)[:, N_USER_DENSE:]
            cat[:, N_USER_CAT:] = featurise_cat({}, items)[:, N_USER_CAT:]
        payload = CtrIdPayload(
            dense,
            cat,
            user_id=user_id if context is None else None,
            item_ids=list(item_ids) if store_items else None,
        )
        extra: dict[str, Any] = {"item_ids": item_ids}
        if user_id:
            extra["user_id"] = user_id
        return Decoded(
            request_id=request_id,
            rows=n,
            payload=payload,
            priority=priority,
            deadline_ms=deadline_ms,
            tenant=tenant,
            extra=extra,
        )

    def _items(self, doc: dict[str, Any]) -> list[Any]:
        """The items list of an id request: all id strings or all inline objects."""
        items = items_list(doc, self.max_items)
        first = type(items[0])
        if first not in (str, dict):
            raise DecodeError(f"items[0]: expected item id string or object, got {type_name(items[0])}")
        for i, item in enumerate(items):
            if type(item) is not first:
                want = "item id string" if first is str else "object"
                raise DecodeError(f"items[{i}]: expected {want} like items[0], got {type_name(item)}")
            if first is str and not item:
                raise DecodeError(f"items[{i}]: expected non-empty item id, got ''")
        return items


def id_request_codec(codec: Any) -> CtrIdCodec | None:
    """The codec that decodes what `codec` does and id requests too: CtrIdCodec for the
    CTR codec (inline requests decode identically), the codec itself if it is one
    already; None for any other codec (feature lookup is CTR only)."""
    if isinstance(codec, CtrIdCodec):
        return codec
    if type(codec) is CtrCodec:
        return CtrIdCodec(max_items=codec.max_items)
    return None


def _wants_store(doc: dict[str, Any]) -> bool:
    """Does this request ask for store features (context absent/null, or id items)?"""
    if doc.get("context") is None:
        return True
    items = doc.get("items")
    return type(items) is list and any(type(item) is str for item in items)
