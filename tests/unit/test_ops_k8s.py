"""The k8s manifests parse and agree with the code: the Deployment (probes, ports,
resources, a valid config, SASL to Kafka), skeleton Secrets, the KEDA ScaledObject on
the workers' lag, the PodDisruptionBudget and PodMonitor, and the GPU variant."""

from __future__ import annotations

import copy

import pytest
import yaml

from consumers.client_settings import settings_for
from pipeline.config import load_config
from tests.unit.ops_files import OPS, alert_rules, load_docs


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    docs = load_docs(OPS / "k8s" / "worker.yaml") + load_docs(OPS / "k8s" / "keda-scaledobject.yaml")
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def k8s_secrets() -> dict[str, dict]:
    """Secret name -> its stringData (ops/k8s/secrets.yaml, kept apart: see its header)."""
    docs = load_docs(OPS / "k8s" / "secrets.yaml")
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


def test_pod_disruption_budget_covers_the_workers(k8s):
    (pdb,) = load_docs(OPS / "k8s" / "pdb.yaml")
    assert pdb["apiVersion"] == "policy/v1" and pdb["kind"] == "PodDisruptionBudget"
    assert pdb["spec"]["selector"]["matchLabels"] == k8s["Deployment"]["spec"]["selector"]["matchLabels"]
    # maxUnavailable: minAvailable 1 would block every drain at KEDA's one replica.
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]


def test_pod_monitor_scrapes_the_workers_with_the_label_the_alerts_use(k8s):
    (pm,) = load_docs(OPS / "k8s" / "podmonitor.yaml")
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
    assert f'up{{app_kubernetes_io_name="{name}"}}' in alert_rules()["TidebatchWorkerDown"]["expr"]


@pytest.fixture(scope="module")
def gpu() -> dict:
    (dep,) = load_docs(OPS / "k8s" / "worker-gpu.yaml")
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
