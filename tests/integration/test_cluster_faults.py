"""A `tidebatch run` worker (profile kafka) on a 3-node Apache Kafka while brokers fail
(issue 16, part 4): CTR requests flow at a steady rate throughout, a node is killed,
stopped or missing, and afterwards

- every delivered request has at least one outcome (result, dead letter or late
  record); more than one only as at-least-once replays, which are counted and reported;
- the worker process never exits (same pid throughout) and exits 0 on SIGTERM;
- once ready, the worker's /readyz never fails: its source loop keeps polling (an
  offset commit that waits for a dead replica to be fenced used to stop it for 8-10 s);
  except when the cluster loses its quorum (issue 49): then /readyz must fail while the
  worker's writes are held up, and come back by itself once they go through, with the
  outage said in a few lines (pipeline/delivery/kafka_progress.py).

Each test also measures how long after the fault the p99 end-to-end latency (result
record timestamp minus request timestamp, over a sliding 1 s window of results) is back
inside the SLO (2 s here, see SLO_MS), and appends it as a JSON line to
out/faults/recovery.jsonl (or $FAULT_TESTS_OUT; not a TIDEBATCH_* name, which the worker
would read as a config key). Timings are reported, never asserted: this is a 2-core machine
shared with other jobs, and three JVMs plus the worker already fill it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_node import KafkaNode
from tests.integration import opsutil
from tests.integration.fault_timing import baseline_p99, longest_gap_ms, recovery_ms, timeline
from tests.integration.traffic import OutcomeCollector, PacedProducer

pytestmark = pytest.mark.integration

RATE = 200  # requests/s
PRODUCE_S = 20.0
PARTITIONS = 3
# The workers here run with a 2 s SLO, not the default 100 ms: with three JVMs on two
# cores shared with other test runs, plain produce -> consume on this cluster (no worker)
# measured p50 120-170 ms and p99 1.2-1.3 s, and the 1 s windows before any fault
# reached p99 0.3-1.9 s. Against 100 ms "recovered" would mean "the run ended".
SLO_MS = 2000.0
# Also reported against a tighter bound, for comparison.
TIGHT_SLO_MS = 1000.0
OUT = Path(os.environ.get("FAULT_TESTS_OUT", opsutil.REPO / "out" / "faults" / "recovery.jsonl"))


class ReadinessProbe:
    """Asks the worker's /readyz every 0.25 s, as an orchestrator would: the longest
    source-loop silence it reports (last_poll_age_s) and every reason it gave for not
    being ready once it had been."""

    def __init__(self, url: str) -> None:
        self.max_poll_age_s = 0.0
        self.not_ready: list[str] = []
        self.statuses: list[int] = []  # every answer once ready, in order
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="readyz", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        was_ready = False
        while not self._stop.wait(0.25):
            try:
                status, body = opsutil.get_json(self._url + "/readyz")
            except (OSError, ValueError):
                continue
            age = body.get("checks", {}).get("last_poll_age_s")
            self.max_poll_age_s = max(self.max_poll_age_s, age or 0.0)
            if was_ready:
                self.statuses.append(status)
            if status == 200:
                was_ready = True
            elif was_ready and not self._stop.is_set():
                self.not_ready.extend(body.get("reasons", []))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# ----------------------------------------------------------------------------- scenario
@dataclass
class Run:
    """One test's worker, traffic and outcome reader on fresh RF-3 topics."""

    cluster: KafkaBroker
    topics: opsutil.Topics
    worker: opsutil.WorkerProcess
    pid: int
    collector: OutcomeCollector
    probe: ReadinessProbe
    worker_group: str
    producer: PacedProducer | None = None

    def alive(self) -> None:
        """The worker has neither exited nor been replaced."""
        code = self.worker.proc.poll()
        assert code is None and self.worker.proc.pid == self.pid, (
            f"worker exited ({code}) during the fault:\n{self.worker.log_tail()}"
        )

    def pause(self, seconds: float) -> None:
        """Sleep while checking the worker stays alive (traffic keeps flowing)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.alive()
            time.sleep(0.2)


@contextlib.contextmanager
def fault_run(
    kafka_cluster: KafkaBroker,
    cluster_topic_factory: Callable[..., str],
    group: str,
    tmp_path: Path,
    *,
    before_worker: Callable[[], None] = lambda: None,
    worker_env: dict[str, str] | None = None,
    start_worker: Callable[..., opsutil.WorkerProcess] = opsutil.start_worker_process,
) -> Iterator[Run]:
    """Fresh topics, a worker process, an outcome reader; `before_worker` runs after
    the topics exist (fully replicated) and before the worker starts; `worker_env`
    adds to the worker's environment; `start_worker` starts it (opsutil's, or that with
    a netns prefix: test_network_faults.py). Every node runs again at the end: the
    cluster is shared by the session."""
    inp = cluster_topic_factory("faults-req", PARTITIONS)
    topics = opsutil.Topics(
        inp, cluster_topic_factory("faults-res", PARTITIONS),
        cluster_topic_factory(f"{inp}.dlq", exact=True), cluster_topic_factory(f"{inp}.late", exact=True),
    )
    try:
        before_worker()
        worker = start_worker(kafka_cluster, topics, group, tmp_path, "worker",
                              TIDEBATCH_BATCHING__SLO_MS=str(SLO_MS), **(worker_env or {}))
        collector = OutcomeCollector(kafka_cluster.bootstrap_servers, topics, PARTITIONS)
        run = Run(kafka_cluster, topics, worker, worker.proc.pid, collector, ReadinessProbe(worker.url), group)
        try:
            opsutil.wait_for(lambda: run.alive() or len(worker.assigned() or []) == PARTITIONS, 90,
                             "the worker to own every input partition")
            yield run
        finally:
            run.probe.close()
            worker.kill()
            collector.close()
    finally:
        kafka_cluster.restart_many([node for node in kafka_cluster.nodes if not node.running])


def traffic(run: Run, seed: int, seconds: float = PRODUCE_S) -> PacedProducer:
    run.producer = PacedProducer(run.cluster.bootstrap_servers, run.topics.input, seconds, seed, rate=RATE).start()
    return run.producer


def finish(run: Run, name: str, fault_ms: int, *, outage: bool | None = False, exactly_once: bool = False,
           **extra: object) -> dict:
    """Wait for the traffic and every outcome, stop the worker (exit 0), check one
    outcome per request, report the recovery time. `outage`: the fault took the
    cluster's quorum, so the worker must have turned unready for it, and ready again;
    None: it may or may not have (reported), but must be ready again.
    `exactly_once`: no request may have two outcomes (the reader is read_committed)."""
    assert run.producer is not None
    while run.producer.running:
        run.pause(0.5)
    assert not run.producer.errors, f"requests not delivered to Kafka: {run.producer.errors[:3]}"
    ids = run.producer.delivered
    assert len(ids) == run.producer.count
    opsutil.wait_for(lambda: run.alive() or not run.collector.missing(ids), 120,
                     "an outcome for every request")
    run.pause(1.5)  # a replayed duplicate would show up in this time
    run.alive()
    run.probe.close()
    if outage or outage is None:
        if outage:
            assert any(r.startswith("Kafka outage:") for r in run.probe.not_ready), run.probe.not_ready[:5]
        assert run.probe.statuses and run.probe.statuses[-1] == 200, "not ready again after the outage"
    else:
        # The source loop kept polling through the fault: the worker never called itself
        # unready for want of a broker answer while the cluster had a quorum.
        assert not run.probe.not_ready, f"the worker turned unready: {run.probe.not_ready[:3]}"
    code = run.worker.stop()
    assert code == 0, f"worker exit code {code}:\n{run.worker.log_tail()}"
    outcomes = run.collector.close()
    missing = [i for i in ids if i not in outcomes.kinds]
    assert not missing, f"{len(missing)} requests without an outcome, e.g. {missing[:5]}"
    # A duplicate is the same request scored again after a replay (at-least-once):
    # allowed, counted. Two different kinds for one request would be a bug.
    mixed = {i: k for i, k in outcomes.kinds.items() if len(set(k)) > 1}
    assert not mixed, f"requests with different outcomes: {list(mixed.items())[:5]}"
    duplicates = outcomes.duplicates
    if exactly_once:
        assert duplicates == 0, f"read_committed duplicates: {outcomes.duplicated_where()}"
    kinds = outcomes.by_kind()
    record = {
        "test": name,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "requests": len(ids),
        "outcomes": kinds,
        "duplicates": duplicates,
        "baseline_p99_ms": baseline_p99(outcomes.results, fault_ms),
        "recovery_ms": recovery_ms(outcomes.results, fault_ms, SLO_MS),
        "recovery_ms_at_1000": recovery_ms(outcomes.results, fault_ms, TIGHT_SLO_MS),
        "max_latency_ms": max(lat for _, lat in outcomes.results),
        "longest_gap_ms": longest_gap_ms(outcomes.results),
        "max_poll_age_s": run.probe.max_poll_age_s,
        "not_ready": sorted(set(run.probe.not_ready))[:10],
        "unready_answers": sum(1 for st in run.probe.statuses if st != 200),
        "coordinator": coordinator(run),
        **extra,
        "p99_by_second": timeline(outcomes.results, fault_ms),
    }
    print(f"\nFAULT {json.dumps(record)}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


def coordinator(run: Run) -> int | None:
    """The node coordinating the worker's group now (for the report)."""
    from confluent_kafka.admin import AdminClient

    with contextlib.suppress(Exception):
        client = AdminClient({"bootstrap.servers": run.cluster.bootstrap_servers})
        group = run.worker_group
        return client.describe_consumer_groups([group])[group].result(timeout=10).coordinator.id
    return None


