"""Which pipeline a `tidebatch etl` job scores, and with which parts (docs/ETL.md, "Any
pipeline"): the shipped ctr pipeline through its vectorised path (flat tables and
features, pipeline/etl/features.py); every other shipped pipeline and any `pipelines:`
entry of the config through its own codec (pipeline/etl/requests.py). What etl cannot
serve is refused before any work, in one line that names the pipeline and says why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from models.registry import ModelSpec
from pipeline.codecs.base import Codec
from pipeline.errors import UserError
from pipeline.etl.files import file_record_time, line_chunks, preflight, read_file_chunks
from pipeline.etl.inputs import Chunk, InputError, Reject
from pipeline.etl.requests import Requests, RequestScorer, line_requests
from pipeline.etl.settings import EtlJob
from pipeline.etl.topic import Assemble, ctr_features
from pipeline.etl.writer import ChunkWriter, FeatureWriter, RequestWriter
from pipeline.registry.pipelines import PipelineSpec, from_entry, named_pipeline
from pipeline.scoring import ScoringStep

CTR = "ctr"
# Codecs whose requests a line of a file cannot hold (by the entry's `codec`), and why.
NO_LINES = {"camera": "a request is an image whose fields are Kafka headers, which a line of a file cannot hold"}


def etl_pipeline(job: EtlJob) -> PipelineSpec:
    """The job's pipeline: a shipped one, or an entry of the config's `pipelines:`."""
    spec = named_pipeline(job.pipeline, job.pipelines, given_by="--pipeline", config_hint="give it with -c")
    why = NO_LINES.get(codec_name(spec))
    if job.inputs and why:
        raise UserError(f"etl cannot score pipeline {spec.name!r} from files: {why}; score a topic range of it (--topic)")
    return spec


def codec_name(spec: PipelineSpec) -> str:
    return str(spec.entry.get("codec", "tensor-json"))


def check_lines_file(spec: PipelineSpec, path: str, fmt: str) -> None:
    """Before any work: a file of `spec`'s requests is one request per line."""
    if fmt != "jsonl":
        raise InputError(
            f"input {os.path.basename(path)}: pipeline {spec.name!r} reads one request per line, as produced to its "
            f"topic (name the file .jsonl or pass --format jsonl), not {fmt}: flat Parquet and CSV rows are the ctr "
            "pipeline's layout (docs/ETL.md)"
        )
    preflight(path, fmt)


def request_codec(spec: PipelineSpec, job: EtlJob, lines: bool) -> Codec:
    """The pipeline's codec as the worker makes it, with the config's `codec:` and
    max_items. A tensor-binary pipeline's request files are its requests in the JSON
    form, which decode to the same arrays (docs/OWN_MODEL.md, "The binary form")."""
    if lines and codec_name(spec) == "tensor-binary":
        spec = from_entry({**spec.entry, "codec": "tensor-json"})
    return spec.make_codec(SimpleNamespace(codec=job.codec_options, max_items=job.max_items))


# ----------------------------------------------------------------------------- ctr's scoring
@dataclass
class ScoredFeatures:
    """ctr: a chunk's item scores and the rows of the call that scored each."""

    scores: np.ndarray
    batch: np.ndarray
    rejects: list[Reject] = field(default_factory=list)  # ctr's model refuses no row

    @property
    def rows(self) -> int:
        return len(self.scores)


class CtrScorer:
    """ONNX Runtime over a chunk's features, `batch_rows` rows per call."""

    def __init__(self, session: Any, batch_rows: int) -> None:
        self.session = session
        self.batch_rows = batch_rows

    def score(self, chunk: Chunk) -> ScoredFeatures:
        feats = chunk.payload
        n = feats.rows
        scores = np.empty(n, dtype=np.float32)
        batch = np.empty(n, dtype=np.int32)
        for i in range(0, n, self.batch_rows):
            j = min(i + self.batch_rows, n)
            out = self.session.run({"dense": feats.dense[i:j], "cat": feats.cat[i:j]})
            scores[i:j] = np.asarray(out["prob"]).reshape(-1)
            batch[i:j] = j - i
        return ScoredFeatures(scores, batch)


# ----------------------------------------------------------------------------- the parts
@dataclass
class EtlParts:
    """What differs between ctr and any other pipeline in a job."""

    scorer: Callable[[Any], Any]  # session -> .score(chunk) -> an object with .rows and .rejects
    writer: type[ChunkWriter]
    check_file: Callable[[str, str], None]  # (path, format): before any work
    read_file: Callable[[str, str, int], Iterator[Chunk]]  # (path, format, resume offset)
    codec: Codec | None  # decodes topic records (None for a files job)
    assemble: Assemble  # decoded records -> a topic chunk's payload
    identity: dict[str, Any] = field(default_factory=dict)  # beside the model's, in the checkpoint


def etl_parts(job: EtlJob, spec: PipelineSpec, model: ModelSpec) -> EtlParts:
    """The parts for the job's pipeline; `job.batch_rows` is resolved already."""
    rows = job.batch_rows
    assert rows is not None
    if spec.name == CTR:
        from pipeline.codecs.ctr import CtrCodec

        return EtlParts(
            lambda session: CtrScorer(session, rows), FeatureWriter, preflight,
            lambda path, fmt, start: read_file_chunks(path, fmt, job.chunk_rows, start),
            CtrCodec(max_items=1_000_000) if job.topic else None,  # a backfill is not bound by max_items
            ctr_features,
        )
    codec = request_codec(spec, job, lines=not job.topic)

    def read(path: str, fmt: str, start: int) -> Iterator[Chunk]:
        return line_chunks(path, job.chunk_rows, start, line_requests(codec, file_record_time(path)))

    entry = {k: spec.entry[k] for k in ("codec", "codec_options", "inputs", "outputs", "rows", "pad", "max_rows")
             if k in spec.entry}
    return EtlParts(
        lambda session: RequestScorer(ScoringStep(model, codec, session), rows), RequestWriter,
        lambda path, fmt: check_lines_file(spec, path, fmt), read, codec, Requests.of,
        {"pipeline": spec.name, "entry": entry, "codec_config": job.codec_options},
    )
