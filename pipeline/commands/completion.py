"""`tidebatch completion bash|zsh|fish`: print a completion script made from this very
parser (pipeline/completion/), so it lists what this version accepts."""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "completion", help="print a shell completion script (bash, zsh, fish)",
        description="Print a completion script for subcommands, flags and their choices. "
        "bash: source <(tidebatch completion bash) in ~/.bashrc; "
        "zsh: source <(tidebatch completion zsh) in ~/.zshrc; "
        "fish: tidebatch completion fish > ~/.config/fish/completions/tidebatch.fish",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in: bash, zsh or fish")
    p.set_defaults(func=run)


def script(shell: str) -> str:
    """The completion script of `tidebatch` for `shell`."""
    from pipeline.commands.parser import build_parser  # here: parser.py imports this module
    from pipeline.completion.bash import bash_script, zsh_script
    from pipeline.completion.fish import fish_script
    from pipeline.completion.tree import command_tree

    parser = build_parser()
    make = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[shell]
    return make(parser.prog, command_tree(parser))


def run(args: argparse.Namespace) -> int:
    print(script(args.shell), end="")
    return 0
