"""The published JSON Schema of the worker's YAML (docs/schemas/worker-config.schema.json)
is what pipeline/config/schema.py makes from the config dataclasses, and the shipped
configs pass it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from pipeline.cli import main
from pipeline.config import WorkerConfig
from pipeline.config.schema import config_schema

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = REPO / "docs" / "schemas" / "worker-config.schema.json"


def _shipped_configs() -> list[tuple[str, dict]]:
    configs = [("examples/worker.yaml", yaml.safe_load((REPO / "examples" / "worker.yaml").read_text()))]
    for doc in yaml.safe_load_all((REPO / "ops" / "k8s" / "worker.yaml").read_text()):
        if doc and doc.get("kind") == "ConfigMap":
            configs.append(("ops/k8s/worker.yaml ConfigMap", yaml.safe_load(doc["data"]["worker.yaml"])))
    return configs


def test_the_published_schema_is_current() -> None:
    assert json.loads(PUBLISHED.read_text()) == config_schema(WorkerConfig), (
        "docs/schemas/worker-config.schema.json is stale: "
        "tidebatch config schema > docs/schemas/worker-config.schema.json"
    )


@pytest.mark.parametrize(("name", "config"), _shipped_configs(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_shipped_configs_pass_the_schema(name: str, config: dict) -> None:
    jsonschema.validate(config, config_schema(WorkerConfig))


@pytest.mark.parametrize(
    "config",
    [{"batching": {"polcy": "static"}}, {"metrics": {"port": "9400x"}}, {"create_topics": "maybe"},
     {"batching": {"priority_slo_ms": {"high": 50}}}],
)
def test_the_schema_refuses_what_the_worker_refuses(config: dict) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, config_schema(WorkerConfig))


def test_config_check_is_one_line_and_exit_2_for_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "worker.yaml"
    bad.write_text("batching:\n  polcy: static\n")
    assert main(["config", "check", str(bad), "--no-env"]) == 2
    assert capsys.readouterr().err.strip() == (
        "tidebatch: error: config key 'batching.polcy' is not known; did you mean 'batching.policy'?"
    )
    assert main(["config", "check", str(REPO / "examples" / "worker.yaml"), "--no-env"]) == 0
