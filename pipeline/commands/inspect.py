"""`tidebatch inspect MODEL.onnx`: a model's inputs, outputs and dynamic dimensions,
whether it can be batched (its inputs, and what its outputs give when it runs on a few
sample requests: pipeline/registry/model_probe.py), a sample request and result, and a starter
config (pipeline/registry/inspect_model.py)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe an ONNX model and print a starter config for it")
    p.add_argument("model", help="path to an .onnx file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.registry.inspect_model import (
        batching_problems,
        pipeline_name,
        report,
        sample_request,
    )
    from pipeline.registry.model_probe import PROBE_ROWS, probe
    from pipeline.runtime.onnx_graph import read_graph

    graph = read_graph(args.model)
    found = None
    if not batching_problems(graph):  # the inputs can be filled: see what the outputs give
        name = pipeline_name(graph)
        found = probe(graph, [sample_request(graph, name, seed) for seed in range(PROBE_ROWS)])
    print(report(graph, found), end="")
    return 0
