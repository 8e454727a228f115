"""promtool accepts the Prometheus config and the alert rules, and the alert rules
fire (and stay quiet) as ops/prometheus/alerts_test.yml specifies.
`promtool check metrics` on a live worker is in test_ops_http.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROM_DIR = Path(__file__).resolve().parents[2] / "ops" / "prometheus"

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool missing: run scripts/ensure_prometheus.sh"
)


def _promtool(*args: str) -> str:
    proc = subprocess.run(["promtool", *args], cwd=PROM_DIR, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{out}"
    return out


def test_promtool_check_config():
    out = _promtool("check", "config", "prometheus.yml")
    assert "SUCCESS" in out and "1 rule files found" in out


def test_promtool_check_rules():
    out = _promtool("check", "rules", "alerts.yml")
    assert "SUCCESS: 9 rules found" in out


def test_alert_rules_unit_tests():
    out = _promtool("test", "rules", "alerts_test.yml")
    assert "SUCCESS" in out
