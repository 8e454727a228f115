"""The Faust example app (examples/faust_ctr) on the embedded broker: right results,
and a batch body that raises leaves its events to be processed after a restart.

Each test runs `faust -A examples.faust_ctr.app worker` as a subprocess with its own
data dir, app id (= consumer group), web port and fresh topics.
"""

from __future__ import annotations

import json
import re
import urllib.request
from contextlib import suppress

import numpy as np
import onnxruntime as ort
import orjson
import pytest

from consumers.brokers.embedded import free_port
from models.registry import load_spec
from pipeline.codecs.ctr import CtrCodec
from pipeline.loadgen.ctr import CtrRequestFactory
from tests.integration.faust_helpers import faust_worker
from tests.integration.pipeline_helpers import (
    REPO,
    committed_offsets,
    produce_values,
    read_topic,
    result_docs,
    wait_for,
)

pytest.importorskip("faust", reason="faust-streaming is not installed (the [faust] extra)")


@pytest.fixture(scope="module")
def reference_session() -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(load_spec("ctr").onnx_path), opts, providers=["CPUExecutionProvider"])


def http_get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read()


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus samples `name{labels...}` in a text exposition."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def distinct_results(bootstrap: str, out: str, ids: set[str], timeout: float) -> dict[str, dict]:
    """Read `out` until every id in `ids` has a result (or timeout): id -> first doc."""
    found: dict[str, dict] = {}

    def done() -> bool:
        msgs = read_topic(bootstrap, out, 10**9, timeout=1.0)
        for doc in result_docs(msgs):
            found.setdefault(doc["request_id"], doc)
        return ids <= set(found)

    with suppress(AssertionError):
        wait_for(done, timeout, "", interval=0.2)
    return found


def check_scores(reference_session: ort.InferenceSession, requests, by_id: dict[str, dict]) -> float:
    codec = CtrCodec()
    worst = 0.0
    for key, value in requests:
        rid = orjson.loads(value)["request_id"]
        doc = by_id[rid]
        feeds = codec.collate([codec.decode(value, {}).payload])
        expected = reference_session.run(["prob"], feeds)[0].reshape(-1)
        got = np.array(doc["scores"], dtype=np.float32)
        assert got.shape == expected.shape, rid
        assert doc["key"] == key.decode()
        worst = max(worst, float(np.max(np.abs(got - expected))))
    return worst


def test_example_app_scores_every_request_right(
    broker, topic_factory, unique_group_id, tmp_path, reference_session
) -> None:
    n = 400
    inp = topic_factory("faust-req", partitions=2)
    out = topic_factory("faust-scores", partitions=2)
    topic_factory(f"{inp}.dlq", exact=True)
    factory = CtrRequestFactory(seed=31)
    requests = [factory.make(i) for i in range(n)]
    produce_values(broker.bootstrap_servers, inp, requests)
    metrics_port = free_port()
    with faust_worker(
        broker.bootstrap_servers, inp, out, unique_group_id, tmp_path, "worker",
        TIDEBATCH_FAUST_METRICS_PORT=str(metrics_port),
    ) as (proc, web_port, log):
        msgs = read_topic(broker.bootstrap_servers, out, n, timeout=120)
        assert proc.poll() is None, f"faust worker exited; see {log}"
        docs = result_docs(msgs)
        assert len(docs) == n, f"{len(docs)} results for {n} requests; see {log}"
        by_id = {d["request_id"]: d for d in docs}
        assert len(by_id) == n
        assert max(d["batch_rows"] for d in docs) > max(len(orjson.loads(v)["items"]) for _, v in requests)

        # tidebatch's metrics, on Faust's web server and on their own port; every record
        # is counted once its result was acknowledged by Kafka.
        def counted() -> bool:
            text = http_get(web_port, "/tidebatch/metrics/").decode()
            return sample(text, "tidebatch_records_total", topic=inp) == n

        wait_for(counted, 30, "tidebatch_records_total never reached n")
        text = http_get(metrics_port, "/metrics").decode()
        assert sample(text, "tidebatch_records_total", topic=inp) == n
        assert sample(text, "tidebatch_batch_rows_count", policy="adaptive") == sample(
            text, "tidebatch_batches_total", policy="adaptive"
        ) > 0
        assert sample(text, "tidebatch_batch_rows_sum") == sum(len(orjson.loads(v)["items"]) for _, v in requests)
        assert sample(text, "tidebatch_inference_seconds_count") > 0
        assert sample(text, "tidebatch_queue_wait_seconds_count") == n
        # Faust's own pages still work next to ours.
        perf = json.loads(http_get(web_port, "/performance/"))
        assert perf, "empty /performance/ page"
        assert http_get(web_port, "/router/") is not None
    worst = check_scores(reference_session, requests, by_id)
    assert worst <= 1e-5, f"batched scores differ from unbatched by {worst}"
    assert proc.returncode == 0, f"faust worker exit code {proc.returncode}; see {log}"


