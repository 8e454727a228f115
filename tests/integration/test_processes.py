"""`tidebatch run --processes 2` (pipeline/app/children.py) through faults, on real
brokers: every request gets an outcome and nothing is lost when

- (basic, both brokers) the two children share the partitions behind the parent's one
  ops port, and one SIGTERM to the parent drains both (exit 0, offsets committed);
- (a) a child is SIGKILLed mid-backlog: the restart policy starts it again and the
  requests its partitions had not committed are redelivered (at_least_once: one or
  more outcomes each);
- (b) the parent is SIGKILLed: its children die with it (PR_SET_PDEATHSIG) and a new
  `run --processes 2` finishes the backlog;
- (c) SIGTERM mid-backlog drains all: exit 0, and a restart repeats nothing;
- (d) exactly_once with children killed (chaos): exactly one read_committed outcome
  per request (each child's own transactional.id fences its dead predecessor).

Timings are never asserted. Each fault test prints one `PROCESSES {...}` line.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import time

import pytest

from tests.integration import opsutil
from tests.integration.conftest import BOTH_BROKERS
from tests.integration.pipeline_helpers import QUICK_EVICTION_ENV, committed_offsets
from tests.integration.test_exactly_once import Readers, report
from tests.integration.traffic import PacedProducer

pytestmark = pytest.mark.integration

PARTITIONS = 4
BACKLOG = 10_000  # a few seconds of drain on 2 cores: a kill at a tenth lands mid-backlog


def start_host(broker, topics, group: str, tmp_path, name: str, *args: str, **env: str) -> opsutil.WorkerProcess:
    return opsutil.start_worker_process(broker, topics, group, tmp_path, name,
                                        args=("--processes", "2", *args), **{**QUICK_EVICTION_ENV, **env})


def processes(host: opsutil.WorkerProcess) -> list[dict]:
    """The host's children as its /api/stats lists them ([] while it does not answer)."""
    try:
        _, stats = opsutil.get_json(host.url + "/api/stats")
    except (OSError, ValueError):
        return []
    return stats["worker"].get("processes", [])


def alive(host: opsutil.WorkerProcess) -> None:
    code = host.proc.poll()
    assert code is None, f"{host.name} exited ({code}):\n{host.log_tail(60)}"


def wait(host: opsutil.WorkerProcess, check, timeout: float, what: str):
    try:
        return opsutil.wait_for(lambda: alive(host) or check(), timeout, what, interval=0.25)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- {host.name}:\n{host.log_tail(60)}") from None


def shared(host: opsutil.WorkerProcess) -> bool:
    """Both children ready, owning every partition between them."""
    ps = processes(host)
    return len(ps) == 2 and all(p["ready"] for p in ps) and sum(len(p["assigned"] or []) for p in ps) == PARTITIONS


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (not reaped yet: its parent died too, init reaps it) is gone as well.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def note(record: dict) -> None:
    print(f"\nPROCESSES {json.dumps(record)}")


# ----------------------------------------------------------------------------- basic
@pytest.mark.parametrize("broker", BOTH_BROKERS, indirect=True)
def test_two_processes_behind_one_port_drain_on_sigterm(broker, topic_factory, unique_group_id, tmp_path) -> None:
    topics = opsutil.make_topics(topic_factory, PARTITIONS)
    host = start_host(broker, topics, unique_group_id, tmp_path, "host")
    collector = opsutil.ResultCollector(broker.bootstrap_servers, topics.output)
    try:
        wait(host, lambda: shared(host), 120, "two processes sharing every partition")
        ready = opsutil.wait_ready(host.url)
        assert ready["processes"] == 2
        ids = opsutil.produce_ctr(broker.bootstrap_servers, topics.input, 400, seed=46)
        wait(host, lambda: not collector.missing(ids), 120, "a result for each request")
        # `tidebatch status` reads the whole host from its one port.
        from pipeline.ops.status_report import from_workers, metrics_url

        stats = from_workers([metrics_url(host.url)], 0.5).pipelines[0].stats
        assert stats is not None and (stats.assigned, stats.ready) == (PARTITIONS, 2)
        status, _, text = opsutil.http_get(host.url + "/metrics")
        assert status == 200
        assert 'tidebatch_assigned_partitions{pipeline="ctr",process="1"}' in text
        assert "tidebatch_host_processes" in text
        code = host.stop()
        assert code == 0, host.log_tail(60)
    finally:
        collector.close()
        host.kill()
    assert "[p0]" in host.log_path.read_text() and "[p1]" in host.log_path.read_text()
    offsets = committed_offsets(broker.bootstrap_servers, unique_group_id, topics.input, PARTITIONS)
    assert sum(offsets.values()) == len(ids), offsets
    assert collector.duplicates() == 0


