"""`tidebatch inspect MODEL.onnx`: a model's inputs, outputs and dynamic dimensions,
whether it can be batched, a sample request and a starter config (pipeline/inspect_model.py)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe an ONNX model and print a starter config for it")
    p.add_argument("model", help="path to an .onnx file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.inspect_model import report
    from pipeline.onnx_graph import read_graph

    print(report(read_graph(args.model)), end="")
    return 0