@pytest.mark.parametrize("on_error", ["restart", "crash"])
def test_a_failed_batch_is_not_acked_and_is_processed_after_restart(
    broker, topic_factory, unique_group_id, tmp_path, reference_session, on_error
) -> None:
    n = 200
    inp = topic_factory("faust-fail-req", partitions=1)
    out = topic_factory("faust-fail-scores", partitions=1)
    topic_factory(f"{inp}.dlq", exact=True)
    factory = CtrRequestFactory(seed=32)
    requests = [factory.make(i) for i in range(n)]
    all_ids = {orjson.loads(v)["request_id"] for _, v in requests}
    offset_of = {orjson.loads(v)["request_id"]: i for i, (_, v) in enumerate(requests)}  # one partition
    produce_values(broker.bootstrap_servers, inp, requests)

    with faust_worker(
        broker.bootstrap_servers, inp, out, unique_group_id, tmp_path, "first",
        TIDEBATCH_FAUST_FAIL_FIRST_BATCH="1", TIDEBATCH_FAUST_ON_ERROR=on_error,
    ) as (proc, _port, log):
        failed: set[str] = set()

        def failure_logged() -> bool:
            m = re.search(r"injected failure: batch of (\d+) events not processed: (\S+)", log.read_text())
            if m:
                failed.update(m.group(2).split(","))
                assert len(failed) == int(m.group(1))
            return bool(m) or proc.poll() is not None

        wait_for(failure_logged, 120, f"no injected failure; see {log}")
        assert failed, f"faust worker exited before the failure; see {log}"
        if on_error == "restart":
            # Faust restarts the agent, which goes on with the rest of the topic; the
            # acks after the failed batch are held back, not given to Faust.
            found = distinct_results(broker.bootstrap_servers, out, all_ids - failed, timeout=120)
            assert all_ids - failed <= set(found), f"{len(all_ids - failed - set(found))} missing; see {log}"
            assert not failed & set(found), "a request of the failed batch was scored"
            assert proc.poll() is None, f"faust worker exited; see {log}"
        else:
            wait_for(lambda: proc.poll() is not None, 60, f"worker did not stop on the failure; see {log}")
            assert proc.returncode != 0, "a crashed worker must not exit 0"
    # Faust committed what it had acked when it stopped -- never past the failed batch.
    committed = committed_offsets(broker.bootstrap_servers, unique_group_id, inp, 1)[0]
    assert committed <= min(offset_of[r] for r in failed), f"committed {committed} past the failed batch"

    with faust_worker(broker.bootstrap_servers, inp, out, unique_group_id, tmp_path, "second") as (proc, _p, log2):
        found = distinct_results(broker.bootstrap_servers, out, all_ids, timeout=120)
        assert all_ids <= set(found), f"{len(all_ids - set(found))} requests never scored; see {log2}"
        assert proc.poll() is None, f"faust worker exited; see {log2}"
    worst = check_scores(reference_session, requests, found)
    assert worst <= 1e-5, f"scores differ from unbatched by {worst}"


