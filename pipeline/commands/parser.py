"""The whole `tidebatch` parser: one module per subcommand under pipeline/commands/, each
exposing `add_parser(subparsers)` and setting `func(args) -> int` on its parser. Here, not in
pipeline/cli.py, so that `tidebatch completion` builds it without importing the entry point."""

from __future__ import annotations

import argparse
import importlib

from pipeline.completion.parser_tree import walk
from pipeline.observe.logs import FORMATS, LEVELS

# One module per subcommand; import lazily so `tidebatch broker` never loads ONNX Runtime.
COMMAND_MODULES: tuple[str, ...] = (
    "pipeline.commands.broker",
    "pipeline.commands.run",
    "pipeline.commands.generate",
    "pipeline.commands.produce",
    "pipeline.commands.demo",
    "pipeline.commands.simulate",
    "pipeline.commands.features",
    "pipeline.commands.status",
    "pipeline.commands.etl",
    "pipeline.commands.config",
    "pipeline.commands.inspect",
    "pipeline.commands.dlq",
    "pipeline.commands.read",
    "pipeline.commands.completion",
    "pipeline.commands.profile",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidebatch",
        description="Kafka-native ONNX serving with adaptive micro-batching.",
    )
    parser.add_argument("--version", action="version", version=f"tidebatch {_version()}")
    add_log_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    for path, command in walk(parser):  # `tidebatch run --log-level DEBUG` works too
        if path:
            add_log_flags(command)
    return parser


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a flag not given after the subcommand leaves the one given before it.
    parser.add_argument(
        "--log-level", type=str.upper, choices=LEVELS, default=argparse.SUPPRESS,
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default: the config's log_level, else INFO)",
    )
    parser.add_argument(
        "--log-format", choices=FORMATS, default=argparse.SUPPRESS,
        help="text, or json: one JSON object per line (default: the config's log_format, else text)",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tidebatch")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
