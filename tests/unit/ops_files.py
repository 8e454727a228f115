"""The deployment files as the tests of tests/unit/test_ops_*.py read them: the repo and
ops/ folders, YAML loaders, docker-compose.yml and the Prometheus alert rules by name."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "ops"


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def load_compose() -> dict:
    return load_yaml(REPO / "docker-compose.yml")


def alert_rules() -> dict[str, dict]:
    groups = load_yaml(OPS / "prometheus" / "alerts.yml")["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"]}