def now_ms() -> int:
    return int(time.time() * 1000)


# ----------------------------------------------------------------------------- tests
def kill_and_restart(run: Run, name: str, seed: int, *, topic: str | None = None,
                     outage: bool | None = False) -> None:
    """SIGKILL under traffic the leader of one of `topic`'s partitions that is not the
    group's coordinator (None: the coordinator itself), restart it after 6 s, wait
    until its replicas are back in sync, then check and report."""
    traffic(run, seed=seed)
    run.pause(6)
    group_coordinator = coordinator(run)
    if topic is None:
        assert group_coordinator is not None, "the group's coordinator is not known"
        victim = run.cluster.node(group_coordinator)
    else:
        victim = leader_not_coordinating(run, topic, group_coordinator)
    fault = now_ms()
    run.cluster.kill(victim)
    run.pause(6)
    run.cluster.restart(victim)
    run.cluster.wait_in_sync()
    finish(run, name, fault, outage=outage, node=victim.node_id, coordinator_at_kill=group_coordinator)


def leader_not_coordinating(run: Run, topic: str, group_coordinator: int | None) -> KafkaNode:
    """The leader of one of the topic's partitions that is not the group's coordinator.
    A node that is both is a second fault in one: the group's offsets move with it,
    after the cluster fences it (broker.session.timeout.ms, 6 s here) and the new
    coordinator loads them, and on 2 cores under the suite's load that once took the
    commits past outage_after_s (10 s): test_sigkill_group_coordinator has that fault."""
    leaders = [run.cluster.leader_of(topic, p) for p in range(PARTITIONS)]
    others = [node for node in leaders if node.node_id != group_coordinator]
    assert others, f"every partition of {topic} is led by the coordinator {group_coordinator}"
    return others[0]


