"""Inputs of `tidebatch etl`: CTR requests from Parquet, CSV or JSONL files
(pipeline/etl/files.py), or from a Kafka topic range (pipeline/etl/topic.py), read in
chunks and turned into model features (pipeline/etl/features.py) without per-row
Python where the format allows it (docs/ETL.md, "Input files"). Any other pipeline's
requests are decoded by its own codec instead (pipeline/etl/requests.py). This module
holds the flat layout's columns and what every input yields: chunks of features (or
decoded requests) and rejects.

Flat layout (Parquet, CSV, JSONL): one row per candidate item.

    request_id   string, 1..128 chars     required
    item_id      string, non-empty         required
    I1..I13      number or null            raw counts (null / NaN / empty = missing)
    C1..C26      hex string or null        Criteo tokens, 1..16 hex digits ("68fd1e64")
    timestamp_ms int (epoch ms), optional  record time: partitions the output by date/hour
    key          string, optional          e.g. the user id (the Kafka key in the worker)

Rows of one request are consecutive (item_pos counts within a run of equal
request_id). JSONL may instead hold one JSON request per line, exactly as produced to
Kafka (docs/schemas/ctr_request.md); it is decoded by the worker's own codec.

A row that cannot be scored is rejected with a one-line reason (the codec's wording
where it applies), never dropped silently; a column of the wrong type fails the job
with a message naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from models.ctr import features as F
from pipeline.errors import UserError

FEATURES = (*F.DENSE_FIELDS, *F.CAT_FIELDS)
REQUIRED = ("request_id", "item_id", *FEATURES)
OPTIONAL = ("timestamp_ms", "key")


class InputError(UserError):
    """An input the job cannot read at all (one line, names the file and column)."""


@dataclass
class Reject:
    offset: int  # row (or line) number in the input, or the Kafka offset
    reason: str
    value: Any  # the row as read, JSON-ready


@dataclass
class Features:
    """Model feeds and per-row metadata of the valid rows of one chunk."""

    dense: np.ndarray  # float32 [n, 13]
    cat: np.ndarray  # int64 [n, 26]
    request_id: pa.Array
    item_id: pa.Array
    item_pos: np.ndarray  # int32
    offset: np.ndarray  # int64: source offset of each row
    record_ts: pa.Array  # timestamp[ms, UTC], nullable
    part_ts: np.ndarray  # int64 ms: what places the row in date=/hour= directories
    key: pa.Array
    priority: pa.Array
    tenant: pa.Array

    @property
    def rows(self) -> int:
        return len(self.offset)


@dataclass
class Chunk:
    index: int
    first: int  # first offset the chunk covers
    next: int  # offset where the next chunk starts (what a checkpoint records)
    rows_in: int  # rows (or records) read
    payload: Any  # Features (ctr), or Requests (any other pipeline: pipeline/etl/requests.py)
    rejects: list[Reject] = field(default_factory=list)
    fraction: float | None = None  # of the input consumed after this chunk, when known
