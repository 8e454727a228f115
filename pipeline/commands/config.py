"""`tidebatch config schema` (the JSON Schema of the worker's YAML) and
`tidebatch config check FILE` (the file as `tidebatch run` would read it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import WorkerConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="the worker config's JSON Schema, or check a config file")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    schema = actions.add_parser("schema", help="print the JSON Schema of the worker's YAML config")
    schema.set_defaults(func=print_schema)
    check = actions.add_parser(
        "check", help="validate a config file as `tidebatch run` reads it; exit 2 with one line if it is wrong",
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
    from pipeline.config import load_config

    cfg = load_config(args.file, environ={} if args.no_env else os.environ)  # UserError: one line, exit 2
    unresolved = ""
    if args.no_env:
        unresolved = ", secret references not resolved (--no-env)"
    else:
        resolve_secrets(cfg, os.environ)  # UserError: run's line, exit 2
    print(f"{args.file}: valid ({cfg.pipeline} pipeline, {cfg.batching.policy} policy, group {cfg.group_id}{unresolved})")
    return 0


def resolve_secrets(cfg: WorkerConfig, environ: Mapping[str, str]) -> None:
    """Resolve every `${VAR}` / `@file:` secret reference `run` would resolve, with
    the helpers `run` uses, and drop the values: a reference that does not resolve
    raises run's one line (the key and the variable or path, never a value). Issue
    44: `check` said "valid" for a file `run` then refused."""
    from consumers.client_settings import ROLES, resolve_secret, settings_for

    for role in ROLES:  # every client's view: a secret set for one client alone counts too
        settings_for(cfg.kafka, role, environ)
    if cfg.metrics.enabled:  # as pipeline/app/serve.py checks it
        from pipeline.ops.http_auth import HttpAuth

        HttpAuth.from_config(cfg.metrics.auth, environ)
    if cfg.redis.used and cfg.redis.password is not None:  # as pipeline/redisio/link.py's make_client
        resolve_secret("redis.password", cfg.redis.password, environ, "config key")
