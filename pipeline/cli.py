"""`tidebatch` command line. Each subcommand lives in its own module under
pipeline/commands/ and exposes `add_parser(subparsers)`; the module sets
`func(args) -> int` on its parser. Errors a user can cause are printed as one line."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from pipeline.errors import UserError

# One module per subcommand; import lazily so `tidebatch broker` never loads ONNX Runtime.
COMMAND_MODULES: tuple[str, ...] = (
    "pipeline.commands.broker",
    "pipeline.commands.run",
    "pipeline.commands.produce",
    "pipeline.commands.demo",
    "pipeline.commands.simulate",
    "pipeline.commands.features",
    "pipeline.commands.status",
    "pipeline.commands.etl",
    "pipeline.commands.inspect",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidebatch",
        description="Kafka-native ONNX serving with adaptive micro-batching.",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"tidebatch: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
