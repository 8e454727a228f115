"""`tidebatch read TOPIC`: a topic's records from its start (or --since) to the end it
had when the command started, e.g. a pipeline's results, with no other Kafka tool
(docs/OWN_MODEL.md, "Five commands"). The reader is `tidebatch dlq`'s
(pipeline/dlq/read.py): explicit assignment, so no consumer group is joined and nothing
is committed; pipeline/dlq/show.py formats each record."""

from __future__ import annotations

import argparse
import os
import sys

from consumers.kafka_reachable import DEFAULT_TIMEOUT_S, require_kafka
from pipeline.commands.etl import parse_time
from pipeline.commands.kafka_flags import (
    add_broker_profile_flag,
    add_x_flag,
    connect_timeout_help,
    kafka_block,
)
from pipeline.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "read", help="print a topic's records (a pipeline's results, its dead letters) to its current end",
        description="Print every record of TOPIC, partition by partition in offset order, from its start "
        "(or --since) to the end it had when the command started, one value per line; --meta adds where "
        "each is, its key and headers. Joins no consumer group and commits nothing.",
    )
    p.add_argument("topic", metavar="TOPIC", help="the topic to read, e.g. my-ranker.results")
    p.add_argument(
        "-c", "--config", metavar="FILE",
        help="a worker config whose bootstrap_servers, broker_profile and kafka: settings to use",
    )
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT",
        help="a Kafka broker to start from (default: the config's bootstrap_servers; one of the two is needed)",
    )
    add_broker_profile_flag(p, None, "the config's broker_profile, else kafka")
    p.add_argument("--since", type=parse_time, metavar="TIME", help="records at or after this time: ISO-8601 or epoch ms")
    p.add_argument(
        "--meta", action="store_true",
        help="one JSON object per record: topic, partition, offset, timestamp_ms, key, headers, value",
    )
    p.add_argument(
        "--connect-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help=connect_timeout_help(f"default {DEFAULT_TIMEOUT_S:g}"),
    )
    add_x_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.dlq.read import read_topic
    from pipeline.dlq.show import meta_line, value_line

    cfg = None
    if args.config:
        from pipeline.config import load_config

        cfg = load_config(args.config)
    bootstrap = args.bootstrap_servers or (cfg.bootstrap_servers if cfg else None)
    if not bootstrap:
        raise UserError("tidebatch read needs --bootstrap-servers or -c CONFIG (its bootstrap_servers)")
    profile = args.broker_profile or (cfg.broker_profile if cfg else "kafka")
    if args.connect_timeout <= 0:
        raise UserError("--connect-timeout must be > 0")
    kafka = kafka_block(args, cfg.kafka if cfg else None)
    require_kafka(bootstrap, args.connect_timeout, kafka.client("admin"))
    line = meta_line if args.meta else value_line
    out = sys.stdout.buffer
    try:
        for record in read_topic(bootstrap, profile, args.topic, since_ms=args.since, settings=kafka.client("consumer")):
            out.write(line(record))
        out.flush()
    except BrokenPipeError:  # the reader stopped reading (`| head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # and no second one at exit
    return 0
