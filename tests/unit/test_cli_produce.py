"""`tidebatch produce ctr|camera|text|NAME` (issue 21, "CLI conventions"): each shipped
pipeline shows and takes only its own flags; any other name is a pipeline of the
user's own (docs/OWN_MODEL.md), with -c."""

from __future__ import annotations

import pytest

from pipeline import cli
from pipeline.cli import build_parser

OWN_FLAGS = {
    "ctr": {"--encoding", "--file"},
    "camera": {"--cameras", "--fps", "--day-seconds", "--resolutions"},
    "text": {"--file"},
    "my-ranker": {"--config", "--file"},
}
EVERY_TYPES_FLAG = set().union(*OWN_FLAGS.values())


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("kind", sorted(OWN_FLAGS))
def test_each_pipeline_lists_only_its_own_flags(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: `produce ctr --help` listed the camera flags, and --encoding said "ctr only".
    shown = _help(capsys, "produce", kind)
    for flag in EVERY_TYPES_FLAG:
        assert (f" {flag}" in shown) == (flag in OWN_FLAGS[kind]), f"{kind}: {flag}"
    assert "--bootstrap-servers" in shown and "--rate" in shown


def test_produce_help_names_the_shipped_pipelines_and_any_other_name(capsys: pytest.CaptureFixture[str]) -> None:
    shown = _help(capsys, "produce")
    for name in ("ctr", "camera", "text", "NAME"):
        assert f"    {name} " in shown
    assert "docs/OWN_MODEL.md" in shown


@pytest.mark.parametrize(
    ("kind", "flag"), [("ctr", "--fps"), ("text", "--encoding"), ("camera", "--encoding"), ("camera", "--file"), ("ctr", "-c")],
)
def test_a_flag_of_another_pipeline_is_refused(kind: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["produce", kind, "--bootstrap-servers", "h:1", flag, "1"])
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_a_pipeline_of_ones_own_keeps_its_docs_command() -> None:
    # docs/OWN_MODEL.md: tidebatch produce my-ranker -c my-ranker.yaml --bootstrap-servers HOST:9092 --file requests.jsonl
    args = build_parser().parse_args(
        ["produce", "my-ranker", "-c", "my-ranker.yaml", "--bootstrap-servers", "HOST:9092", "--file", "requests.jsonl"]
    )
    assert (args.pipeline, args.config, args.file) == ("my-ranker", "my-ranker.yaml", "requests.jsonl")
    assert args.func.__module__ == "pipeline.commands.produce"


def test_shipped_flags_land_where_run_reads_them() -> None:
    ctr = build_parser().parse_args(["produce", "ctr", "--bootstrap-servers", "h:1", "--encoding", "binary", "--count", "5"])
    assert (ctr.pipeline, ctr.encoding, ctr.count, ctr.rate) == ("ctr", "binary", 5, None)
    cam = build_parser().parse_args(["produce", "camera", "--bootstrap-servers", "h:1", "--fps", "2", "--cameras", "3"])
    assert (cam.pipeline, cam.fps, cam.cameras, cam.day_seconds) == ("camera", 2.0, 3, None)


def test_the_log_flags_work_after_the_pipeline_too() -> None:
    args = build_parser().parse_args(["produce", "text", "--bootstrap-servers", "h:1", "--log-level", "debug"])
    assert args.log_level == "DEBUG"


def test_an_unknown_name_without_a_config_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Refused before any connection: the address is never tried.
    assert cli.main(["produce", "crt", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown pipeline 'crt': the shipped ones are camera, ctr, generate, text" in err and "-c CONFIG" in err
