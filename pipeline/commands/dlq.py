"""`tidebatch dlq inspect|replay`: what is in a dead-letter topic, and sending its
requests again after a fix (pipeline/dlq/; docs/OPERATIONS.md, "Dead letters: inspect
and replay"). Reads by explicit assignment, so no consumer group is joined."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from consumers.kafka_reachable import DEFAULT_TIMEOUT_S, require_kafka
from pipeline.commands.etl import parse_time
from pipeline.commands.kafka_flags import (
    add_broker_profile_flag,
    add_x_flag,
    connect_timeout_help,
    kafka_block,
)
from pipeline.errors import UserError

if TYPE_CHECKING:
    from pipeline.config import KafkaOverrides
    from pipeline.dlq.letters import Selection

DEFAULT_RATE = 100.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dlq", help="inspect a dead-letter topic, or replay its requests after a fix")
    actions = p.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    inspect = actions.add_parser(
        "inspect", help="count dead letters by reason, stage and source topic",
        description="Read the dead-letter topic from its start (or --since) to its current end and "
        "count its records by reason (numbers and ids taken out, so one kind of failure is one "
        "line), stage and source topic, with a sample record per reason.",
    )
    _common(inspect)
    inspect.add_argument("--json", action="store_true", help="one JSON document instead of the text report")
    inspect.set_defaults(func=run_inspect)
    replay = actions.add_parser(
        "replay", help="send the requests of selected dead letters to a topic again",
        description="Send the original request (value, key, its own headers, plus "
        "tidebatch.replayed.from) of each selected dead letter to --to, at most --rate a second. "
        "Dead letters replayed before are listed in the ledger topic <topic>.replayed and skipped, and so "
        "are those of replayed requests that failed again; truncated ones are counted, never sent.",
    )
    _common(replay)
    replay.add_argument("--to", required=True, metavar="TOPIC", help="where to send the requests (usually the input topic)")
    replay.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, metavar="N",
        help=f"records per second at most (default {DEFAULT_RATE:g})",
    )
    replay.add_argument("--dry-run", action="store_true", help="count what would be replayed; send nothing")
    replay.add_argument("--again", action="store_true", help="ignore the ledger: replay also what an earlier run replayed, and requests that came back from "
        "a replay (each request once a run)")
    replay.set_defaults(func=run_replay)  # the log flags: pipeline/cli.py adds them to every subcommand


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True, help="the dead-letter topic (a worker's default: <input topic>.dlq)")
    p.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT", help="a Kafka broker to start from")
    add_broker_profile_flag(p, "kafka", "kafka")
    p.add_argument("--since", type=parse_time, metavar="TIME", help="dead-lettered at or after: ISO-8601 or epoch ms")
    p.add_argument("--reason", metavar="REGEX", help="only dead letters whose tidebatch.error matches (searched)")
    p.add_argument(
        "--stage", action="append", default=[], choices=("admit", "decode", "inference", "publish", "late"),
        help="only dead letters of this stage (repeatable)",
    )
    p.add_argument(
        "--connect-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help=connect_timeout_help(f"default {DEFAULT_TIMEOUT_S:g}"),
    )
    add_x_flag(p)


def _selection(args: argparse.Namespace) -> Selection:
    from pipeline.dlq.letters import Selection

    try:
        return Selection.of(args.since, args.reason, args.stage)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _reachable(args: argparse.Namespace) -> KafkaOverrides:
    if args.connect_timeout <= 0:
        raise UserError("--connect-timeout must be > 0")
    kafka = kafka_block(args)
    require_kafka(args.bootstrap_servers, args.connect_timeout, kafka.client("admin"))
    return kafka


def run_inspect(args: argparse.Namespace) -> int:
    from pipeline.dlq.inspect import summarize, text_lines
    from pipeline.dlq.read import read_topic

    selection = _selection(args)
    kafka = _reachable(args)
    letters = read_topic(
        args.bootstrap_servers, args.broker_profile, args.topic, since_ms=args.since, settings=kafka.client("consumer"),
    )
    summary = summarize(args.topic, letters, selection)
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2))
    else:
        print("\n".join(text_lines(summary)))
    return 0


def run_replay(args: argparse.Namespace) -> int:
    from pipeline.dlq.replay import ReplayJob, replay

    if args.rate <= 0:
        raise UserError("--rate must be > 0")
    selection = _selection(args)
    kafka = _reachable(args)
    job = ReplayJob(
        args.bootstrap_servers, args.broker_profile, args.topic, args.to, selection, args.rate,
        dry_run=args.dry_run, again=args.again, consumer_settings=kafka.client("consumer"),
        producer_settings=kafka.client("producer"), admin_settings=kafka.client("admin"),
    )
    report = replay(job)
    print(report.line(args.to, args.dry_run))
    return 0
