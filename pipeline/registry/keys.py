"""The keys of a `pipelines:` entry and their checks, the same for a worker config's
entries (pipeline/config/sections.py) and the shipped ones (models/pipelines.yaml): each error
names the key, in one line. What needs the model (do the inputs exist, is the batch
dimension dynamic) is checked when the worker builds the codec
(pipeline/registry/user_pipelines.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pipeline.errors import UserError
from pipeline.registry.codecs import GRAPH_CODECS, known_codec, unknown_codec_reason

Bad = Callable[[str, str], UserError]  # (key, reason) -> the one-line error

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")  # also a topic-name prefix
# key -> (accepted types, what the error says)
KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "string"),
    "model": ((str,), "string (path to an .onnx file, a version folder or a spec.json)"),
    "codec": ((str,), "string"),
    "version": ((str, int), "string"),
    "input_topic": ((str,), "string"),
    "output_topic": ((str,), "string"),
    "inputs": ((dict,), "mapping of request field -> model input"),
    "outputs": ((dict,), "mapping of result field -> model output"),
    "rows": ((str,), "one or many"),
    "max_rows": ((int,), "int"),
    "max_batch_rows": ((int,), "int"),
    "max_request_bytes": ((int,), "int"),
    # what the Kafka clients must carry (default: max_request_bytes + 64 KiB when that is set)
    "max_message_bytes": ((int,), "int"),
    "warmup_sizes": ((list,), "list of request counts"),  # per warm-up profile call
    "sample_dims": ((dict,), "mapping of dimension name -> size"),
    "samples": ((str,), "string (path to a file of requests, one per line)"),
    "codec_options": ((dict,), "mapping of keyword arguments of the codec class"),
    # ragged sequences padded to bucket edges, the mask filled (pipeline/codecs/tensor_pad.py)
    "pad": ((dict,), "mapping with dimension, buckets, mask, value"),
}


def check_entry(entry: Any, key: str, bad: Bad) -> None:
    """One entry's keys, types and values; `key` names it in errors ("pipelines[0]")."""
    if not isinstance(entry, dict):
        raise bad(key, f"expected a mapping, got {type(entry).__name__}")
    for k, v in entry.items():
        if k not in KEYS:
            raise bad(f"{key}.{k}", f"is not known; use {', '.join(KEYS)}")
        types, what = KEYS[k]
        if isinstance(v, bool) or not isinstance(v, types):
            raise bad(f"{key}.{k}", f"expected {what}, got {v!r}")
    for k in ("name", "model"):
        if k not in entry:
            raise bad(f"{key}.{k}", "is required")
    name = entry["name"]
    if not NAME.match(name):
        raise bad(f"{key}.name", f"{name!r} must be letters, digits, '_', '.', '-' (it prefixes topic names)")
    if "version" in entry and entry["model"].endswith(".json"):
        raise bad(f"{key}.version", "a model given by its spec.json has the spec's own version")
    codec = entry.get("codec", "tensor-json")
    if not known_codec(codec):
        raise bad(f"{key}.codec", unknown_codec_reason(codec))
    if "codec_options" in entry and codec in GRAPH_CODECS:
        raise bad(f"{key}.codec_options", f"only for a codec class of your own; {codec} takes inputs, outputs, rows")
    if "pad" in entry and codec not in GRAPH_CODECS:
        raise bad(f"{key}.pad", "is a tensor-json setting; a codec class of your own pads as it likes")
    if entry.get("rows", "one") not in ("one", "many"):
        raise bad(f"{key}.rows", f"{entry['rows']!r} is not one of one, many")
    for k in ("max_rows", "max_batch_rows"):
        if entry.get(k, 1) < 1:
            raise bad(f"{key}.{k}", "must be >= 1")
    for k in ("max_request_bytes", "max_message_bytes"):
        if entry.get(k, 1024) < 1024:
            raise bad(f"{key}.{k}", "must be >= 1024")
    if entry.get("max_message_bytes", 1 << 62) < entry.get("max_request_bytes", 0):
        raise bad(f"{key}.max_message_bytes", "must be >= max_request_bytes")
    sizes = entry.get("warmup_sizes", [1])
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise bad(f"{key}.warmup_sizes", f"expected a list of ints >= 1, got {sizes!r}")
    for k in ("inputs", "outputs", "sample_dims"):
        for field, target in (entry.get(k) or {}).items():
            want = int if k == "sample_dims" else str
            if not isinstance(field, str) or isinstance(target, bool) or not isinstance(target, want):
                raise bad(f"{key}.{k}.{field}", f"expected {want.__name__}, got {target!r}")


def check_entries(entries: Any, bad: Bad, shipped: Collection[str] = ()) -> set[str]:
    """A `pipelines` list: every entry checked, names unique and none of the `shipped`
    ones (a user's `ctr` would silently change what `tidebatch run ctr` means; the
    worker's own keys, input_topic, batching, codec, ..., change a shipped pipeline).
    Returns the names."""
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        key = f"pipelines[{i}]"
        check_entry(entry, key, bad)
        name = entry["name"]
        if name in shipped:
            raise bad(f"{key}.name", f"{name!r} is a shipped pipeline (models/pipelines.yaml); pick another name, "
                      "or change the shipped one with the worker's own keys (input_topic, batching, codec)")
        if name in seen:
            raise bad(f"{key}.name", f"{name!r} is defined twice")
        seen.add(name)
    return seen


def validate_pipelines(cfg: Any, bad: Bad, shipped: Collection[str]) -> None:
    """The config's `pipelines` entries, and `pipeline` naming a shipped or a defined one."""
    seen = check_entries(cfg.pipelines, bad, shipped)
    if cfg.pipeline not in shipped and cfg.pipeline not in seen:
        defined = f"; defined under pipelines: {', '.join(sorted(seen))}" if seen else ""
        raise bad("pipeline", f"unknown pipeline {cfg.pipeline!r}; shipped pipelines: {', '.join(sorted(shipped))}{defined}")


def entry_limits(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The PipelineSpec keyword arguments an entry's limits give (pipeline/registry/pipelines.py):
    max_batch_rows, max_request_bytes, max_message_bytes, warmup_sizes."""
    options: dict[str, Any] = {k: int(entry[k]) for k in ("max_batch_rows", "max_request_bytes") if k in entry}
    if "max_message_bytes" in entry:
        options["max_message_bytes"] = int(entry["max_message_bytes"])
    elif "max_request_bytes" in entry:  # room for headers above the request limit
        options["max_message_bytes"] = options["max_request_bytes"] + 64 * 1024
    if "warmup_sizes" in entry:
        options["warmup_sizes"] = tuple(int(n) for n in entry["warmup_sizes"])
    return options