def test_bad_input_is_dead_lettered_and_acked(broker, topic_factory, unique_group_id, tmp_path) -> None:
    inp = topic_factory("faust-bad-req", partitions=1)
    out = topic_factory("faust-bad-scores", partitions=1)
    dlq = topic_factory(f"{inp}.dlq", exact=True)
    factory = CtrRequestFactory(seed=33)
    good = [factory.make(i) for i in range(5)]
    trace = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    produce_values(broker.bootstrap_servers, inp, [good[0], (b"u", b"{not json"), *good[1:]],
                   headers=[("traceparent", trace), ("x-app", b"1")])
    with faust_worker(broker.bootstrap_servers, inp, out, unique_group_id, tmp_path, "worker") as (_proc, _p, log):
        scored = read_topic(broker.bootstrap_servers, out, 5, timeout=120)
        assert len(scored) == 5, f"see {log}"
        dead = read_topic(broker.bootstrap_servers, dlq, 1, timeout=30)
    # Results carry the W3C trace headers, as the worker's (config result_headers).
    assert all(m.headers() == [("traceparent", trace)] for m in scored), scored[0].headers()
    assert len(dead) == 1
    headers = dict(dead[0].headers())
    assert dead[0].value() == b"{not json"
    assert headers["tidebatch.error"].startswith(b"malformed JSON")
    assert headers["tidebatch.source.offset"] == b"1"
    # Kafka Connect's headers too: the app id is the connector name.
    assert headers["__connect.errors.connector.name"] == unique_group_id.encode()
    assert headers["__connect.errors.exception.class.name"].endswith(b"Error")
    assert headers["__connect.errors.stage"] == b"VALUE_CONVERTER"
    assert "__connect.errors.exception.stacktrace" not in headers
    # Every offset, the bad one included, was acked and committed at the clean stop.
    assert committed_offsets(broker.bootstrap_servers, unique_group_id, inp, 1)[0] == 6


def group_client_ids(bootstrap: str, group: str) -> set[str]:
    """The client ids of the group's members, as the broker sees them."""
    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": bootstrap})
    return {m.client_id for m in client.describe_consumer_groups([group])[group].result(timeout=10).members}


def test_the_kafka_block_reaches_the_apps_clients(broker, topic_factory, unique_group_id, tmp_path) -> None:
    """A PLAINTEXT `kafka:` block (pipeline/faust/kafka_settings.py) from a worker config
    file plus the worker's TIDEBATCH_KAFKA__ variables: the app still scores everything,
    and the broker sees the configured client id on the group's member."""
    n = 50
    inp = topic_factory("faust-kblock-req", partitions=1)
    out = topic_factory("faust-kblock-scores", partitions=1)
    topic_factory(f"{inp}.dlq", exact=True)
    client_id = f"faust-{unique_group_id[-12:]}"
    config = tmp_path / "worker.yaml"
    config.write_text(f"kafka:\n  common:\n    client.id: {client_id}\n  consumer:\n    session.timeout.ms: 10000\n")
    factory = CtrRequestFactory(seed=34)
    requests = [factory.make(i) for i in range(n)]
    produce_values(broker.bootstrap_servers, inp, requests)
    with faust_worker(
        broker.bootstrap_servers, inp, out, unique_group_id, tmp_path, "worker",
        TIDEBATCH_FAUST_CONFIG=str(config), TIDEBATCH_KAFKA__PRODUCER__LINGER_MS="2",
    ) as (proc, _port, log):
        assert len(read_topic(broker.bootstrap_servers, out, n, timeout=120)) == n, f"see {log}"
        assert proc.poll() is None, f"faust worker exited; see {log}"
        if broker.profile == "kafka":  # Tansu's group description is not Kafka's
            assert group_client_ids(broker.bootstrap_servers, unique_group_id) == {client_id}
    text = log.read_text()
    assert "faust kafka settings" in text and f"'broker_client_id': '{client_id}'" in text
    assert "'producer_linger': 0.002" in text and "'broker_session_timeout': 10.0" in text
    assert proc.returncode == 0, f"faust worker exit code {proc.returncode}; see {log}"


FAUST_README = REPO / "examples" / "faust_ctr" / "README.md"


def documented_faust_acls(names: dict[str, str], when: tuple[str, ...] = ("always",)) -> list:
    """The rows of the example's README ACL table whose "when" begins with one of
    `when`, placeholders (`<input>`, `<app id>`, ...) filled in from `names`."""
    from consumers.brokers.kafka_security import Acl

    table = FAUST_README.read_text().split("| resource | name | operation | pattern | when |", 1)[1].split("\n\n", 1)[0]
    rows = table.strip().splitlines()[1:]  # below the |---| line
    assert len(rows) >= 5, f"no ACL table found in {FAUST_README}"
    acls = []
    for line in rows:
        resource, name, operation, pattern, condition = (c.strip().strip("`") for c in line.strip().strip("|").split("|"))
        if condition.startswith(when):
            prefix = name.endswith("-")  # `<app id>-`: the PREFIXED name of Faust's own topics
            acls.append(Acl(resource, names[name.removesuffix("-")] + ("-" if prefix else ""), operation, pattern))
    return acls


