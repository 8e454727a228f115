"""CLI conventions (issue 21): --version, the log flags before or after the subcommand,
an unknown level refused, JSON log lines."""

from __future__ import annotations

import io
import json
import logging

import pytest

from pipeline.cli import build_parser
from pipeline.observe import logs


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("tidebatch ")


@pytest.mark.parametrize("argv", [["--log-level", "debug", "simulate"], ["simulate", "--log-level", "DEBUG"]])
def test_the_log_level_is_taken_before_or_after_the_subcommand(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).log_level == "DEBUG"


def test_a_log_flag_not_repeated_after_the_subcommand_keeps_the_one_before() -> None:
    args = build_parser().parse_args(["--log-format", "json", "simulate"])
    assert args.log_format == "json" and not hasattr(args, "log_level")


def test_an_unknown_log_level_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: any unknown level silently became INFO.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--log-level", "verbose"])
    assert "invalid choice: 'VERBOSE'" in capsys.readouterr().err


def test_json_log_lines_are_one_object_each() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("test.json.lines")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("scored %d of %d", 3, 4)
    doc = json.loads(out.getvalue())
    assert doc["level"] == "ERROR" and doc["logger"] == "test.json.lines"
    assert doc["message"] == "scored 3 of 4" and "ValueError: boom" in doc["exception"]
    assert doc["time"].endswith("+00:00")
