"""The pipeline registry: which codec, which model, which default topics and limits, and
how to make sample requests (for the warm-up profile and the load generator).

Every pipeline is a `pipelines:` entry: the shipped ones (CTR, camera, text) are read
from models/pipelines.yaml, a user's from the worker config (docs/OWN_MODEL.md); both
are checked by pipeline/registry/keys.py and become a PipelineSpec through the one
builder, `from_entry` (pipeline/registry/user_pipelines.py EntryPipeline)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from models.registry import MODELS_DIR, ModelSpec
from pipeline.codecs.base import Codec, Sample
from pipeline.errors import UserError

SHIPPED_FILE = MODELS_DIR / "pipelines.yaml"
# Relative paths in the shipped file are read from the folder that holds models/ (the
# repository root, or site-packages), so that an entry copied from it into a config run
# from the repository root means the same (models/pipelines.yaml says so too).
_SHIPPED_BASE = MODELS_DIR.parent


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    input_topic: str
    output_topic: str
    make_codec: Callable[[Any], Codec]  # (WorkerConfig or None) -> Codec
    load_model: Callable[[], ModelSpec]  # models/registry.py: one spec format for every model
    make_samples: Callable[[int], Callable[[int], Sample]]  # seed -> (i -> valid request)
    # Requests per warm-up profile call: a camera frame costs ~60 ms, a CTR request ~0.3.
    warmup_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24)
    # Largest value the Kafka clients must carry. Above the codec's own limit, so that
    # an oversized value is still consumed and dead-lettered rather than stuck.
    max_message_bytes: int | None = None
    # Largest request record (key + value + headers) the worker decodes; a larger one
    # is dead-lettered before decoding (pipeline/delivery/limits.py). Config:
    # limits.max_request_bytes. 512 KiB holds a CTR request of max_items (1000) items
    # (a 20-item JSON request is ~5.7 KB) and a text of max_chars CJK characters
    # (100,000 x 3 bytes), well below librdkafka's 1 MB record limit.
    max_request_bytes: int = 512 * 1024
    # Default batch cap (rows) when the config sets none. Convolutional and transformer
    # models gain little or nothing from batching on CPU (docs/MODELS.md), and their warm-up
    # fits come from a few small batches: a cap near the measured sizes keeps a noisy
    # fit from forming 100-frame batches that run slower per frame than single ones.
    max_batch_rows: int = 512
    entry: Mapping[str, Any] = field(default_factory=dict, compare=False)  # what it was built from
    # The codec of its requests as documents (user_pipelines.py EntryPipeline.document_codec):
    # what `tidebatch produce --format` encodes as schema-registry records.
    document_codec: Callable[[], Codec] | None = field(default=None, compare=False)


def from_entry(entry: Mapping[str, Any]) -> PipelineSpec:
    """The PipelineSpec of one checked `pipelines:` entry, shipped or a user's."""
    from pipeline.registry.keys import entry_limits
    from pipeline.registry.user_pipelines import EntryPipeline

    built = EntryPipeline(entry)
    return PipelineSpec(
        built.name, built.input_topic, built.output_topic, built.make_codec, built.load_model, built.make_samples,
        entry=built.entry, document_codec=built.document_codec, **entry_limits(entry),
    )


@cache
def shipped_entries() -> tuple[Mapping[str, Any], ...]:
    """The entries of models/pipelines.yaml."""
    return read_entries(SHIPPED_FILE, _SHIPPED_BASE)


def read_entries(path: Path, base: Path) -> tuple[Mapping[str, Any], ...]:
    """The `pipelines:` entries of a file of them, checked as a config's are (an error
    names the file and the key), their relative paths made absolute from `base`."""
    import yaml

    from pipeline.registry.keys import check_entries

    where = str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{where}: cannot read the shipped pipelines: {str(exc).splitlines()[0]}") from None
    entries = doc.get("pipelines") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise UserError(f"{where}: expected a `pipelines:` list")
    check_entries(entries, lambda key, reason: UserError(f"{where}: key '{key}': {reason}"))
    out = []
    for entry in entries:
        paths = {k: str(base / entry[k]) for k in ("model", "samples") if k in entry}
        out.append({**entry, **paths})
    return tuple(out)


def shipped_names() -> list[str]:
    return [e["name"] for e in shipped_entries()]


def get_pipeline(name: str, defined: Sequence[Mapping[str, Any]] = ()) -> PipelineSpec:
    """A shipped pipeline, or one of `defined`: the config's `pipelines` entries, already
    checked by the config's validation (which refuses a shipped pipeline's name)."""
    for entry in (*shipped_entries(), *defined):
        if entry.get("name") == name:
            return from_entry(entry)
    raise UserError(f"unknown pipeline {name!r}; shipped pipelines: {', '.join(sorted(shipped_names()))}")


def named_pipeline(
    name: str, defined: Sequence[Mapping[str, Any]] = (), *, given_by: str, config_hint: str
) -> PipelineSpec:
    """get_pipeline for a name a user gave outside a config (`given_by`: the flag or
    variable), whose one-line error lists the config's own pipelines too, or, with none,
    says how to define one (`config_hint`: how this command is given a config)."""
    own = sorted(str(e.get("name")) for e in defined)
    if name not in shipped_names() and name not in own:
        where = (f"defined under the config's pipelines: {', '.join(own)}" if own else
                 f"a pipeline of your own is a `pipelines:` entry of a worker config ({config_hint}; docs/OWN_MODEL.md)")
        raise UserError(f"{given_by} {name!r}: unknown pipeline; shipped pipelines: "
                        f"{', '.join(sorted(shipped_names()))}; {where}")
    return get_pipeline(name, defined)


def pipeline_for(cfg: Any) -> PipelineSpec:
    """The pipeline a worker config selects (`pipeline`, maybe defined under `pipelines`)."""
    return get_pipeline(cfg.pipeline, cfg.pipelines)