def test_the_documented_faust_acls_are_the_workers_minus_the_size_limits() -> None:
    """The example's table: what a worker needs to consume and write, nothing on the
    cluster; Faust's own topics only for apps that have them."""
    names = {"<input>": "in", "<output>": "out", "<dlq>": "in.dlq", "<late>": "in.late", "<app id>": "app"}
    granted = {(a.resource_type, a.name, a.operation, a.pattern) for a in documented_faust_acls(names)}
    assert granted == {("TOPIC", "in", "READ", "LITERAL"), ("GROUP", "app", "READ", "LITERAL"),
                       ("TOPIC", "out", "WRITE", "LITERAL"), ("TOPIC", "in.dlq", "WRITE", "LITERAL")}
    more = documented_faust_acls(names, when=("a tenant class", "an app of your own"))
    assert {(a.name, a.operation, a.pattern) for a in more} == {("in.late", "WRITE", "LITERAL"), ("app-", "ALL", "PREFIXED")}


@pytest.mark.parametrize("secret_from", ["env", "file"])
def test_the_app_scores_through_sasl_ssl_with_scram_and_the_documented_acls(
    secret_from: str, secured_kafka, secured_topic_factory, unique_group_id, tmp_path
) -> None:
    """The `kafka:` block's SASL_SSL settings (SCRAM-SHA-512, the test CA) reach aiokafka:
    every request scored once through the secured listener, with only the ACLs the
    example's README lists (tests/integration/test_kafka_secured.py has the broker side),
    the password given as ${ENV} or as @file: in the config file and never printed."""
    from tests.integration.test_kafka_secured import new_user

    n = 60
    inp = secured_topic_factory("faust-sec-req", partitions=2)
    out = secured_topic_factory("faust-sec-scores", partitions=2)
    dlq = secured_topic_factory(f"{inp}.dlq", exact=True)
    names = {"<input>": inp, "<output>": out, "<dlq>": dlq, "<late>": f"{inp}.late", "<app id>": unique_group_id}
    user = new_user(secured_kafka, "faust", documented_faust_acls(names))
    requests = [CtrRequestFactory(seed=35).make(i) for i in range(n)]
    produce_values(secured_kafka.bootstrap_servers, inp, requests)
    security = {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user.name,
        "ssl.ca.location": str(secured_kafka.security.ca),
    }
    if secret_from == "file":  # a worker config file, as a mounted Secret would serve it
        secret = tmp_path / "kafka-password"
        secret.write_text(user.password + "\n")
        config = tmp_path / "worker.yaml"
        config.write_text("kafka:\n  common:\n" + "".join(f"    {k}: '{v}'\n" for k, v in
                                                       {**security, "sasl.password": f"@file:{secret}"}.items()))
        env = {"TIDEBATCH_FAUST_CONFIG": str(config)}
    else:
        env = {f"TIDEBATCH_KAFKA__COMMON__{k.upper().replace('.', '_')}": v for k, v in security.items()}
        env |= {"TIDEBATCH_KAFKA__COMMON__SASL_PASSWORD": "${TB_FAUST_PW}", "TB_FAUST_PW": user.password}
    # The file case at debug level: aiokafka then logs every request, the login included.
    level = "debug" if secret_from == "file" else "info"
    with faust_worker(
        secured_kafka.secure_bootstrap_servers, inp, out, unique_group_id, tmp_path, "worker", level=level,
        TIDEBATCH_FAUST_BROKER_PROFILE="kafka", **env,
    ) as (proc, _port, log):
        ids = {orjson.loads(v)["request_id"] for _, v in requests}
        found = distinct_results(secured_kafka.bootstrap_servers, out, ids, timeout=120)
        assert ids <= set(found), f"{len(ids - set(found))} requests never scored; see {log}"
        assert proc.poll() is None, f"faust worker exited; see {log}"
    docs = result_docs(read_topic(secured_kafka.bootstrap_servers, out, 10**6, timeout=5))
    assert len(docs) == n, f"{len(docs)} results for {n} requests"  # each scored once
    assert proc.returncode == 0, f"faust worker exit code {proc.returncode}; see {log}"
    assert sum(committed_offsets(secured_kafka.bootstrap_servers, unique_group_id, inp, 2).values()) == n
    printed = log.read_text()
    assert "SASLCredentials(SCRAM-SHA-512, user ***)" in printed, f"see {log}"  # a user name is redacted too
    assert user.password not in printed, "the password was printed"
    if level == "debug":  # the SCRAM exchange is there, without its bytes (pipeline/faust/sasl_logs.py)
        assert "SaslAuthenticateRequest_v1(sasl_auth_bytes=***)" in printed and "sasl_auth_bytes=b" not in printed


