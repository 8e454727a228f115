"""promtool accepts the Prometheus config and the alert rules, and the alert rules
fire (and stay quiet) as ops/prometheus/alerts_test.yml specifies.
`promtool check metrics` on a live worker is in test_ops_http.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.certs import make_ca

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


def test_the_commented_https_scrape_settings_are_valid(tmp_path):
    """prometheus.yml's commented https + bearer lines (for workers with metrics.tls and
    protect_metrics), uncommented, with the files they name present (promtool checks
    that they exist)."""
    text = (PROM_DIR / "prometheus.yml").read_text()
    block = re.search(r"^( *)# BEGIN https-auth\n(.*?)^ *# END https-auth\n", text, re.M | re.S)
    assert block, "prometheus.yml lost its https-auth block"
    settings = "".join(line.replace("# ", "", 1) + "\n" for line in block.group(2).splitlines())
    files = tmp_path / "tidebatch"
    make_ca(files, "ca")
    (files / "token").write_text("token\n")
    config = text[:block.start()] + settings.replace("/etc/prometheus/tidebatch/", f"{files}/") + text[block.end():]
    config = config.replace("rule_files:\n  - alerts.yml\n", "")  # checked from PROM_DIR above
    assert "\n    scheme: https\n" in config and "      credentials_file: " in config
    (tmp_path / "prometheus.yml").write_text(config)
    out = _promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert "SUCCESS" in out, out


def test_promtool_check_rules():
    out = _promtool("check", "rules", "alerts.yml")
    assert "SUCCESS: 11 rules found" in out


def test_alert_rules_unit_tests():
    out = _promtool("test", "rules", "alerts_test.yml")
    assert "SUCCESS" in out


def test_promtool_accepts_the_prometheus_rule(tmp_path):
    """ops/k8s/prometheus-rule.yaml's spec is a rule file the operator hands to
    Prometheus as is."""
    (rule,) = [d for d in yaml.safe_load_all((PROM_DIR.parent / "k8s" / "prometheus-rule.yaml").read_text()) if d]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    out = _promtool("check", "rules", str(path))
    assert "SUCCESS: 11 rules found" in out
