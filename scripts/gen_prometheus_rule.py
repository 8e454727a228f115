"""Write ops/k8s/prometheus-rule.yaml: the alert rules of ops/prometheus/alerts.yml as
a Prometheus Operator PrometheusRule, comments and all.

    python scripts/gen_prometheus_rule.py          # rewrite the file
    python scripts/gen_prometheus_rule.py --check  # exit 1 if it is out of date

tests/unit/test_ops_monitoring.py fails when the two files drift apart."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "ops" / "prometheus" / "alerts.yml"
TARGET = REPO / "ops" / "k8s" / "prometheus-rule.yaml"

HEADER = """\
# GENERATED from ops/prometheus/alerts.yml by scripts/gen_prometheus_rule.py: edit
# that file and run the script (tests/unit/test_ops_monitoring.py checks they agree).
# The tidebatch alert rules for the Prometheus Operator (kube-prometheus-stack):
#   kubectl apply -f ops/k8s/prometheus-rule.yaml
# Your Prometheus's ruleSelector must match the labels below: kube-prometheus-stack
# selects release: <its Helm release name> unless told otherwise. runbook_url is a
# path in the repository: prefix your repository's URL (docs/OPERATIONS.md, "Alerts").
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: tidebatch
  labels:
    app.kubernetes.io/name: tidebatch
    app.kubernetes.io/component: alerts
    # release: kube-prometheus-stack
spec:
"""


def render() -> str:
    lines = SOURCE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = ["  " + line if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if TARGET.read_text() != text:
            print(f"{TARGET.relative_to(REPO)} is out of date: run python scripts/gen_prometheus_rule.py")
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