# One node SIGKILLed holds acks=all results and commits until the cluster fences it
# (6 s here) and its partitions move: 10-11 s once in a loaded CI run, past the default
# outage_after_s (10 s), which then called the failover an outage. These tests give
# the worker what docs/BROKERS.md advises at_least_once deployments ("One broker
# SIGKILLed: near the threshold"): 15 s.
FAILOVER = {"TIDEBATCH_OUTAGE_AFTER_S": "15"}


def test_sigkill_input_partition_leader(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) -> None:
    with fault_run(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path, worker_env=FAILOVER) as run:
        kill_and_restart(run, "kill_input_leader", seed=11, topic=run.topics.input)


def test_sigkill_output_partition_leader(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) -> None:
    with fault_run(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path, worker_env=FAILOVER) as run:
        kill_and_restart(run, "kill_output_leader", seed=12, topic=run.topics.output)


def test_sigkill_group_coordinator(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) -> None:
    """The node holding the group's offsets SIGKILLed: commits wait until the cluster
    fences it (6 s) and another node has loaded the offsets. Whether that passes
    outage_after_s (15 s) depends on the machine's load: readiness may turn 503 for it
    (reported), must come back, and every request gets its outcome."""
    with fault_run(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path, worker_env=FAILOVER) as run:
        kill_and_restart(run, "kill_group_coordinator", seed=14, outage=None)


