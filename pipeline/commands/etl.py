"""`tidebatch etl`: score a pipeline's requests from files or a Kafka topic range into
the Parquet layout of the worker's sink (docs/ETL.md). Resumable: rerun the same command."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys

from pipeline.commands.arg_types import ints, names
from pipeline.commands.kafka_flags import (
    add_broker_profile_flag,
    add_x_flag,
    connect_timeout_help,
    kafka_block,
)
from pipeline.errors import UserError
from pipeline.etl.settings import EtlJob  # no pyarrow, unlike pipeline.etl.job (in run())

FORMATS = ("parquet", "csv", "jsonl")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "etl",
        help="score files or a topic range into Parquet (bounded, resumable)",
        description="Score a pipeline's requests from files or a Kafka topic range in large batches "
        "and write the worker sink's Parquet layout: CTR requests from Parquet/CSV/JSONL files, any "
        "other pipeline's (a shipped one or one under the config's `pipelines:`) from JSONL files, one "
        "request per line. Rerunning the same command resumes an interrupted job.",
    )
    p.add_argument(
        "inputs", nargs="*", metavar="INPUT",
        help="files or directories (ctr: flat layout or JSON requests; other pipelines: one request per line; docs/ETL.md)",
    )
    p.add_argument("-o", "--output", required=True, help="output directory or fsspec URL")
    p.add_argument(
        "-c", "--config",
        help="worker YAML: its pipeline and `pipelines:`, codec settings, and defaults for columns, compression, broker",
    )
    p.add_argument(
        "--pipeline", metavar="NAME",
        help="a shipped pipeline or one under the config's `pipelines:` (default: the config's pipeline, else ctr)",
    )
    p.add_argument("--format", choices=FORMATS, help="input format (default: from the file name)")
    p.add_argument("--topic", help="score this topic instead of files")
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT",
        help="topic mode: Kafka brokers (default: the config's bootstrap_servers)",
    )
    p.add_argument(
        "--connect-timeout", type=float, default=30.0, metavar="SECONDS",
        help=connect_timeout_help("default 30", "topic mode: "),
    )
    add_broker_profile_flag(p, None, "the config's broker_profile, else kafka", what="topic mode: the broker's client settings")
    p.add_argument("--partitions", type=ints, metavar="0,1,...", help="default: all")
    p.add_argument("--from-offset", type=int, metavar="N", help="first offset (inclusive)")
    p.add_argument("--to-offset", type=int, metavar="N", help="end offset (exclusive; default: the end)")
    p.add_argument("--from-time", type=parse_time, metavar="TIME", help="ISO-8601 or epoch ms (inclusive)")
    p.add_argument("--to-time", type=parse_time, metavar="TIME", help="ISO-8601 or epoch ms (exclusive)")
    p.add_argument("--columns", type=names, metavar="I1,C14,...", help="input features to keep")
    p.add_argument("--chunk-rows", type=int, default=131_072, help="input file rows per chunk and file (default 131072)")
    p.add_argument("--chunk-records", type=int, default=8192, help="topic mode: offsets per chunk (default 8192)")
    p.add_argument(
        "--batch-rows", type=int,
        help="rows per ONNX Runtime call (default: 2048 for ctr, else the pipeline's max_batch_rows)",
    )
    p.add_argument("--roll-interval-s", type=float, help="record-time bucket of a file (default 300)")
    p.add_argument(
        "--compression", choices=("zstd", "snappy", "gzip", "lz4", "none"),
        help="Parquet compression (default: the config's sink compression, else zstd)",
    )
    p.add_argument("--providers", help="auto, cpu, cuda, tensorrt (default auto)")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    # Test hook: crash (exit 137, nothing flushed) after N chunks are checkpointed.
    p.add_argument("--kill-after-chunks", type=int, help=argparse.SUPPRESS)
    add_x_flag(p)
    p.set_defaults(func=run)


def parse_time(text: str) -> int:
    """Epoch milliseconds from digits, or from ISO-8601 (UTC unless it says otherwise)."""
    if text.strip().lstrip("-").isdigit():
        return int(text)
    try:
        t = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ISO-8601 time or epoch ms, got {text!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def build_job(args: argparse.Namespace) -> EtlJob:
    defaults = _config_defaults(args.config)
    pipeline = args.pipeline or defaults.get("pipeline", "ctr")
    return EtlJob(
        pipeline=pipeline,
        pipelines=defaults.get("pipelines", []),
        # the config's `codec:` section configures the config's own pipeline, as in the worker
        codec_options=defaults.get("codec", {}) if pipeline == defaults.get("pipeline") else {},
        max_items=defaults.get("max_items"),
        output=args.output,
        inputs=list(args.inputs),
        fmt=args.format,
        topic=args.topic,
        bootstrap_servers=args.bootstrap_servers or defaults.get("bootstrap_servers"),
        broker_profile=args.broker_profile or defaults.get("broker_profile", "kafka"),
        kafka=kafka_block(args, defaults.get("kafka")),
        partitions=args.partitions,
        from_offset=args.from_offset,
        to_offset=args.to_offset,
        from_ms=args.from_time,
        to_ms=args.to_time,
        columns=args.columns if args.columns is not None else defaults.get("columns", []),
        chunk_rows=args.chunk_rows,
        chunk_records=args.chunk_records,
        batch_rows=args.batch_rows,
        roll_interval_s=args.roll_interval_s or defaults.get("roll_interval_s", 300.0),
        compression=args.compression or defaults.get("compression", "zstd"),
        providers=args.providers or defaults.get("providers", "auto"),
        threads=args.threads,
        progress=not args.no_progress,
        stop_after_chunks=args.kill_after_chunks,
    )


def _config_defaults(path: str | None) -> dict:
    """Settings shared with the worker, so a backfill writes what the sink writes."""
    if path is None:
        return {}
    from pipeline.config import load_config

    cfg = load_config(path)
    pq = cfg.sinks.parquet
    return {
        "pipeline": cfg.pipeline,
        "pipelines": list(cfg.pipelines),
        "codec": dict(cfg.codec),
        "max_items": cfg.max_items,
        "bootstrap_servers": cfg.bootstrap_servers,
        "broker_profile": cfg.broker_profile,
        "kafka": cfg.kafka,
        "columns": list(pq.columns),
        "roll_interval_s": pq.roll_interval_s,
        "compression": pq.compression,
        "providers": cfg.runtime.providers,
    }


def run(args: argparse.Namespace) -> int:
    from pipeline.etl.job import JobInterrupted, run_etl, summary_lines

    job = build_job(args)
    if job.topic and job.bootstrap_servers:
        from consumers.kafka_reachable import require_kafka

        if args.connect_timeout <= 0:
            raise UserError("--connect-timeout must be > 0")
        require_kafka(job.bootstrap_servers, args.connect_timeout, job.kafka.client("admin"))  # one line, not a retry storm
    try:
        summary = run_etl(job)
    except JobInterrupted:
        sys.stderr.flush()
        os._exit(137)  # the crash the hook stands for: no cleanup, no summary
    except KeyboardInterrupt:
        raise UserError("interrupted; rerun the same command to resume") from None
    for line in summary_lines(summary, job):
        print(line)
    return 0
