"""The argparse tree as plain data for the completion scripts: per command (a path of
subcommand names), its flags with their choices, its subcommands, and whether it takes
any other name too (pipeline/completion/parser_tree.py: `produce my-ranker`)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.completion.parser_tree import ANY_NAME, flag_actions, subcommands, walk

# A word the scripts may write unquoted: every flag and choice of tidebatch is one.
_PLAIN = re.compile(r"^[\w.,:+@/=-]+$")


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # -c, --config
    takes_value: bool
    choices: tuple[str, ...]  # empty: any value (files are offered)
    help: str


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # () is tidebatch itself; ("produce", "NAME") the fallback
    flags: tuple[Flag, ...]
    children: tuple[tuple[str, str], ...]  # (subcommand, its one-line help)
    values: tuple[str, ...]  # the choices of its positional arguments (completion's shell)
    any_name: bool  # a word that is no subcommand selects path + (ANY_NAME,)

    @property
    def key(self) -> str:
        return "/".join(self.path)


def command_tree(parser: argparse.ArgumentParser) -> list[Command]:
    """Every command of `parser`, root first; hidden flags (help=SUPPRESS) left out."""
    return [_command(path, p) for path, p in walk(parser)]


def _command(path: tuple[str, ...], parser: argparse.ArgumentParser) -> Command:
    flags = tuple(_flag(a) for a in flag_actions(parser) if a.help is not argparse.SUPPRESS)
    helps = _child_helps(parser)
    children = tuple((name, helps.get(name, "")) for name, _ in subcommands(parser) if name != ANY_NAME)
    any_name = any(name == ANY_NAME for name, _ in subcommands(parser))
    positionals = [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    values = tuple(v for a in positionals for v in _choices(a))
    return Command(path, flags, children, values, any_name)


def _flag(action: argparse.Action) -> Flag:
    return Flag(_plain(action.option_strings), action.nargs != 0, _choices(action), _one_line(action.help or ""))


def _choices(action: argparse.Action) -> tuple[str, ...]:
    return _plain(str(c) for c in action.choices or ())


def _plain(words: Iterable[str]) -> tuple[str, ...]:
    words = tuple(words)
    unsafe = [w for w in words if not _PLAIN.match(w)]
    if unsafe:  # a new flag or choice with a quote or space would need escaping in three shells
        raise ValueError(f"cannot complete {unsafe[0]!r}: keep flags and choices to letters, digits and .,:+@/=-")
    return words


def _child_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    out: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update({choice.dest: _one_line(choice.help or "") for choice in action._choices_actions})
    return out


def _one_line(help_text: str) -> str:
    """The help up to its first '(' or ';', for the short descriptions shells show."""
    text = re.split(r"\s[(;]|; ", " ".join(help_text.split()), maxsplit=1)[0]
    return text if len(text) <= 70 else text[:67].rstrip() + "..."
