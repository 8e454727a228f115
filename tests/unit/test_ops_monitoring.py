"""Prometheus config and alert rules, and the Grafana provisioning and dashboard, agree
with docker-compose.yml, docs/OPERATIONS.md, the built-in dashboard and each other
(ops/k8s/prometheus-rule.yaml is the alert rules)."""

from __future__ import annotations

import json
import re

from tests.unit.ops_files import OPS, REPO, alert_rules, load_compose, load_docs, load_yaml


def test_prometheus_scrapes_the_compose_workers():
    prom = load_yaml(OPS / "prometheus" / "prometheus.yml")
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "tidebatch-worker"]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["worker"] and sd["port"] == 9400  # every replica of the service
    for rules in prom["rule_files"]:
        assert (OPS / "prometheus" / rules).is_file()


ALERTS = {
    "TidebatchWorkerDown", "TidebatchNoWorkers", "TidebatchLagGrowing", "TidebatchP99OverSLO",
    "TidebatchDLQRate", "TidebatchNoCommit", "TidebatchDeliveryErrors", "TidebatchRedisDown",
    "TidebatchModelProcessRestarting", "TidebatchModelVersionRefused", "TidebatchTenantP99OverSLA",
}


def test_alert_rules_are_complete_and_documented():
    rules = alert_rules()
    assert set(rules) == ALERTS
    assert rules["TidebatchLagGrowing"]["for"] == "5m"
    ops_doc = (REPO / "docs" / "OPERATIONS.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", ops_doc, re.M)}
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        # runbook_url: the annotation Alertmanager, Grafana and the kube-prometheus
        # runbooks read; a bare `runbook` is shown by nothing.
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert "runbook" not in rule["annotations"], name
        path, anchor = rule["annotations"]["runbook_url"].split("#")
        assert path == "docs/OPERATIONS.md" and anchor == name.lower(), name
        assert anchor in anchors, f"{name}: docs/OPERATIONS.md has no heading for #{anchor}"


def test_alert_rules_do_not_depend_on_the_job_name():
    """The job is named by whoever writes the scrape config (tidebatch-worker under
    compose, kubernetes-pods or namespace/podmonitor on a cluster): an expression that
    names it never fires, or (absent()) fires for ever, elsewhere."""
    for name, rule in alert_rules().items():
        assert not re.search(r"\bjob\s*(=|!=|=~|!~)", rule["expr"]), f"{name} selects a job: {rule['expr']}"
        assert "tidebatch-worker" not in rule["expr"], name


# ----------------------------------------------------------------------------- grafana
def test_grafana_provisioning_points_at_the_dashboards():
    ds = load_yaml(OPS / "grafana" / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    provider = load_yaml(OPS / "grafana" / "provisioning" / "dashboards" / "tidebatch.yml")["providers"][0]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in load_compose()["services"]["grafana"]["volumes"]}
    assert mounts[provider["options"]["path"]] == "./ops/grafana/dashboards"
    dash = json.loads((OPS / "grafana" / "dashboards" / "tidebatch.json").read_text())
    (ds_var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert ds_var["current"]["value"] == ds["uid"]


def test_grafana_has_the_built_in_dashboard_charts():
    dash = json.loads((OPS / "grafana" / "dashboards" / "tidebatch.json").read_text())
    titles = [p["title"] for p in dash["panels"] if p["type"] == "timeseries"]
    js = (REPO / "pipeline" / "ops" / "static" / "dashboard.js").read_text()
    builtin = re.findall(r'new TinyChart\(grid, \{ title: "([^"]+)"', js)
    assert len(builtin) == 5
    for title in builtin:
        assert any(t.startswith(title) for t in titles), f"Grafana lacks the built-in chart {title!r}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        for target in panel["targets"]:
            assert "tidebatch_" in target["expr"], target["expr"]


def test_grafana_filters_by_job_and_namespace_without_naming_a_job():
    """$job and $namespace (All = ".*", which also matches series without the label,
    as under docker-compose), and every selector of every panel query uses them."""
    dash = json.loads((OPS / "grafana" / "dashboards" / "tidebatch.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "namespace", "pipeline"]
    for name in ("job", "namespace", "pipeline"):
        var = variables[name]
        assert var["type"] == "query" and var["includeAll"] and var["allValue"] == ".*", name
        assert var["current"]["value"] == "$__all", name
    assert "tidebatch-worker" not in json.dumps(dash["panels"])
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            selectors = re.findall(r"\b(tidebatch_\w+|up)(\{[^}]*\})?", expr)
            assert selectors, expr
            for metric, sel in selectors:
                assert sel, f"{panel['title']}: {metric} without a selector in {expr}"
                for label in ("job", "namespace", "pipeline"):
                    assert f'{label}=~"${label}"' in sel, f"{panel['title']}: {metric}{sel} lacks ${label}"
                assert not re.search(r'job\s*=\s*"', sel), f"{panel['title']}: a fixed job in {sel}"


def test_prometheus_rule_is_the_alert_rules():
    """ops/k8s/prometheus-rule.yaml is generated from ops/prometheus/alerts.yml; edit
    that and run scripts/gen_prometheus_rule.py."""
    from scripts.gen_prometheus_rule import TARGET, render

    (rule,) = load_docs(OPS / "k8s" / "prometheus-rule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == load_yaml(OPS / "prometheus" / "alerts.yml")["groups"]
    assert TARGET.read_text() == render(), "out of date: run python scripts/gen_prometheus_rule.py"
