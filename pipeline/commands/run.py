"""`tidebatch run`: one worker, from a YAML config and/or flags."""

from __future__ import annotations

import argparse
import logging

from consumers.client_settings import parse_x
from pipeline import logs
from pipeline.batching.policies import POLICY_NAMES
from pipeline.commands.kafka_flags import add_x_flag
from pipeline.config import load_config
from pipeline.pipelines import PIPELINES

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a worker (consumer-group member)")
    p.add_argument("-c", "--config", help="YAML config file (env TIDEBATCH_* and flags override it)")
    p.add_argument("--bootstrap-servers", metavar="HOST:PORT")
    p.add_argument(
        "--pipeline", metavar="NAME",
        help=f"a shipped pipeline ({', '.join(sorted(PIPELINES))}) or one under the config's `pipelines:`",
    )
    p.add_argument("--policy", choices=POLICY_NAMES)
    p.add_argument("--group-id")
    p.add_argument(
        "--group-protocol", choices=("classic", "consumer"),
        help="classic (cooperative-sticky, default) or consumer (KIP-848, Apache Kafka >= 4.0)",
    )
    p.add_argument("--group-instance-id", help="static membership: unique per worker, e.g. the pod name")
    p.add_argument("--input-topic")
    p.add_argument("--output-topic")
    p.add_argument("--broker-profile", choices=("kafka", "embedded"))
    p.add_argument("--client", choices=("confluent", "kafka-python"))
    p.add_argument(
        "--delivery", choices=("at_least_once", "exactly_once"),
        help="exactly_once: results and offsets in one Kafka transaction (docs/DELIVERY.md)",
    )
    p.add_argument("--metrics-port", type=int, help="0 picks a free port")
    p.add_argument("--slo-ms", type=float)
    p.add_argument(
        "--kafka-connect-timeout", type=float, dest="kafka_connect_timeout_s", metavar="SECONDS",
        help="exit 1 when no broker answers within this at start (default 30)",
    )
    add_x_flag(p)
    p.set_defaults(func=run)


def flag_overrides(args: argparse.Namespace) -> dict:
    flat = {
        "bootstrap_servers": args.bootstrap_servers,
        "pipeline": args.pipeline,
        "group_id": args.group_id,
        "group_protocol": args.group_protocol,
        "group_instance_id": args.group_instance_id,
        "input_topic": args.input_topic,
        "output_topic": args.output_topic,
        "broker_profile": args.broker_profile,
        "client": args.client,
        "delivery": args.delivery,
        "kafka_connect_timeout_s": args.kafka_connect_timeout_s,
    }
    out: dict = {k: v for k, v in flat.items() if v is not None}
    batching = {"policy": args.policy, "slo_ms": args.slo_ms}
    batching = {k: v for k, v in batching.items() if v is not None}
    if batching:
        out["batching"] = batching
    if args.metrics_port is not None:
        out["metrics"] = {"port": args.metrics_port}
    if args.kafka_settings:
        out["kafka"] = {"common": parse_x(args.kafka_settings)}
    return out


def run(args: argparse.Namespace) -> int:
    from pipeline.serve import serve

    cfg = load_config(args.config, flag_overrides(args))
    # The flags (pipeline/cli.py) win over the config's log_level / log_format.
    logs.configure(getattr(args, "log_level", cfg.log_level), getattr(args, "log_format", cfg.log_format))
    return serve(cfg)
