"""Help text and defaults on every flag (issue 21, "CLI conventions"): the whole argparse
tree of `tidebatch`, walked as pipeline/completion/parser_tree.py does for completion.

The rule: every argument has help; a flag with a default other than None/SUPPRESS says
it as "default X" or "default: X" (X as the user would type it). Exempt: on/off flags
(their default is off) and repeatable flags whose default is the empty list."""

from __future__ import annotations

import argparse
import re

import pytest

from pipeline.cli import build_parser
from pipeline.completion.parser_tree import walk


def _arguments() -> list[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    out = []
    for path, parser in walk(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            out.append((" ".join(("tidebatch", *path, action.option_strings[-1] if action.option_strings else action.dest)), parser, action))
    return out


ARGUMENTS = _arguments()


def _spellings(default: object) -> list[str]:
    """How a help text may write `default`: 30.0 as 30, [0.1, 0.5] as 0.1,0.5."""
    if isinstance(default, float):
        return [f"{default:g}", str(default)]
    if isinstance(default, (list, tuple)):
        return [",".join(map(str, default)), " ".join(map(str, default))]
    return [str(default)]


def _needs_default(action: argparse.Action) -> bool:
    d = action.default
    if d is None or d is argparse.SUPPRESS or isinstance(d, bool):
        return False
    return not (isinstance(d, (list, tuple)) and not d and isinstance(action, argparse._AppendAction))


def test_the_walk_reaches_every_subcommand_and_its_flags() -> None:
    # Else the rules below could pass by checking nothing.
    names = {name for name, _, _ in ARGUMENTS}
    for flag in ("tidebatch run --policy", "tidebatch produce ctr --encoding", "tidebatch produce camera --fps",
                 "tidebatch produce NAME --config", "tidebatch dlq replay --rate", "tidebatch etl inputs"):
        assert flag in names
    assert len(ARGUMENTS) > 150


@pytest.mark.parametrize(("name", "parser", "action"), ARGUMENTS, ids=[a[0] for a in ARGUMENTS])
def test_every_argument_has_help(name: str, parser: argparse.ArgumentParser, action: argparse.Action) -> None:
    assert action.help, f"{name}: no help text"


@pytest.mark.parametrize(
    ("name", "parser", "action"), [a for a in ARGUMENTS if _needs_default(a[2])], ids=[a[0] for a in ARGUMENTS if _needs_default(a[2])],
)
def test_a_flag_with_a_default_says_it(name: str, parser: argparse.ArgumentParser, action: argparse.Action) -> None:
    text = parser._get_formatter()._expand_help(action)  # what --help prints, %(default)s filled in
    said = [s for s in _spellings(action.default) if re.search(rf"\bdefault:? {re.escape(s)}(?![\w.])", text)]
    assert said, f"{name}: help does not say 'default {_spellings(action.default)[0]}': {text!r}"


def test_the_rule_catches_a_missing_default() -> None:
    parser = argparse.ArgumentParser()
    quiet = parser.add_argument("--rate", type=float, default=2.5, help="requests per second")
    said = parser.add_argument("--seed", type=int, default=1, help="seed (default 1)")
    assert _needs_default(quiet) and _needs_default(said)
    with pytest.raises(AssertionError, match="does not say 'default 2.5'"):
        test_a_flag_with_a_default_says_it("--rate", parser, quiet)
    test_a_flag_with_a_default_says_it("--seed", parser, said)



CONNECT_TIMEOUTS = [(n, a) for n, _, a in ARGUMENTS if n.endswith("connect-timeout")]


@pytest.mark.parametrize(("name", "action"), CONNECT_TIMEOUTS, ids=[n for n, _ in CONNECT_TIMEOUTS])
def test_a_connect_timeout_says_the_exit_code_it_gets(name: str, action: argparse.Action) -> None:
    # Before: "exit 1 when no broker answers"; require_kafka's UserError exits 2
    # (tests/integration/test_kafka_unreachable.py checks the code itself).
    from pipeline.commands.kafka_flags import EXIT_NO_KAFKA

    assert len(CONNECT_TIMEOUTS) >= 4  # run, produce, etl, dlq
    assert f"exit {EXIT_NO_KAFKA} when no broker answers" in (action.help or ""), name