def test_rolling_restart(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) -> None:
    with fault_run(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) as run:
        traffic(run, seed=13)
        run.pause(3)
        fault = now_ms()
        steps = []
        for node in kafka_cluster.nodes:
            began = time.monotonic()
            kafka_cluster.stop_node(node)
            kafka_cluster.restart(node)
            in_sync_s = kafka_cluster.wait_in_sync()
            steps.append({"node": node.node_id, "s": round(time.monotonic() - began, 1), "in_sync_s": round(in_sync_s, 1)})
            run.alive()
        finish(run, "rolling_restart", fault, steps=steps)


def test_worker_starts_with_a_broker_down(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) -> None:
    # The first node: the first bootstrap address the worker tries. Killed after the
    # topics exist, so they have all three replicas.
    down = kafka_cluster.nodes[0]
    with fault_run(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path,
                   before_worker=lambda: kafka_cluster.kill(down)) as run:
        traffic(run, seed=14)
        run.pause(6)
        fault = now_ms()  # the node's return: its replicas catch up, leaders may move
        kafka_cluster.restart(down)
        kafka_cluster.wait_in_sync()
        finish(run, "worker_starts_broker_down", fault, node=down.node_id)
        # Before (issue 44): "Kafka broker unreachable at A,B,C: no broker answered" for
        # the one node's refused connections, while the other two served everything.
        lines = run.worker.log_path.read_text(errors="replace").splitlines()
        shown = "\n".join(lines[-40:])
        assert not [line for line in lines if "no broker answered" in line], shown
        refused = [line for line in lines if down.address in line and "Connection refused" in line]
        assert all(f"Kafka broker {down.address} (of " in line and "is not answering" in line for line in refused), shown


def lose_quorum(run: Run, kafka_cluster: KafkaBroker, name: str, seed: int, *, exactly_once: bool = False) -> None:
    """2 of 3 nodes SIGKILLed for 20 s (no quorum for the metadata log nor for
    min.insync.replicas 2), then restarted, under traffic: the worker waits, is unready
    while its writes are held up, says so in a few lines, and recovers by itself with
    every request answered."""
    traffic(run, seed=seed)
    run.pause(5)
    # Work must be in flight when the quorum goes: a worker with nothing waiting is in
    # no outage (pipeline/delivery/kafka_progress.py), and the input goes dark at once
    # (the surviving leader's high watermark needs its followers). Twice the worker was
    # idle at the kill and rightly stayed ready throughout: once no request had reached
    # it yet (the traffic's producer still getting its PID), once in a CI run it had
    # simply caught up. A burst just before the kill leaves it fetched, unscored work.
    opsutil.wait_for(lambda: run.collector.seen() >= 200, 60, "results flowing before the fault")
    run.producer.burst(2000)
    down = kafka_cluster.nodes[1:]
    fault = now_ms()
    for node in down:
        kafka_cluster.kill(node)
    run.pause(20)
    for node in down:
        kafka_cluster.restart(node)
    kafka_cluster.wait_in_sync()
    log = run.worker.log_path.read_text(errors="replace")
    finish(run, name, fault, outage=True, exactly_once=exactly_once, nodes=[n.node_id for n in down],
           outage_lines=[line[:240] for line in log.splitlines() if "Kafka outage" in line or "producer" in line])
    assert_outage_said(run)


