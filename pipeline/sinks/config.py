"""The `sinks` section of the worker config (docs/ETL.md).

No pyarrow here: pipeline.config imports this module, and commands that never write
Parquet must not pay for it. Every key is overridable from the environment, e.g.
TIDEBATCH_SINKS__PARQUET__ENABLED=true, TIDEBATCH_SINKS__PARQUET__PATH=s3://bucket/scores,
TIDEBATCH_SINKS__PARQUET__COLUMNS="[I1, C14]".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")
# Input columns are file column names: keep them plain identifiers.
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass
class ParquetSinkConfig:
    enabled: bool = False
    path: str = "out/parquet"  # local directory or an fsspec URL (s3://bucket/prefix)
    # A file rolls at whichever comes first. Rows and bytes count what the file would
    # hold; bytes are an estimate of the uncompressed size. Both are decided from the
    # records alone, so a replay cuts files at the same places.
    roll_rows: int = 100_000
    roll_bytes: int = 64 * 1024 * 1024
    # Record-time (Kafka timestamp) buckets: a file never spans two buckets.
    roll_interval_s: float = 300.0
    # Wall clock: a file open this long is finished even if no roll point came (idle
    # partitions). Its boundary is persisted before its rows are acked, so replays
    # stay consistent; 0 disables it (file boundaries then depend on records only).
    max_open_s: float = 60.0
    columns: list[str] = field(default_factory=list)  # input features to keep, e.g. [I1, C14]
    compression: str = "zstd"


@dataclass
class SinksConfig:
    parquet: ParquetSinkConfig = field(default_factory=ParquetSinkConfig)


def validate_sinks(sc: SinksConfig, bad: Callable[[str, str], Exception]) -> None:
    """Raise bad(key, why) for the first invalid key of the sinks section."""
    p = sc.parquet
    key = "sinks.parquet."
    if not p.path.strip():
        raise bad(key + "path", "must be a directory or URL")
    if p.roll_rows < 1:
        raise bad(key + "roll_rows", "must be >= 1")
    if p.roll_bytes < 1024:
        raise bad(key + "roll_bytes", "must be >= 1024")
    if p.roll_interval_s <= 0:
        raise bad(key + "roll_interval_s", "must be > 0")
    if p.max_open_s < 0:
        raise bad(key + "max_open_s", "must be >= 0 (0 disables it)")
    if p.compression not in COMPRESSIONS:
        raise bad(key + "compression", f"{p.compression!r} is not one of {', '.join(COMPRESSIONS)}")
    for name in p.columns:
        if not isinstance(name, str) or not _COLUMN.match(name):
            raise bad(key + "columns", f"{name!r} is not a column name")
    if len(set(p.columns)) != len(p.columns):
        raise bad(key + "columns", "names must be unique")
