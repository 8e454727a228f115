"""The argparse tree of `tidebatch`: walking it (the log flags on every subcommand in
pipeline/cli.py, shell completion in pipeline/completion/, the help test in
tests/unit/test_cli_help.py), and subcommands that also take a name of the user's.

argparse's subparsers accept only fixed names, but `tidebatch produce my-ranker -c
my-ranker.yaml` names a pipeline defined in a config file (docs/OWN_MODEL.md).
OpenSubcommands keeps a parser per shipped name, with its own flags, plus one
`fallback` parser for any other name; the name given lands in `dest` either way."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

# How the fallback shows in `--help` and in a completion table: not a name to type.
ANY_NAME = "NAME"


class _NamesOrAny(dict):
    """The subparsers' name -> parser map: with a fallback set, every name is taken
    (argparse checks `name in choices`, then looks the name up)."""

    fallback: argparse.ArgumentParser | None = None

    def __contains__(self, name: object) -> bool:
        return self.fallback is not None or dict.__contains__(self, name)

    def __missing__(self, name: str) -> argparse.ArgumentParser:
        if self.fallback is None:
            raise KeyError(name)
        return self.fallback


class OpenSubcommands(argparse._SubParsersAction):
    """Subparsers plus one parser for every name not added (add_fallback)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._name_parser_map = self.choices = _NamesOrAny()

    def add_fallback(self, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        """The parser of any other name; call it after the named ones (argparse refuses
        a name already taken, and with a fallback every name is)."""
        kwargs.setdefault("prog", f"{self._prog_prefix} {ANY_NAME}")
        parser = self._parser_class(**kwargs)
        self._choices_actions.append(self._ChoicesPseudoAction(ANY_NAME, (), help))
        self.choices.fallback = parser
        return parser


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of each direct subcommand; a fallback comes last, as ANY_NAME."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, child in dict.items(action.choices):
                if id(child) not in seen:  # an alias maps to the same parser
                    seen.add(id(child))
                    yield name, child
            fallback = getattr(action.choices, "fallback", None)
            if fallback is not None:
                yield ANY_NAME, fallback


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(path of subcommand names, parser) of `parser` and every parser below it."""
    yield path, parser
    for name, child in subcommands(parser):
        yield from walk(child, (*path, name))


def flag_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's flags (not positionals, not subcommands)."""
    return [a for a in parser._actions if a.option_strings]