# ----------------------------------------------------------------------------- (a)
def test_a_child_sigkilled_mid_backlog_is_restarted(kafka_broker, kafka_topic_factory, unique_group_id,
                                                    tmp_path) -> None:
    topics = opsutil.make_topics(kafka_topic_factory, PARTITIONS)
    host = start_host(kafka_broker, topics, unique_group_id, tmp_path, "host")
    collector = opsutil.ResultCollector(kafka_broker.bootstrap_servers, topics.output)
    try:
        wait(host, lambda: shared(host), 120, "two processes sharing every partition")
        ids = opsutil.produce_ctr(kafka_broker.bootstrap_servers, topics.input, BACKLOG, seed=47)
        wait(host, lambda: len(ids) - len(collector.missing(ids)) >= BACKLOG // 10, 60, "the first results")
        victim = processes(host)[0]
        os.kill(victim["pid"], signal.SIGKILL)

        def names_child_0() -> bool:  # /readyz: 503 naming the child until it is back
            status, body = opsutil.get_json(host.url + "/readyz")
            return status == 503 and "0" in body.get("not_ready", {})

        wait(host, names_child_0, 10, "/readyz to name process 0 as not ready")
        wait(host, lambda: (p := processes(host)) and p[0]["restarts"] == 1 and p[0]["pid"] != victim["pid"],
             30, "the child restarted")
        wait(host, lambda: not collector.missing(ids), 180, "a result for each request")
        wait(host, lambda: shared(host), 120, "both processes ready again")
        code = host.stop()
        assert code == 0, host.log_tail(60)
    finally:
        collector.close()
        host.kill()
    log = host.log_path.read_text()
    assert f"process 0 (pid {victim['pid']}) died: signal SIGKILL; restart 1 of 3" in log, log[-3000:]
    note({"test": "child_sigkill", "requests": len(ids), "missing": 0, "duplicates": collector.duplicates()})


# ----------------------------------------------------------------------------- (b)
def test_parent_sigkilled_takes_its_children_and_a_new_host_finishes(kafka_broker, kafka_topic_factory,
                                                                     unique_group_id, tmp_path) -> None:
    topics = opsutil.make_topics(kafka_topic_factory, PARTITIONS)
    first = start_host(kafka_broker, topics, unique_group_id, tmp_path, "first")
    second = None
    collector = opsutil.ResultCollector(kafka_broker.bootstrap_servers, topics.output)
    try:
        wait(first, lambda: shared(first), 120, "two processes sharing every partition")
        pids = [p["pid"] for p in processes(first)]
        ids = opsutil.produce_ctr(kafka_broker.bootstrap_servers, topics.input, BACKLOG, seed=48)
        wait(first, lambda: len(ids) - len(collector.missing(ids)) >= BACKLOG // 10, 60, "the first results")
        first.kill(signal.SIGKILL)
        first.proc.wait(timeout=10)
        opsutil.wait_for(lambda: all(gone(pid) for pid in pids), 10, f"children {pids} to die with their parent")
        left = len(collector.missing(ids))  # what the second host has to do (0: the first finished)
        second = start_host(kafka_broker, topics, unique_group_id, tmp_path, "second")
        # Up before its SIGTERM: a host stopped while Python still imports dies of the
        # signal's default action (-15), as in CI once when the first had finished all.
        wait(second, lambda: shared(second), 120, "the second host's two processes sharing every partition")
        wait(second, lambda: not collector.missing(ids), 180, "a result for each request")
        code = second.stop()
        assert code == 0, second.log_tail(60)
    finally:
        collector.close()
        for h in (first, second):
            if h is not None:
                h.kill()
    note({"test": "parent_sigkill", "requests": len(ids), "left_to_the_second": left, "missing": 0,
          "duplicates": collector.duplicates()})


# ----------------------------------------------------------------------------- (c)
def test_sigterm_mid_backlog_drains_and_a_restart_repeats_nothing(kafka_broker, kafka_topic_factory,
                                                                  unique_group_id, tmp_path) -> None:
    topics = opsutil.make_topics(kafka_topic_factory, PARTITIONS)
    first = start_host(kafka_broker, topics, unique_group_id, tmp_path, "first")
    second = None
    collector = opsutil.ResultCollector(kafka_broker.bootstrap_servers, topics.output)
    try:
        wait(first, lambda: shared(first), 120, "two processes sharing every partition")
        ids = opsutil.produce_ctr(kafka_broker.bootstrap_servers, topics.input, BACKLOG, seed=49)
        wait(first, lambda: len(ids) - len(collector.missing(ids)) >= BACKLOG // 10, 60, "the first results")
        code = first.stop()
        assert code == 0, first.log_tail(60)
        time.sleep(2.0)  # what the drain wrote is read before the restart
        second = start_host(kafka_broker, topics, unique_group_id, tmp_path, "second")
        wait(second, lambda: not collector.missing(ids), 180, "a result for each request")
        wait(second, lambda: shared(second), 60, "the second host ready")
        time.sleep(2.0)  # a repeated result would show by now
        code = second.stop()
        assert code == 0, second.log_tail(60)
    finally:
        collector.close()
        for h in (first, second):
            if h is not None:
                h.kill()
    note({"test": "sigterm_drain", "requests": len(ids), "missing": 0, "duplicates": collector.duplicates()})
    assert collector.duplicates() == 0, collector.duplicated()


# ----------------------------------------------------------------------------- (d)
def test_exactly_once_with_children_killed(kafka_broker, kafka_topic_factory, unique_group_id, tmp_path) -> None:
    """Requests at 300/s for 20 s; a child SIGKILLed twice at seeded moments (the
    policy restarts it with the same transactional.id); one read_committed outcome each."""
    from tests.integration.test_exactly_once import PARTITIONS as EOS_PARTITIONS
    from tests.integration.test_exactly_once import await_outcomes, scenario

    rng = random.Random(46)
    with scenario(kafka_broker, kafka_topic_factory) as (topics, readers):
        assert isinstance(readers, Readers)
        host = opsutil.start_worker_process(
            kafka_broker, topics, unique_group_id, tmp_path, "host",
            args=("--processes", "2", "--delivery", "exactly_once"), **QUICK_EVICTION_ENV)
        kills = []
        try:
            def both_ready() -> bool:
                ps = processes(host)
                return len(ps) == 2 and all(p["ready"] for p in ps) and \
                    sum(len(p["assigned"] or []) for p in ps) == EOS_PARTITIONS

            wait(host, both_ready, 120, "two processes sharing every partition")
            producer = PacedProducer(kafka_broker.bootstrap_servers, topics.input, 20.0, seed=46, rate=300).start()
            for _ in range(2):
                time.sleep(rng.uniform(3.0, 6.0))
                alive(host)
                ps = processes(host)
                victim = ps[rng.randrange(len(ps))]
                with contextlib.suppress(ProcessLookupError, TypeError):  # restarting just now
                    os.kill(victim["pid"], signal.SIGKILL)
                    kills.append(victim["index"])
            ids = await_outcomes(producer, readers, lambda: alive(host))
            code = host.stop()
            assert code == 0, host.log_tail(60)
        finally:
            host.kill()
        committed, uncommitted = readers.close(linger=1.5)
    report("processes_exactly_once_chaos", ids, committed, uncommitted, kills=kills, host_log=str(host.log_path))
    # One transactional.id per child index, the same in each of its restarts.
    starts = re.findall(r"\[p(\d+)\] \S+: transactional\.id (\S+) \(delivery", host.log_path.read_text())
    by_index: dict[str, list[str]] = {}
    for index, tid in starts:
        by_index.setdefault(index, []).append(tid)
    assert sorted(by_index) == ["0", "1"] and all(len(set(t)) == 1 for t in by_index.values()), by_index
    assert by_index["0"][0] != by_index["1"][0]
    assert all(len(by_index[str(i)]) >= 1 + kills.count(i) for i in (0, 1)), (by_index, kills)


# ----------------------------------------------------------------------------- policy
# The supervisor itself, with stand-in children (no broker): what it does when they die.
def _supervisor(script: str, restarts: int = 3, drain_s: float = 10.0):
    import sys

    from pipeline.app.children import Supervisor
    from pipeline.app.processes import RestartPolicy

    return Supervisor(2, [sys.executable, "-c", script], RestartPolicy(restarts, 600.0), drain_s=drain_s)


def test_a_child_exiting_2_stops_the_host_with_2() -> None:
    sup = _supervisor("import os, sys, time; sys.exit(2) if os.environ['TIDEBATCH_CHILD_INDEX'] == '1' else time.sleep(60)")
    try:
        assert sup.start().run() == 2
    finally:
        sup.close()
    assert sup.failed is not None and "process 1" in sup.failed[1] and "exit 2" in sup.failed[1]
    assert sup.children[1].restarts == 0


def test_restarts_beyond_the_policy_stop_the_host_with_1() -> None:
    sup = _supervisor("import sys; sys.exit(1)", restarts=2)
    try:
        assert sup.start().run() == 1
    finally:
        sup.close()
    assert sum(c.restarts for c in sup.children) == 2 and "runtime.child_restarts" in sup.failed[1]


def test_sigterm_is_forwarded_and_the_worst_exit_wins() -> None:
    script = ("import os, signal, sys, time\n"
              "code = int(os.environ['TIDEBATCH_CHILD_INDEX'])\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(code))\n"
              "time.sleep(60)")
    sup = _supervisor(script)
    try:
        sup.start()
        opsutil.wait_for(lambda: all(v.alive for v in sup.views()), 10, "children running")
        time.sleep(0.5)  # their handlers installed
        sup.stop("test")
        assert sup.run() == 1  # child 0 exits 0, child 1 exits 1
    finally:
        sup.close()
    assert all(c.restarts == 0 for c in sup.children)


class FakeModelHost:
    """The model host's shape (pipeline/app/children.py ModelHost): dies once."""

    address = "/tmp/tidebatch-model-host.sock"
    pid = 4242

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def alive(self) -> bool:
        return self.calls.count("restart") > 0

    def restart(self) -> None:
        self.calls.append("restart")

    def stop(self) -> None:
        self.calls.append("stop")

    def stats(self) -> dict:
        return {}


def test_children_find_the_model_host_which_is_restarted_when_it_dies(tmp_path) -> None:
    import sys

    from pipeline.app.children import Supervisor
    from pipeline.app.processes import RestartPolicy

    host = FakeModelHost()
    script = (f"import os, time; open(r'{tmp_path}/' + os.environ['TIDEBATCH_CHILD_INDEX'], 'w')"
              ".write(os.environ['TIDEBATCH_MODEL_HOST']); time.sleep(60)")
    sup = Supervisor(2, [sys.executable, "-c", script], RestartPolicy(3, 600.0), drain_s=10.0, model_host=host)
    try:
        sup.start()
        opsutil.wait_for(lambda: (tmp_path / "0").is_file() and (tmp_path / "1").is_file(), 10, "children")
        sup.check()
        sup.stop("test")
        assert sup.run() == 0  # ended by the SIGTERM it was sent (no handler yet): nothing lost
    finally:
        sup.close()
    assert (tmp_path / "1").read_text() == host.address
    assert host.calls == ["start", "restart", "stop"]


def test_the_host_port_keeps_the_configured_auth() -> None:
    """metrics.auth applies to the parent's port as to a worker's (probes open)."""
    from pipeline.ops.host_http import HostOpsServer
    from pipeline.ops.http_config import HttpAuthConfig, MetricsConfig

    metrics = MetricsConfig(port=0, auth=HttpAuthConfig(bearer_token="s3cret", protect_metrics=True))
    server = HostOpsServer(metrics, "ctr", lambda: [], "child-token").start()
    try:
        assert opsutil.http_get(server.url + "/metrics")[0] == 401
        assert opsutil.http_get(server.url + "/api/stats")[0] == 401
        status, _, body = opsutil.http_get(server.url + "/readyz")
        assert status == 503 and "s3cret" not in body
        ok = opsutil.http_get(server.url + "/metrics", headers={"Authorization": "Bearer s3cret"})
        assert ok[0] == 200 and "tidebatch_host_processes" in ok[2]
    finally:
        server.stop()
