"""CTR requests as flat input files for `tidebatch etl` (one row per item; layout in
pipeline/etl/inputs.py and docs/ETL.md), from the same deterministic request factory
the load generator uses, so file rows and Kafka requests score identically."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from models.ctr import features as F
from pipeline.loadgen.ctr import CtrRequestFactory

_CONTEXT = (*F.CONTEXT_DENSE, *F.CONTEXT_CAT)
_ITEM = (*F.ITEM_DENSE, *F.ITEM_CAT)


def flat_rows_table(
    seed: int, min_rows: int, *, start: int = 0, t0_ms: int | None = None, spacing_ms: int = 1000
) -> pa.Table:
    """Whole requests `start, start+1, ...` until at least `min_rows` item rows. With
    `t0_ms`, request i gets timestamp_ms = t0_ms + spacing_ms * i."""
    factory = CtrRequestFactory(seed)
    cols: dict[str, list[Any]] = {c: [] for c in ("request_id", "item_id", "key", *F.DENSE_FIELDS, *F.CAT_FIELDS)}
    stamps: list[int] = []
    i = start
    rows = 0
    while rows < min_rows:
        doc = factory.make_doc(i)
        ctx = doc["context"]
        n = len(doc["items"])
        cols["request_id"].extend([doc["request_id"]] * n)
        cols["key"].extend([doc["user_id"]] * n)
        for name in _CONTEXT:
            cols[name].extend([ctx.get(name)] * n)
        for it in doc["items"]:
            cols["item_id"].append(it["item_id"])
            for name in _ITEM:
                cols[name].append(it.get(name))
        if t0_ms is not None:
            stamps.extend([t0_ms + spacing_ms * i] * n)
        rows += n
        i += 1
    arrays = {
        name: pa.array(values, pa.float64() if name in F.DENSE_FIELDS else pa.string())
        for name, values in cols.items()
    }
    if t0_ms is not None:
        arrays["timestamp_ms"] = pa.array(stamps, pa.int64())
    return pa.table(arrays)
