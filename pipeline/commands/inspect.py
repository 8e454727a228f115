"""`tidebatch inspect MODEL.onnx`: a model's inputs, outputs and dynamic dimensions,
whether it can be batched (its inputs, and what its outputs give when it runs on a few
sample requests: pipeline/registry/model_probe.py), a sample request and result, and a starter
config (pipeline/registry/inspect_model.py)."""

from __future__ import annotations

import argparse
import sys

from pipeline.commands.kafka_flags import add_broker_profile_flag


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe an ONNX model and print a starter config for it")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument(
        "--bootstrap-servers", default="127.0.0.1:9092", metavar="HOST:PORT",
        help="the starter config's Kafka brokers (default 127.0.0.1:9092)",
    )
    add_broker_profile_flag(
        p, "kafka", "kafka",
        what="the starter config's broker_profile, as the worker's broker needs (with kafka on the embedded "
        "broker every worker start waits ~23 s for its partitions)",
    )
    p.add_argument(
        "--config-only", action="store_true",
        help="print the starter config alone (to redirect into a file), not the report",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.registry.inspect_model import (
        Broker,
        batching_problems,
        per_request_outputs,
        pipeline_name,
        report,
        sample_request,
        starter_config,
    )
    from pipeline.registry.model_probe import PROBE_ROWS, probe
    from pipeline.runtime.onnx_graph import read_graph

    graph = read_graph(args.model)
    found = None
    if not batching_problems(graph):  # the inputs can be filled: see what the outputs give
        name = pipeline_name(graph)
        found = probe(graph, [sample_request(graph, name, seed) for seed in range(PROBE_ROWS)])
    broker = Broker(args.bootstrap_servers, args.broker_profile)
    if args.config_only:
        for problem in batching_problems(graph):  # the report would say so; a redirect must not hide it
            print(f"tidebatch: warning: {problem}: the worker will refuse this model", file=sys.stderr)
        print(starter_config(graph, pipeline_name(graph), per_request_outputs(graph, found), broker), end="")
    else:
        print(report(graph, found, broker), end="")
    return 0