def outage_lines(run: Run) -> list[str]:
    """The worker's "Kafka outage" log lines (pipeline/delivery/outage_log.py)."""
    log = run.worker.log_path.read_text(errors="replace")
    return [line for line in log.splitlines() if "Kafka outage" in line]


def assert_outage_said(run: Run) -> None:
    """The outage is in the worker's log, in a few lines: its start, one per 10 s, its end."""
    lines = outage_lines(run)
    assert any("Kafka outage:" in line for line in lines), run.worker.log_tail(60)
    assert any("Kafka outage over after" in line for line in lines), run.worker.log_tail(60)
    assert len(lines) <= 8, lines  # not a storm


def test_quorum_lost_for_20_s(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) -> None:
    with fault_run(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) as run:
        lose_quorum(run, kafka_cluster, "quorum_lost_20s", seed=15)


def test_quorum_lost_for_20_s_exactly_once(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) -> None:
    """The case that exited 1 or hung for 10 minutes (issue 49): records time out in the
    open transaction, the epoch bump cannot finish, the producer is fenced; the same
    worker renews its producer and goes on, read_committed readers see each request once.
    With outage_after_s 15 s, above transaction_timeout_ms (10 s): the records aborted
    and sent again go on waiting, so the 20 s outage is still said (a CI run saw none
    when each abort started the wait afresh)."""
    with fault_run(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path,
                   worker_env={"TIDEBATCH_DELIVERY": "exactly_once", **FAILOVER}) as run:
        lose_quorum(run, kafka_cluster, "quorum_lost_20s_exactly_once", seed=16, exactly_once=True)


DRAIN_S = 8.0  # the SIGTERM test's drain_timeout_s: short, so the bound below is short too


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_sigterm_with_every_broker_gone(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path,
                                        delivery: str) -> None:
    """Every node SIGKILLed under traffic (a test cluster torn down under the worker),
    then SIGTERM: the worker exits within drain_timeout_s + 5 s in whatever state the
    dead cluster left it (issue 49: an exactly_once worker did not exit within 35 s,
    its main thread inside librdkafka, where Python runs no signal handler). The
    bound is the one the issue asks for, not a performance figure: the watchdog
    (pipeline/delivery/watchdog.py) ends the process at drain_timeout_s + 4 s."""
    with fault_run(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path,
                   worker_env={"TIDEBATCH_DELIVERY": delivery, "TIDEBATCH_DRAIN_TIMEOUT_S": str(DRAIN_S)}) as run:
        traffic(run, seed=17)
        run.pause(4)
        for node in kafka_cluster.nodes:
            kafka_cluster.kill(node)
        run.pause(15)  # records time out in the open transaction; the loop sits in its calls
        began = time.monotonic()
        code = run.worker.stop(timeout=DRAIN_S + 30)
        took = time.monotonic() - began
        print(f"\nSIGTERM {json.dumps({'delivery': delivery, 'exit': code, 'seconds': round(took, 1)})}")
        # Back whole before the topics are deleted and the next test runs.
        kafka_cluster.restart_many(kafka_cluster.nodes)
        kafka_cluster.wait_in_sync()
        assert took <= DRAIN_S + 5, f"exited {took:.1f} s after SIGTERM ({code}):\n{run.worker.log_tail()}"
        assert code in (0, 1), run.worker.log_tail()
