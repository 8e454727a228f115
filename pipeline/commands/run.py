"""`tidebatch run`: one worker, from a YAML config and/or flags."""

from __future__ import annotations

import argparse
import logging
import os

from consumers.client_settings import parse_x
from pipeline.batching.registry import POLICY_NAMES
from pipeline.commands.kafka_flags import add_broker_profile_flag, add_x_flag, connect_timeout_help
from pipeline.config import load_config
from pipeline.observe import logs
from pipeline.registry.pipelines import shipped_names

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a worker (consumer-group member)")
    p.add_argument("-c", "--config", metavar="FILE", help="YAML config file (env TIDEBATCH_* and flags override it)")
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT",
        help="Kafka brokers (default: the config's bootstrap_servers, else 127.0.0.1:9092)",
    )
    p.add_argument(
        "--pipeline", metavar="NAME",
        help=f"a shipped pipeline ({', '.join(sorted(shipped_names()))}) or one under the config's `pipelines:` "
        "(default: the config's pipeline, else ctr)",
    )
    p.add_argument(
        "--policy", choices=POLICY_NAMES,
        help="batching policy (docs/BATCHING.md; default: the config's batching.policy, else adaptive)",
    )
    p.add_argument("--group-id", help="consumer group (default: the config's group_id, else tidebatch-<pipeline>)")
    p.add_argument(
        "--group-protocol", choices=("classic", "consumer"),
        help="classic (cooperative-sticky) or consumer (KIP-848, Apache Kafka >= 4.0; default: the config's "
        "group_protocol, else classic)",
    )
    p.add_argument("--group-instance-id", help="static membership: unique per worker, e.g. the pod name (default: none, dynamic membership)")
    p.add_argument("--input-topic", help="topic of the requests (default: the config's input_topic, else the pipeline's)")
    p.add_argument("--output-topic", help="topic of the results (default: the config's output_topic, else the pipeline's)")
    add_broker_profile_flag(p, None, "the config's broker_profile, else kafka")
    p.add_argument(
        "--client", choices=("confluent", "kafka-python"),
        help="confluent (librdkafka) or kafka-python, pure Python (default: the config's client, else confluent)",
    )
    p.add_argument(
        "--delivery", choices=("at_least_once", "exactly_once"),
        help="exactly_once: results and offsets in one Kafka transaction (docs/DELIVERY.md; default: the config's "
        "delivery, else at_least_once)",
    )
    p.add_argument(
        "--metrics-port", type=int, metavar="PORT",
        help="port of /metrics, /healthz, /readyz and the dashboard; 0 picks a free one (default: the config's "
        "metrics.port, else 9400)",
    )
    p.add_argument(
        "--slo-ms", type=float, metavar="MS",
        help="latency budget of a request from its Kafka timestamp (default: the config's batching.slo_ms, else 100)",
    )
    p.add_argument(
        "--kafka-connect-timeout", type=float, dest="kafka_connect_timeout_s", metavar="SECONDS",
        help=connect_timeout_help("default: the config's kafka_connect_timeout_s, else 30", "at start: "),
    )
    p.add_argument(
        "--processes", type=processes_arg, metavar="N|auto",
        help="worker processes on this host behind one ops port (docs/OPERATIONS.md, \"Many processes on one "
        "host\"); auto: from the usable cores and the model's device (default: the config's runtime.processes, "
        "else auto)",
    )
    add_x_flag(p)
    p.set_defaults(func=run)


def processes_arg(text: str) -> int | str:
    """'auto' or an integer >= 1; argparse's one-line error otherwise."""
    if text == "auto":
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected an integer >= 1 or auto, got {text!r}")


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
    if getattr(args, "processes", None) is not None:
        out["runtime"] = {"processes": args.processes}
    if args.metrics_port is not None:
        out["metrics"] = {"port": args.metrics_port}
    if args.kafka_settings:
        out["kafka"] = {"common": parse_x(args.kafka_settings)}
    return out


def run(args: argparse.Namespace) -> int:
    from pipeline.app.children import ChildSeat
    from pipeline.app.processes import CHILD_HOST_ID_ENV, auto_processes, child_config
    from pipeline.app.serve import serve

    seat = ChildSeat.from_env(os.environ)  # one of the processes of a `run --processes N`
    cfg = load_config(args.config, flag_overrides(args))
    # The flags (pipeline/cli.py) win over the config's log_level / log_format.
    logs.configure(getattr(args, "log_level", cfg.log_level), getattr(args, "log_format", cfg.log_format),
                   None if seat is None else seat.index)
    if seat is not None:
        return serve(child_config(cfg, seat.index, os.environ.get(CHILD_HOST_ID_ENV, "host"), seat.count), seat)
    rt = cfg.runtime
    processes, why = auto_processes(rt.processes, len(os.sched_getaffinity(0)), rt.providers, rt.intra_op_threads)
    if processes == 1:  # one process, no supervisor: the worker and its ops port here
        return serve(cfg, note=f"runtime.processes auto: 1 ({why})" if rt.processes == "auto" else None)
    from pipeline.app.host import serve_host

    return serve_host(cfg, processes, why, args.argv)
