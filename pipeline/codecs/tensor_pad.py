"""Ragged sequences for the `tensor-json` codec (tensor_json.py): a dynamic dimension
padded up to a bucket edge, with the model's mask input filled by the codec
(docs/OWN_MODEL.md, "Ragged sequences").

Without it, requests share a batch only when their sequence lengths are equal, so
under load of varied lengths batches stay small. With `pad`, lengths 1..16 share the
16 bucket, 17..32 the 32 one, and so on: as the text pipeline does for its tokens
(pipeline/codecs/text.py). Only with a mask: a model that does not know which
positions are padding would score the padding, and a result would depend on its
bucket; with one, a result equals the model run on the request alone (tested in
tests/unit/own_model/test_ragged.py). Output dimensions of the same name are cut back to the
request's own length, so a per-position output has no padding positions either.

    pad: {dimension: seq, buckets: [16, 32, 64, 128], mask: attention_mask, value: 0}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.codecs.base import DecodeError
from pipeline.runtime.onnx_graph import TensorInfo

KEYS = ("dimension", "buckets", "mask", "value")


@dataclass(frozen=True, slots=True)
class Padding:
    dimension: str  # the graph's name of the dynamic dimension ("seq")
    edges: tuple[int, ...]  # ascending bucket edges
    mask: str  # the model input the codec fills: 1 at a request's positions, 0 at padding
    mask_dtype: np.dtype
    value: float  # what the other inputs are padded with


def padding(config: Mapping[str, Any], inputs: Sequence[TensorInfo]) -> Padding:
    """The entry's `pad` mapping checked against the graph; ValueError (one line,
    naming the key) when it does not fit. The mask defaults to the one input shaped
    [batch, dimension] whose name has "mask" in it."""
    unknown = [k for k in config if k not in KEYS]
    if unknown:
        raise ValueError(f"pad.{unknown[0]}: is not known; use {', '.join(KEYS)}")
    dim = config.get("dimension")
    if not isinstance(dim, str):
        raise ValueError(f"pad.dimension: expected the name of a dynamic dimension, got {dim!r}")
    named = sorted({d for t in inputs for d in (t.shape or ())[1:] if isinstance(d, str)})
    if dim not in named:
        raise ValueError(f"pad.dimension: no input has a dimension {dim!r}; named dynamic dimensions: "
                         f"{', '.join(named) or 'none'}")
    edges = config.get("buckets")
    if (not isinstance(edges, list) or not edges or any(type(e) is not int or e < 1 for e in edges)
            or edges != sorted(set(edges))):
        raise ValueError(f"pad.buckets: expected ascending sizes >= 1, e.g. [16, 32, 64], got {edges!r}")
    value = config.get("value", 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"pad.value: expected a number, got {value!r}")
    shaped = [t for t in inputs if t.shape is not None and len(t.shape) == 2 and t.shape[1] == dim]
    mask = config.get("mask")
    if mask is None:
        guesses = [t.name for t in shaped if "mask" in t.name.lower()]
        if len(guesses) != 1:
            raise ValueError(f"pad.mask: name the model's mask input over {dim!r} (shaped [batch, {dim}]); "
                             f"padding without one would change results")
        mask = guesses[0]
    found = next((t for t in shaped if t.name == mask), None)
    if found is None or found.dtype is None or found.dtype.kind not in "biuf":
        raise ValueError(f"pad.mask: {mask!r} is not a numeric or bool input shaped [batch, {dim}]")
    return Padding(dim, tuple(edges), mask, found.dtype, float(value))


def pad_request(payload: dict[str, np.ndarray], dims: Mapping[str, tuple[int | str, ...]], length: int,
                rows: int, spec: Padding, field: str) -> None:
    """Pad every array of `payload` (leading rows axis; `dims`: input -> its dims after
    it) along the padded dimension up to its bucket's edge, and add the mask. `field`:
    the request field that gave the length, named when it is over the largest bucket."""
    edge = next((e for e in spec.edges if e >= length), None)
    if edge is None:
        raise DecodeError(f"{field}: dimension {spec.dimension!r} has size {length}, "
                          f"over the largest bucket ({spec.edges[-1]})")
    for name, arr in payload.items():
        widths = [(0, 0)] + [(0, edge - length) if d == spec.dimension else (0, 0) for d in dims[name]]
        if edge > length:
            payload[name] = np.pad(arr, widths, constant_values=_fill(arr.dtype, spec.value))
    mask = np.zeros((rows, edge), dtype=spec.mask_dtype)
    mask[:, :length] = 1
    payload[spec.mask] = mask


def length_of(payload: Mapping[str, np.ndarray], spec: Padding) -> int:
    """A padded request's own length, from its mask."""
    return int(np.count_nonzero(payload[spec.mask][0]))


def cut(row: Any, dims: tuple[int | str, ...], length: int, spec: Padding) -> Any:
    """One request's row of an output (`dims`: the output's dims after the batch one)
    without the padding positions of the padded dimension."""
    if not isinstance(row, np.ndarray) or spec.dimension not in dims:
        return row
    index = tuple(slice(0, length) if d == spec.dimension else slice(None) for d in dims)
    return row[index]


def _fill(dtype: np.dtype, value: float) -> Any:
    return "" if dtype.kind == "O" else np.asarray(value).astype(dtype)