def test_tenant_classes_from_the_config_shed_a_flood_and_keep_the_steady_tenant(
    broker, topic_factory, unique_group_id, tmp_path
) -> None:
    """The worker config's `tenants:` section in the Faust app (TIDEBATCH_FAUST_CONFIG):
    the worker's tenant gate in front of the agent's batcher. A tenant flooding far past
    its class's ceiling (`beyond: shed`) has its excess on the late topic, unscored, with
    the over_ceiling rule; the steady tenant in its share is scored whole; the metrics
    page has the per-class series. Counts only: the SLAs are generous."""
    steady_n, flood_n = 60, 300
    inp = topic_factory("faust-ten-req", partitions=1)
    out = topic_factory("faust-ten-scores", partitions=1)
    topic_factory(f"{inp}.dlq", exact=True)
    late = topic_factory(f"{inp}.late", exact=True)
    config = tmp_path / "worker.yaml"
    config.write_text(
        "tenants:\n"
        "  capacity_rows_per_s: 2000\n"
        "  classes:\n"
        "    gold: {share: 0.5, slo_ms: 60000, members: [acme]}\n"
        "    bronze: {share: 0.05, ceiling_rows_per_s: 200, burst_ms: 100, beyond: shed, slo_ms: 60000, members: [noisy]}\n"
    )
    steady = CtrRequestFactory(seed=35, tenant="acme")
    noisy = CtrRequestFactory(seed=36, tenant="noisy")
    requests = [noisy.make(i) for i in range(flood_n)] + [steady.make(i) for i in range(steady_n)]
    tenant_of = {orjson.loads(v)["request_id"]: orjson.loads(v)["tenant"] for _, v in requests}
    produce_values(broker.bootstrap_servers, inp, requests)
    metrics_port = free_port()
    with faust_worker(
        broker.bootstrap_servers, inp, out, unique_group_id, tmp_path, "worker",
        TIDEBATCH_FAUST_CONFIG=str(config), TIDEBATCH_FAUST_METRICS_PORT=str(metrics_port),
        TIDEBATCH_FAUST_SLO_MS="60000",
    ) as (proc, _web_port, log):
        wanted = {rid for rid, t in tenant_of.items() if t == "acme"}
        scored = distinct_results(broker.bootstrap_servers, out, wanted, timeout=120)
        assert wanted <= set(scored), f"steady tenant not scored whole; see {log}"

        def settled() -> bool:
            text = http_get(metrics_port, "/metrics").decode()
            return sample(text, "tidebatch_records_total", topic=inp) == len(requests)

        wait_for(settled, 60, "every record counted")
        text = http_get(metrics_port, "/metrics").decode()
        shed = read_topic(broker.bootstrap_servers, late, 1, timeout=30)
        assert proc.poll() is None, f"faust worker exited; see {log}"
    shed = read_topic(broker.bootstrap_servers, late, 10**6, timeout=5)
    shed_ids = {orjson.loads(m.value())["request_id"] for m in shed}
    assert shed_ids and {tenant_of[r] for r in shed_ids} == {"noisy"}
    assert {dict(m.headers())["tidebatch.late_rule"] for m in shed} == {b"over_ceiling"}
    results = {d["request_id"] for d in result_docs(read_topic(broker.bootstrap_servers, out, 10**6, timeout=5))}
    assert results | shed_ids == set(tenant_of) and not results & shed_ids  # one outcome each
    assert sample(text, "tidebatch_tenant_requests_total", tenant_class="gold", outcome="ok") == steady_n
    assert sample(text, "tidebatch_tenant_requests_total", tenant_class="bronze", outcome="routed_late") == len(shed_ids)
    assert sample(text, "tidebatch_tenant_rows_total", tenant_class="bronze", colour="red") > 0
    assert sample(text, "tidebatch_tenant_rows_total", tenant_class="gold", colour="red") == 0
    assert sample(text, "tidebatch_tenant_slo_seconds", tenant_class="gold") == 60.0
    assert proc.returncode == 0, f"faust worker exit code {proc.returncode}; see {log}"
