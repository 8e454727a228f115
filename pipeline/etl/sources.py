"""Sources of a `tidebatch etl` job: one per input file (pipeline/etl/files.py) or per
partition of the topic range (pipeline/etl/topic.py), each a function from the offset
to resume at to the chunks from there."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.codecs.base import Codec
from pipeline.errors import UserError
from pipeline.etl.files import detect_format, expand_inputs
from pipeline.etl.inputs import Chunk
from pipeline.etl.settings import EtlJob


@dataclass
class Source:
    """One unit of input: a file, or one partition of the topic range."""

    id: str  # checkpoint key
    topic: str  # the file name or the Kafka topic (names output files)
    partition: int
    weight: float  # share of the whole job, for progress
    chunks: Callable[[int], Iterator[Chunk]]  # resume offset -> chunks
    start: int = 0


# An input file's chunks: (path, format, resume offset) -> chunks from there.
FileChunks = Callable[[str, str, int], Iterator[Chunk]]


def file_sources(
    job: EtlJob, check: Callable[[str, str], None], read: FileChunks
) -> tuple[list[Source], list[dict[str, Any]]]:
    """One source per input file; `check(path, format)` fails before any work when a
    file cannot be read (or not for this pipeline), `read` gives its chunks."""
    paths = expand_inputs(job.inputs, job.fmt)
    names = [os.path.basename(p) for p in paths]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UserError(f"two inputs are named {dup!r}: output files are named by input file name")
    sources, ident = [], []
    for path in paths:
        fmt = detect_format(path, job.fmt)
        check(path, fmt)
        st = os.stat(path)
        name = os.path.basename(path)

        def chunks(start: int, path: str = path, fmt: str = fmt) -> Iterator[Chunk]:
            return read(path, fmt, start)

        sources.append(Source(name, name, 0, float(max(st.st_size, 1)), chunks))
        ident.append({"name": name, "path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return sources, ident


def topic_sources(
    job: EtlJob, saved: list[dict[str, Any]] | None, codec: Codec, assemble: Any
) -> tuple[list[Source], list[dict[str, Any]]]:
    """One source per partition of the range; records decoded by `codec`, each chunk's
    payload made by `assemble` (pipeline/etl/topic.py Assemble)."""
    from pipeline.etl.topic import PartitionRange, read_partition_chunks, resolve_ranges

    assert job.topic is not None and job.bootstrap_servers is not None
    if saved is not None:  # resumed: the ranges fixed when the job was created
        ranges = [PartitionRange(**r) for r in saved]
    else:
        ranges = resolve_ranges(
            job.bootstrap_servers, job.broker_profile, job.topic, job.partitions,
            job.from_offset, job.to_offset, job.from_ms, job.to_ms, settings=job.kafka.client("consumer"),
        )
    sources = []
    for rng in ranges:

        def chunks(start: int, rng: PartitionRange = rng) -> Iterator[Chunk]:
            assert job.bootstrap_servers is not None
            return read_partition_chunks(
                job.bootstrap_servers, job.broker_profile, rng, job.chunk_records, start, codec,
                settings=job.kafka.client("consumer"), assemble=assemble,
            )

        sources.append(Source(f"{rng.topic}+{rng.partition}", rng.topic, rng.partition,
                               float(max(rng.end - rng.start, 1)), chunks, rng.start))
    return sources, [r.as_dict() for r in ranges]
