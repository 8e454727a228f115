"""Apache Kafka (consumers/brokers/kafka.py) and the "kafka" client profile against it: the
first tests that run tidebatch on the real broker instead of Tansu (issue 16)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_fetch import KafkaBrokerError, ensure_jars
from consumers.profiles import KAFKA, consumer_config, producer_config
from pipeline.loadgen.ctr import CtrRequestFactory
from tests.integration.broker_helpers import (
    assert_killed_parent_leaves_no_orphan,
    port_accepts,
    process_gone,
    subprocess_env,
)
from tests.integration.pipeline_helpers import (
    REPO,
    committed_offsets,
    produce_values,
    read_topic,
    result_docs,
    running_worker,
    start_worker_process,
    wait_for,
    worker_config,
)

pytestmark = [
    pytest.mark.integration,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

WAIT_S = 60.0


def consume_all(bootstrap: str, topic: str, group: str, count: int) -> list:
    """Subscribe as `group` (a real group join: fast on Apache Kafka), read `count`
    messages, commit them synchronously."""
    consumer = Consumer(consumer_config(KAFKA, bootstrap, group))
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=count - len(got), timeout=0.2):
                assert message.error() is None, message.error()
                got.append(message)
        # The profile stores offsets only explicitly (at-least-once): commit what we read.
        ends: dict[tuple[str, int], int] = {}
        for m in got:
            ends[(m.topic(), m.partition())] = max(ends.get((m.topic(), m.partition()), 0), m.offset() + 1)
        if ends:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()], asynchronous=False)
    finally:
        consumer.close()
    return got


# ----------------------------------------------------------------------------- lifecycle
def test_start_stop_closes_ports_keeps_logs_and_leaves_no_process(tmp_path: Path) -> None:
    kafka = KafkaBroker(workdir=tmp_path).start()
    node = kafka.nodes[0]
    pid = node.proc.pid
    assert kafka.running and kafka.bootstrap_servers == f"127.0.0.1:{node.port}"
    assert port_accepts(node.port)

    # SIGTERM ran the JVM's shutdown hooks (a clean KRaft shutdown): 128 + 15, not -9.
    assert kafka.stop() == 143

    assert not kafka.running
    assert not port_accepts(node.port) and not port_accepts(node.controller_port)
    assert process_gone(pid)
    assert kafka.log_path.is_file() and (node.dir / "server.properties").is_file()
    assert not (node.dir / "data").exists()
    assert kafka.stop() is None  # a second stop is a no-op


def test_killed_parent_leaves_no_orphan_jvm() -> None:
    assert_killed_parent_leaves_no_orphan(
        "from consumers.brokers.kafka import KafkaBroker\n"
        "k = KafkaBroker().start()\n"
        "print(k.nodes[0].proc.pid, flush=True)\n",
        start_timeout=120,
    )


def test_port_taken_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(KafkaBrokerError) as caught:
            KafkaBroker(port=port, workdir=tmp_path).start()
    assert str(caught.value) == f"port {port} is already in use"


def test_a_broker_that_cannot_start_says_why_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from consumers.brokers import kafka_settings

    monkeypatch.setitem(kafka_settings.LOCAL_SETTINGS, "log.segment.bytes", "lots")
    with pytest.raises(KafkaBrokerError) as caught:
        KafkaBroker(workdir=tmp_path).start()
    message = str(caught.value)
    assert "\n" not in message and "log.segment.bytes" in message, message


def test_unreachable_maven_central_is_a_one_line_error(tmp_path: Path) -> None:
    """A mirror nobody answers on and an empty local repository: what a machine without
    Maven Central sees on its first fetch."""
    settings = tmp_path / "settings.xml"
    settings.write_text(
        "<settings><mirrors><mirror><id>nowhere</id><mirrorOf>*</mirrorOf>"
        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>"
    )
    with pytest.raises(KafkaBrokerError) as caught:
        ensure_jars(home=tmp_path / "home", mvn_args=["-s", str(settings), f"-Dmaven.repo.local={tmp_path / 'repo'}"])
    message = str(caught.value)
    assert message.startswith("cannot fetch Apache Kafka") and "\n" not in message, message
    assert "127.0.0.1:9" in message, message  # mvn's own reason, not ours
    assert not (tmp_path / "home" / "libs").exists()


def test_two_processes_racing_to_fetch_the_jars_fetch_them_once(tmp_path: Path) -> None:
    """Two pytest workers (or a test and the CLI) on a new machine: one fetches under the
    lock, the other waits and uses the result. Artifacts come from ~/.m2 after the first
    fetch, so this costs Maven's start-up, not a download."""
    env = {**subprocess_env(), "TIDEBATCH_KAFKA_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "consumers.brokers.kafka", "fetch"]
    procs = [
        subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    home = tmp_path / "home"
    assert sorted(p.name for p in home.iterdir()) == [".complete", ".lock", "libs"]  # no staging left
    assert any(p.name.startswith("kafka_2.13-") for p in (home / "libs").iterdir())


# ----------------------------------------------------------------------------- kafka profile
def test_produce_consume_round_trip_with_the_kafka_profile(kafka_broker, kafka_topic_factory, unique_group_id) -> None:
    topic = kafka_topic_factory("round-trip", partitions=3)
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(500)]
    produce_values(kafka_broker.bootstrap_servers, topic, records, headers=[("h", b"1")], profile=KAFKA)

    got = consume_all(kafka_broker.bootstrap_servers, topic, unique_group_id, len(records))

    assert sorted((m.key(), m.value()) for m in got) == sorted(records)
    assert all(m.headers() == [("h", b"1")] for m in got)
    committed = committed_offsets(kafka_broker.bootstrap_servers, unique_group_id, topic, 3, profile=KAFKA)
    assert sum(committed.values()) == len(records)


def test_offsets_for_times_finds_the_first_message_at_or_after_a_time(kafka_broker, kafka_topic_factory) -> None:
    topic = kafka_topic_factory("times", partitions=1)
    # An hour ago: old enough to be clearly in the past, young enough for retention.
    base = int(time.time() * 1000) - 3_600_000
    producer = Producer(producer_config(KAFKA, kafka_broker.bootstrap_servers))
    for i in range(100):
        producer.produce(topic, value=str(i).encode(), timestamp=base + 1000 * i)
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer(consumer_config(KAFKA, kafka_broker.bootstrap_servers, "times-reader"))
    try:
        # One call per time: librdkafka merges a list naming the same partition twice.
        found = [
            consumer.offsets_for_times([TopicPartition(topic, 0, ms)], timeout=10)[0].offset
            for ms in (base - 1, base + 42_000, base + 42_500, base + 10**9)
        ]
    finally:
        consumer.close()
    # Exact on Apache Kafka (on Tansu only a hint, pipeline/etl/topic.py); -1: past the end.
    assert found == [0, 42, 43, -1]


def test_lag_from_list_offsets(kafka_broker, kafka_topic_factory, unique_group_id) -> None:
    """ListOffsets "latest" is right on Apache Kafka (it is not on Tansu): the end minus
    the group's committed offset is the lag."""
    topic = kafka_topic_factory("lag", partitions=2)
    produce_values(kafka_broker.bootstrap_servers, topic, [(b"a", b"x")] * 300 + [(b"b", b"y")] * 200, profile=KAFKA)
    consume_all(kafka_broker.bootstrap_servers, topic, unique_group_id, 120)

    client = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    parts = [TopicPartition(topic, p) for p in range(2)]
    futures = client.list_offsets({tp: OffsetSpec.latest() for tp in parts}, request_timeout=10)
    ends = {tp.partition: future.result().offset for tp, future in futures.items()}
    committed = committed_offsets(kafka_broker.bootstrap_servers, unique_group_id, topic, 2, profile=KAFKA)
    lag = {p: ends[p] - max(committed[p], 0) for p in ends}

    assert sum(ends.values()) == 500
    assert sum(lag.values()) == 500 - 120
    # The consumer API's ListOffsets (uncached watermarks) agrees with the admin API.
    consumer = Consumer(consumer_config(KAFKA, kafka_broker.bootstrap_servers, unique_group_id))
    try:
        assert {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in ends} == ends
    finally:
        consumer.close()


# ----------------------------------------------------------------------------- the worker
def _ctr_topics(factory) -> tuple[str, str]:
    inp = factory("ctr-req", partitions=2)
    out = factory("ctr-scores", partitions=2)
    factory(f"{inp}.dlq", exact=True)
    factory(f"{inp}.late", exact=True)
    return inp, out


def _assert_one_result_each(docs: list[dict], requests: list[tuple[bytes, bytes]]) -> None:
    import orjson

    ids = Counter(d["request_id"] for d in docs)
    assert set(ids) == {orjson.loads(v)["request_id"] for _, v in requests}
    assert max(ids.values()) == 1, f"{sum(ids.values()) - len(ids)} duplicate results"


def test_ctr_worker_process_scores_every_request_exactly_once(
    kafka_broker, kafka_topic_factory, unique_group_id, tmp_path: Path
) -> None:
    n = 3000
    bootstrap = kafka_broker.bootstrap_servers
    inp, out = _ctr_topics(kafka_topic_factory)
    factory = CtrRequestFactory(seed=16)
    requests = [factory.make(i) for i in range(n)]
    log = tmp_path / "worker.log"
    proc = start_worker_process(bootstrap, inp, out, unique_group_id, log, profile=KAFKA)
    try:
        produce_values(bootstrap, inp, requests, profile=KAFKA)
        docs = result_docs(read_topic(bootstrap, out, n, timeout=180, profile=KAFKA))
        assert len(docs) == n, f"{len(docs)} results for {n} requests; see {log}"
        wait_for(
            lambda: sum(committed_offsets(bootstrap, unique_group_id, inp, 2, profile=KAFKA).values()) == n,
            60, f"offsets not committed; see {log}", interval=0.5,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, f"exit code {proc.returncode}; see {log}"
    finally:
        if proc.poll() is None:
            proc.kill()
    _assert_one_result_each(docs, requests)
    # Nothing more arrived after the commit: still exactly one result per request.
    assert len(read_topic(bootstrap, out, n + 1, timeout=3, profile=KAFKA)) == n


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_ctr_worker_in_process_on_both_clients(kafka_broker, kafka_topic_factory, unique_group_id, client) -> None:
    n = 1000
    bootstrap = kafka_broker.bootstrap_servers
    inp, out = _ctr_topics(kafka_topic_factory)
    factory = CtrRequestFactory(seed=61)
    requests = [factory.make(i) for i in range(n)]
    cfg = worker_config(bootstrap, inp, out, unique_group_id, profile=KAFKA, dlq_topic=f"{inp}.dlq", client=client)
    with running_worker(cfg) as worker:
        produce_values(bootstrap, inp, requests, profile=KAFKA)
        docs = result_docs(read_topic(bootstrap, out, n, timeout=120, profile=KAFKA))
        wait_for(lambda: worker.stats.commits > 0 and worker.tracker.pending() == 0, 30, "offsets pending")
    assert len(docs) == n
    _assert_one_result_each(docs, requests)
    assert sum(committed_offsets(bootstrap, unique_group_id, inp, 2, profile=KAFKA).values()) == n


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_a_revoked_partition_s_done_work_is_committed_before_it_moves(
    kafka_broker, kafka_topic_factory, unique_group_id, client
) -> None:
    """A second member joins; the first gives up a partition and commits its finished
    work at the revoke, so the new owner replays nothing. kafka-python 3 calls the
    rebalance listener on its IO thread, where this commit used to be refused ("Cannot
    block on net.run() from the IO thread itself"): the partition moved uncommitted."""
    n = 400
    bootstrap = kafka_broker.bootstrap_servers
    inp, out = _ctr_topics(kafka_topic_factory)
    factory = CtrRequestFactory(seed=67)
    requests = [factory.make(i) for i in range(n)]
    # No periodic commit within the test: only the revoke can commit.
    cfg = worker_config(
        bootstrap, inp, out, unique_group_id, profile=KAFKA, dlq_topic=f"{inp}.dlq", client=client,
        commit_interval_ms=3_600_000,
    )
    with running_worker(cfg) as first:
        produce_values(bootstrap, inp, requests, profile=KAFKA)
        docs = result_docs(read_topic(bootstrap, out, n, timeout=120, profile=KAFKA))
        per_partition = Counter(d["source"]["partition"] for d in docs)
        assert set(per_partition) == {0, 1}
        done = lambda: all(first.tracker.watermark((inp, p)) == per_partition[p] for p in (0, 1))  # noqa: E731
        wait_for(done, 30, "results published but not done")
        with running_worker(cfg) as second:
            wait_for(lambda: len(first.assigned) == 1 and len(second.assigned) == 1, 60, "no rebalance")
            [(_, moved)] = second.assigned
            committed = committed_offsets(bootstrap, unique_group_id, inp, 2, profile=KAFKA)
            # Committed at the revoke, before the second member got it: it starts after
            # the first member's last result, replaying nothing.
            assert committed[moved] == per_partition[moved], (committed, dict(per_partition))


# ----------------------------------------------------------------------------- 3 nodes
def test_three_nodes_lose_nothing_when_a_partition_leader_is_killed(kafka_cluster, cluster_topic_factory) -> None:
    n = 3000
    bootstrap = kafka_cluster.bootstrap_servers
    topic = cluster_topic_factory("durable", partitions=3)
    client = AdminClient({"bootstrap.servers": bootstrap})
    meta = client.list_topics(timeout=10).topics[topic]
    assert all(len(p.replicas) == 3 for p in meta.partitions.values())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = client.describe_configs([resource])[resource].result()
    assert config["min.insync.replicas"].value == "2"

    # acks=all + idempotence (the kafka profile's producer): no loss, no duplicates.
    producer = Producer(producer_config(KAFKA, bootstrap))
    errors: list[str] = []
    delivered = Counter()

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered[msg.partition()] += 1

    leader = kafka_cluster.leader_of(topic, 0)
    killed = threading.Event()
    try:
        for i in range(n):
            producer.produce(topic, key=str(i).encode(), value=str(i).encode(), partition=i % 3, on_delivery=on_delivery)
            producer.poll(0)
            if i == n // 3:
                producer.flush(WAIT_S)  # some of it acked by the old leader
                kafka_cluster.kill(leader)
                killed.set()
            if i % 100 == 0:
                time.sleep(0.01)  # keep producing across the fail-over, not in one burst
        assert producer.flush(120) == 0
        assert not errors, errors[:3]
        assert sum(delivered.values()) == n
        assert kafka_cluster.leader_of(topic, 0) != leader  # a new leader took over

        got = read_topic(bootstrap, topic, n, timeout=120, profile=KAFKA)
        keys = Counter(m.key() for m in got)
        assert len(got) == n and len(keys) == n  # every message, each once
    finally:
        if killed.is_set():
            kafka_cluster.restart(leader)
    assert kafka_cluster.running

    def back_in_sync() -> bool:
        parts = client.list_topics(timeout=10).topics[topic].partitions.values()
        return all(len(p.isrs) == 3 for p in parts)

    wait_for(back_in_sync, 120, "the restarted node never rejoined the ISR", interval=0.5)
