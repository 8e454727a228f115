"""`tidebatch config schema` (the JSON Schema of the worker's YAML) and
`tidebatch config check FILE` (the file as `tidebatch run` would read it, and what
`run` checks before it connects: pipeline/app/check.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="the worker config's JSON Schema, or check a config file")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    schema = actions.add_parser("schema", help="print the JSON Schema of the worker's YAML config")
    schema.set_defaults(func=print_schema)
    check = actions.add_parser(
        "check", help="validate a config file as `tidebatch run` reads it, its model and pipeline included; "
        "exit 2 with one line if it is wrong",
    )
    check.add_argument("file", help="the YAML config file")
    check.add_argument(
        "--no-env", action="store_true",
        help="ignore TIDEBATCH_* variables (default: applied on top of the file, as `run` does) and "
        "leave ${VAR} / @file: secret references unresolved",
    )
    check.set_defaults(func=check_file)


def print_schema(_args: argparse.Namespace) -> int:
    from pipeline.config import WorkerConfig
    from pipeline.config.schema import config_schema

    json.dump(config_schema(WorkerConfig), sys.stdout, indent=2)
    print()
    return 0


def check_file(args: argparse.Namespace) -> int:
    from pipeline.app.check import check_config
    from pipeline.config import load_config

    environ = {} if args.no_env else os.environ
    cfg = load_config(args.file, environ=environ)  # UserError: one line, exit 2
    checked = check_config(cfg, None if args.no_env else environ)  # run's line, exit 2
    unresolved = ", secret references not resolved (--no-env)" if args.no_env else ""
    print(f"{args.file}: valid ({checked.pipeline} pipeline, model {checked.model} version {checked.version}, "
          f"{checked.policy} policy, group {checked.group_id}{unresolved})")
    return 0
