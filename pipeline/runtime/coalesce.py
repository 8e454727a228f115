"""Which queued RUN requests the shared model host (model_host.py, host_runner.py) runs
as one ONNX Runtime call, how their inputs join, and how the call's outputs split back
into each request's rows. Pure: arrays and plans in, arrays and plans out.

The rules:
- The next call starts with the oldest queued request (FIFO) and takes the requests
  right behind it that are for the same model (handle) while their rows fit in
  max_rows. It never reaches past a request for another model: that one would then
  wait for requests that came after it, and the host knows nothing of deadlines except
  that order. With one model (the usual case: N workers of one pipeline), every
  request queued when the model frees goes into the next call.
- Requests join only where every input is a numeric array whose first dimension is
  the request's row count, and the requests agree on input names, dtypes and the
  other dimensions (`joinable`).
- The call's outputs split back only where each is a numeric array whose first
  dimension is the call's row count (`split`); otherwise (a model with a fixed batch
  size, outputs that are not per row, string tensors, a ZipMap's maps) the host runs
  the requests one by one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Queued:
    """What the planner needs to know of one queued request."""

    handle: int  # the model (session) it is for
    rows: int | None  # its row count; None: its inputs cannot join others'


def take(queue: Iterable[Queued], max_rows: int) -> int:
    """How many requests from the head of `queue` (oldest first, not empty) the next
    call runs: the head, then those right behind it for the same handle while the
    total stays within max_rows (a head bigger than max_rows runs alone)."""
    items = iter(queue)
    head = next(items)
    if head.rows is None:
        return 1
    count, total = 1, head.rows
    for q in items:
        if q.handle != head.handle or q.rows is None or total + q.rows > max_rows:
            break
        count, total = count + 1, total + q.rows
    return count


def _numeric(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biufc" and value.ndim >= 1


def rows_of(feeds: Mapping[str, Any]) -> int | None:
    """The request's row count: the first dimension every input shares; None when an
    input is not a numeric array or the first dimensions differ."""
    firsts = {v.shape[0] if _numeric(v) else None for v in feeds.values()}
    if len(firsts) != 1:
        return None
    return firsts.pop()


def joinable(requests: Sequence[Mapping[str, np.ndarray]]) -> str | None:
    """None when these requests' inputs concatenate along axis 0, else why not."""
    first = requests[0]
    for other in requests[1:]:
        if list(other) != list(first):
            return f"their inputs differ: {list(first)} and {list(other)}"
        for name, a in first.items():
            b = other[name]
            if a.dtype != b.dtype or a.shape[1:] != b.shape[1:]:
                return f"input {name!r} is {a.dtype}{list(a.shape)} in one request, {b.dtype}{list(b.shape)} in another"
    return None


def join(requests: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The requests' inputs concatenated along axis 0, in request order."""
    return {name: np.concatenate([r[name] for r in requests]) for name in requests[0]}


def split(outputs: Mapping[str, Any], rows: Sequence[int]) -> list[dict[str, np.ndarray]] | str:
    """Each request's own rows of the call's outputs (views), in request order; or,
    when an output is not per row, why not (one line)."""
    total = sum(rows)
    for name, value in outputs.items():
        if not _numeric(value):
            kind = f"a {value.dtype} array" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
            return f"output {name!r} is {kind}, not a numeric array per row"
        if value.shape[0] != total:
            return f"output {name!r} has {value.shape[0]} rows for {total} input rows"
    bounds = np.cumsum(rows)[:-1].tolist()
    parts: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for name, value in outputs.items():
        for part, piece in zip(parts, np.split(value, bounds), strict=True):
            part[name] = piece
    return parts
