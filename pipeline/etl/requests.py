"""`tidebatch etl` for every pipeline but ctr (docs/ETL.md, "Any pipeline"): requests
decoded by the pipeline's own codec, as the worker decodes them (one per line of a file,
or one per record of a topic range: pipeline/etl/topic.py), scored through the worker's
scoring step (pipeline/scoring.py: collate, the model, split; a batch the model refuses
is re-run request by request) and written by pipeline/etl/writer.py as the rows the
worker's Parquet sink writes for that pipeline.

The ctr pipeline keeps its own path (pipeline/etl/features.py): flat tables and a
vectorised featurisation that per-request decoding could not match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from pipeline.codecs.base import Codec, Decoded, decode_all
from pipeline.delivery.outcomes import decode_reason
from pipeline.etl.files import LinesPayload
from pipeline.etl.inputs import Chunk, Reject
from pipeline.scoring import ScoringStep, score_batch

_VALUE_CHARS = 1000  # of a request kept in its reject line


@dataclass
class Requests:
    """The decoded requests of one chunk and where each came from."""

    decoded: list[Decoded]
    offset: np.ndarray  # int64: line number or Kafka offset of each request
    key: list[bytes | None]  # the Kafka key (files: a JSON request's user_id)
    record_ts: list[int | None]  # Kafka timestamp (files: a JSON request's timestamp_ms)
    part_ts: np.ndarray  # int64 ms: what places the row in date=/hour= directories
    value: list[Any]  # as read, for the reject of a request the model refuses

    @classmethod
    def of(
        cls,
        decoded: list[Decoded],
        offsets: list[int],
        keys: list[bytes | None],
        stamps: list[int | None],
        values: list[Any],
        fallback_ts: int = 0,
    ) -> Requests:
        """A topic chunk's payload (pipeline/etl/topic.py Assemble), and a file's."""
        part = np.array([fallback_ts if t is None else t for t in stamps], dtype=np.int64)
        return cls(decoded, np.asarray(offsets, dtype=np.int64), keys, stamps, part, values)

    @property
    def rows(self) -> int:
        return len(self.decoded)


def line_requests(codec: Codec, fallback_ts: int) -> LinesPayload:
    """The payload of a chunk of a request file's lines (pipeline/etl/files.py
    line_chunks): each non-blank line is one request value, as `tidebatch produce
    --file` sends it, decoded by `codec`; a blank line is no request. A JSON object's
    `user_id` (a string) becomes the row's key and its `timestamp_ms` (an int) its
    record time; rows without one are placed by `fallback_ts` (the file's mtime)."""

    def payload(lines: list[bytes], first: int) -> tuple[Requests, list[Reject]]:
        kept: list[tuple[int, bytes]] = [(first + k, line.strip()) for k, line in enumerate(lines) if line.strip()]
        outcomes = decode_all(codec, [(value, {}) for _, value in kept])
        ok: list[Decoded] = []
        offsets: list[int] = []
        keys: list[bytes | None] = []
        stamps: list[int | None] = []
        values: list[Any] = []
        rejects: list[Reject] = []
        for (offset, value), decoded in zip(kept, outcomes, strict=True):
            doc = _json_object(value)
            shown = doc if doc is not None else value.decode("utf-8", "replace")[:_VALUE_CHARS]
            if isinstance(decoded, Exception):  # the reason the worker's dead letter gives
                rejects.append(Reject(offset, decode_reason(decoded), shown))
                continue
            user, ts = (doc.get("user_id"), doc.get("timestamp_ms")) if doc is not None else (None, None)
            ok.append(decoded)
            offsets.append(offset)
            keys.append(user.encode() if isinstance(user, str) else None)
            stamps.append(ts if type(ts) is int else None)
            values.append(shown)
        return Requests.of(ok, offsets, keys, stamps, values, fallback_ts), rejects

    return payload


def _json_object(value: bytes) -> dict[str, Any] | None:
    if not value.startswith(b"{"):
        return None
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return doc if type(doc) is dict else None


# ----------------------------------------------------------------------------- scoring
@dataclass
class ScoredRequests:
    """A chunk's requests through the model: each one's result (None where the model
    refused it), the rows of the ONNX Runtime call that scored it, and the refusals."""

    results: list[dict[str, Any] | None]
    batch_rows: list[int]
    rejects: list[Reject] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(r is not None for r in self.results)


class RequestScorer:
    """The worker's scoring step over a chunk: requests of one shape bucket share a
    call (Decoded.bucket, as the worker's batcher), up to `batch_rows` rows per call
    (a larger request gets a call of its own); batches formed in input order, so a
    rerun makes the same calls."""

    def __init__(self, step: ScoringStep, batch_rows: int) -> None:
        self.step = step
        self.batch_rows = batch_rows

    def score(self, chunk: Chunk) -> ScoredRequests:
        reqs: Requests = chunk.payload
        out = ScoredRequests([None] * reqs.rows, [0] * reqs.rows)
        for batch in batches(reqs.decoded, self.batch_rows):
            run = score_batch(self.step, [reqs.decoded[i] for i in batch])
            if run.singles is None:
                assert run.results is not None
                rows = sum(reqs.decoded[i].rows for i in batch)
                for i, result in zip(batch, run.results, strict=True):
                    out.results[i], out.batch_rows[i] = result, rows
                continue
            for i, single in zip(batch, run.singles, strict=True):
                if single.result is None:
                    out.rejects.append(Reject(int(reqs.offset[i]), single.error or "model error", reqs.value[i]))
                else:
                    out.results[i], out.batch_rows[i] = single.result, reqs.decoded[i].rows
        return out


def batches(decoded: Sequence[Decoded], max_rows: int) -> list[list[int]]:
    """Indices of the requests of each call: one bucket per call, at most `max_rows`
    rows (at least one request), in order of each bucket's first request."""
    open_: dict[Any, list[int]] = {}
    rows: dict[Any, int] = {}
    done: list[list[int]] = []
    for i, d in enumerate(decoded):
        current = open_.get(d.bucket)
        if current is not None and rows[d.bucket] + d.rows > max_rows:
            done.append(current)
            current = None
        if current is None:
            current = open_[d.bucket] = []
            rows[d.bucket] = 0
        current.append(i)
        rows[d.bucket] += d.rows
    done.extend(open_.values())
    return sorted(done, key=lambda b: b[0])
