"""`tidebatch` command line. Each subcommand lives in its own module under
pipeline/commands/ and exposes `add_parser(subparsers)`; the module sets
`func(args) -> int` on its parser. Errors a user can cause are printed as one line."""

from __future__ import annotations

import sys

from pipeline.commands.parser import COMMAND_MODULES, build_parser
from pipeline.errors import UserError
from pipeline.observe import logs
from pipeline.observe.logs import scrub

__all__ = ["COMMAND_MODULES", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # What `run --processes N` starts each of its children with (pipeline/app/children.py).
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logs.configure(getattr(args, "log_level", "INFO"), getattr(args, "log_format", "text"))
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        # The error may quote a library's text, which may quote a secret's value.
        print(scrub(f"tidebatch: error: {exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
