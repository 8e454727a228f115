"""`tidebatch features load FILE`: put user/item features into Redis for id-only CTR
requests (docs/REDIS.md). Redis URL, password and TLS come from the worker config's
`redis` section (file via -c, TIDEBATCH_REDIS__* environment), or --url."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from pipeline.errors import UserError
from pipeline.redisio.config import redacted_url

# Bulk loading sends big pipelines: the worker's 100 ms timeouts would be too tight.
_LOAD_TIMEOUT_MS = 30_000.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("features", help="manage the Redis feature store (id-only CTR requests)")
    actions = p.add_subparsers(dest="features_command", required=True, metavar="ACTION")
    load = actions.add_parser(
        "load",
        help="load features from a CSV or Parquet file (columns: kind, id, I1..I13, C1..C26)",
    )
    load.add_argument("file", type=Path, help=".csv, .csv.gz or .parquet")
    load.add_argument("-c", "--config", help="worker YAML config (its redis section)")
    load.add_argument("--url", help="Redis URL (default: redis.url of the config)")
    load.add_argument("--key-prefix", help="default: redis.key_prefix (tb:)")
    load.add_argument("--chunk-rows", type=int, default=1000, help="rows per pipelined round trip (default 1000)")
    load.add_argument("--quiet", action="store_true", help="no progress lines")
    load.set_defaults(func=run_load)


def run_load(args: argparse.Namespace) -> int:
    import redis

    from pipeline.config import load_config
    from pipeline.redisio.link import make_client
    from pipeline.redisio.loader import LoadStats, load_features

    overrides: dict = {"redis": {}}
    if args.url:
        overrides["redis"]["url"] = args.url
    if args.key_prefix:
        overrides["redis"]["key_prefix"] = args.key_prefix
    rc = load_config(args.config, overrides).redis
    rc = dataclasses.replace(rc, socket_timeout_ms=_LOAD_TIMEOUT_MS, connect_timeout_ms=5000.0)
    client = make_client(rc)
    url = redacted_url(rc.effective_url())

    def progress(stats: LoadStats) -> None:
        if not args.quiet:
            rate = stats.rows / stats.seconds if stats.seconds else 0.0
            print(f"  {stats.rows} rows loaded ({rate:,.0f} rows/s)", file=sys.stderr, flush=True)

    try:
        client.ping()
        stats = load_features(
            client, args.file, key_prefix=rc.key_prefix, chunk_rows=args.chunk_rows, progress=progress
        )
    except (redis.RedisError, OSError) as exc:
        raise UserError(
            f"cannot write to Redis at {url}: {str(exc).splitlines()[0]}; "
            "check redis.url / TIDEBATCH_REDIS__URL (and the password)"
        ) from None
    finally:
        client.close()
    print(
        f"loaded {stats.by_kind['user']} users and {stats.by_kind['item']} items "
        f"from {args.file.name} into {url} (prefix {rc.key_prefix!r}) in {stats.seconds:.2f} s"
    )
    return 0
