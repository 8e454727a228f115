"""`tidebatch completion bash|zsh|fish` (issue 21, "CLI conventions"): the scripts, run
in the real shells. bash: the completion function called as bash calls it, with
COMP_WORDS/COMP_CWORD set; zsh: the same function under the emulation zsh's
bashcompinit runs it in; fish: `complete -C`, fish's own answer for a command line."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.batching.registry import POLICY_NAMES
from pipeline.commands.completion import script
from pipeline.completion.tree import command_tree

# (words before the cursor, the word at the cursor, what must be offered, what must not)
CASES = [
    (["tidebatch"], "pro", {"produce"}, {"run"}),
    (["tidebatch", "produce", "ctr"], "--enc", {"--encoding"}, set()),
    (["tidebatch", "produce", "ctr"], "--c", {"--count", "--connect-timeout"}, {"--cameras", "--config"}),
    (["tidebatch", "produce", "camera"], "--", {"--fps", "--cameras", "--day-seconds", "--resolutions"}, {"--encoding", "--file"}),
    (["tidebatch", "produce", "ctr", "--encoding"], "", {"json", "binary"}, set()),
    (["tidebatch", "run", "--policy"], "", set(POLICY_NAMES), set()),
    # a flag's value is skipped: "text" here is --log-format's, not `produce text`
    (["tidebatch", "--log-format", "text", "produce"], "", {"ctr", "camera", "text"}, set()),
    (["tidebatch", "produce", "my-ranker"], "--con", {"--config", "--connect-timeout"}, set()),
    (["tidebatch", "dlq"], "re", {"replay"}, {"inspect"}),
    (["tidebatch", "dlq", "inspect"], "--log", {"--log-level", "--log-format"}, set()),
    (["tidebatch", "broker", "--nodes"], "", {"1", "3"}, set()),
    (["tidebatch", "completion"], "", {"bash", "zsh", "fish"}, set()),
]
IDS = [" ".join([*before, cur or "''"]) for before, cur, _, _ in CASES]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("completion")
    out = {}
    for shell in ("bash", "zsh", "fish"):
        out[shell] = folder / f"tidebatch.{shell}"
        out[shell].write_text(script(shell))
    return out


def _offered(argv: list[str], cwd: Path | None = None) -> set[str]:
    """The words a shell printed, one a line (fish adds a tab and a description)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return {line.split("\t")[0] for line in done.stdout.splitlines() if line}


def _bash(path: Path, words: list[str], cwd: Path | None = None) -> set[str]:
    program = (
        'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _tidebatch; '
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    return _offered(["bash", "-c", program, "bash", str(path), *words], cwd)


@pytest.mark.parametrize(("before", "cur", "wanted", "unwanted"), CASES, ids=IDS)
def test_bash_completes_from_the_parser(scripts, before: list[str], cur: str, wanted: set[str], unwanted: set[str]) -> None:
    offered = _bash(scripts["bash"], [*before, cur])
    assert wanted <= offered and not unwanted & offered
    assert all(word.startswith(cur) for word in offered)


def test_bash_completes_a_flag_value_after_equals(scripts) -> None:
    # bash splits --encoding=b at '=' (COMP_WORDBREAKS).
    assert _bash(scripts["bash"], ["tidebatch", "produce", "ctr", "--encoding", "=", "b"]) == {"binary"}
    assert _bash(scripts["bash"], ["tidebatch", "produce", "ctr", "--encoding", "="]) == {"json", "binary"}


def test_bash_offers_files_for_a_free_value(scripts, tmp_path: Path) -> None:
    (tmp_path / "requests.jsonl").write_text("{}\n")
    assert _bash(scripts["bash"], ["tidebatch", "produce", "ctr", "--file", "req"], cwd=tmp_path) == {"requests.jsonl"}


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
@pytest.mark.parametrize(("before", "cur", "wanted", "unwanted"), CASES, ids=IDS)
def test_zsh_runs_the_same_function(scripts, before: list[str], cur: str, wanted: set[str], unwanted: set[str]) -> None:
    # bashcompinit's compgen -F runs the function under `emulate -L sh` with these
    # options, and leaves matching the word at the cursor to zsh (compadd).
    program = (
        'source "$1"; shift; t() { emulate -L sh; setopt kshglob noshglob braceexpand; '
        'COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _tidebatch; print -l -- "${COMPREPLY[@]}"; }; t "$@"'
    )
    offered = _offered(["zsh", "-fc", program, "zsh", str(scripts["zsh"]), *before, cur])
    offered = {word for word in offered if word.startswith(cur)}
    assert wanted <= offered and not unwanted & offered


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
@pytest.mark.parametrize(("before", "cur", "wanted", "unwanted"), CASES, ids=IDS)
def test_fish_completes_from_the_parser(scripts, before: list[str], cur: str, wanted: set[str], unwanted: set[str]) -> None:
    line = " ".join([*before, cur])
    offered = _offered(["fish", "--no-config", "-c", 'source $argv[1]; complete -C"$argv[2]"', str(scripts["fish"]), line])
    assert wanted <= offered and not unwanted & offered


def test_every_subcommand_and_flag_is_in_the_scripts(scripts) -> None:
    commands = command_tree(cli.build_parser())
    bash, fish = scripts["bash"].read_text(), scripts["fish"].read_text()
    words = set(re.findall(r"[\w./-]+", bash))
    assert len(commands) > 15
    for command in commands:
        for name, _ in command.children:
            assert name in words and f"-a '{name}'" in fish
        for flag in command.flags:
            assert set(flag.names) <= words


def test_the_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == script("bash")
    assert script("zsh").endswith(script("bash")) and "bashcompinit" in script("zsh")


def test_a_choice_the_scripts_cannot_hold_unquoted_is_refused() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--mode", choices=("a b",), help="default: none")
    with pytest.raises(ValueError, match="cannot complete 'a b'"):
        command_tree(parser)
