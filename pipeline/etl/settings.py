"""What a `tidebatch etl` job is: its settings (``EtlJob``, from the command's flags
and the worker config) and their validation. No I/O and no pyarrow, so the command
builds a job without loading the job's machinery (pipeline/etl/job.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.config import KafkaOverrides
from pipeline.errors import UserError

# Rows per ONNX Runtime call for ctr. Measured for the CTR model on this 2-core EPYC (1 MiB
# L2 per core): ~120k rows per CPU-second at 512-2048 rows, ~96k at 8192 (the 8192 x 256
# activations spill out of L2), so the default is the largest size before the drop.
CTR_BATCH_ROWS = 2048


@dataclass
class EtlJob:
    output: str
    inputs: list[str] = field(default_factory=list)  # files mode
    fmt: str | None = None  # force parquet | csv | jsonl
    topic: str | None = None  # topic mode
    bootstrap_servers: str | None = None
    broker_profile: str = "kafka"
    kafka: KafkaOverrides = field(default_factory=KafkaOverrides, repr=False)  # may hold secrets
    partitions: list[int] | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    from_ms: int | None = None
    to_ms: int | None = None
    pipeline: str = "ctr"  # a shipped pipeline or one of `pipelines` (pipeline/etl/pipelines.py)
    pipelines: list[dict[str, Any]] = field(default_factory=list)  # the config's `pipelines:` entries
    codec_options: dict[str, Any] = field(default_factory=dict)  # the config's `codec:` section
    max_items: int | None = None  # the config's max_items (a codec class may take it)
    columns: list[str] = field(default_factory=list)
    chunk_rows: int = 131_072  # rows of an input file per chunk (and at most per output file)
    chunk_records: int = 8192  # offsets of a partition per chunk (~160k rows of CTR requests)
    # Rows per ONNX Runtime call; None: CTR_BATCH_ROWS for ctr, else the pipeline's
    # max_batch_rows (a batch of 2048 camera frames would take gigabytes): batch_rows_for.
    batch_rows: int | None = None
    roll_interval_s: float = 300.0
    compression: str = "zstd"
    providers: str = "auto"
    threads: int = 1
    progress: bool = True
    stop_after_chunks: int | None = None  # test hook: raise JobInterrupted after N chunks


def validate_job(job: EtlJob) -> None:
    if bool(job.inputs) == bool(job.topic):
        raise UserError("give input files or --topic (one of them)")
    limits = (("--chunk-rows", job.chunk_rows), ("--chunk-records", job.chunk_records),
              ("--batch-rows", job.batch_rows), ("--threads", job.threads))
    for name, value in limits:
        if value is not None and value < 1:
            raise UserError(f"{name} must be >= 1")
    if job.roll_interval_s <= 0:
        raise UserError("--roll-interval-s must be > 0")
    if job.topic and not job.bootstrap_servers:
        raise UserError("--topic needs --bootstrap-servers")
    if job.from_offset is not None and job.from_ms is not None:
        raise UserError("give --from-offset or --from-time, not both")
    if job.to_offset is not None and job.to_ms is not None:
        raise UserError("give --to-offset or --to-time, not both")


def batch_rows_for(job: EtlJob, pipeline_max_rows: int) -> int:
    """Rows per ONNX Runtime call: --batch-rows, else CTR_BATCH_ROWS for ctr and the
    pipeline's own cap (its entry's max_batch_rows) for any other."""
    if job.batch_rows is not None:
        return job.batch_rows
    return CTR_BATCH_ROWS if job.pipeline == "ctr" else pipeline_max_rows
