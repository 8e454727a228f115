"""Exactly-once scoring (issue 18, `delivery: exactly_once`) on Apache Kafka, proven
with `tidebatch run` worker processes that are killed, restarted and paused while CTR
requests flow at a steady rate:

- chaos loop (3-node cluster): the worker is SIGKILLed and restarted, with the same
  group.instance.id and transactional.id, at seeded random intervals for CHAOS_S
  seconds; and the same while the input partition's leader node is SIGKILLed once mid-run;
- zombie (one node): two workers in a group, one SIGSTOPped until the other owns its
  partitions, then SIGCONTed, with the zombie's transaction timed out by the broker or
  still open when it wakes (then the group generation in its offset commit fences it);
- one kill (one node): a worker SIGKILLed once mid-way and restarted, exactly_once
  against at_least_once.

A reader with isolation.level read_committed (librdkafka's default, set explicitly:
what a downstream consumer of exactly-once output must use) reads the output,
dead-letter and late topics and must see exactly one outcome per request: none
missing, none twice. A read_uncommitted reader of the same topics counts the records
the aborted transactions left in the log (reported, not asserted): they are what the
transactions hide. Every worker stopped with SIGTERM must exit 0.

Each test prints a JSON line (`EOS {...}`) and appends it to out/faults/exactly_once.jsonl
(or $FAULT_TESTS_OUT, as test_cluster_faults.py). Timings are never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from consumers.brokers.embedded import LocalBroker
from consumers.brokers.kafka import KafkaBroker
from tests.integration import opsutil
from tests.integration.traffic import OutcomeCollector, Outcomes, PacedProducer

pytestmark = pytest.mark.integration

PARTITIONS = 3
RATE = 200  # requests/s
CHAOS_S = 60.0  # traffic (and worker kills) in each chaos test
KILL_EVERY_S = (3.0, 8.0)  # a worker's life: uniform in this range, from a seeded Random
LEADER_DOWN_S = 6.0  # the leader kill: restarted after this
ZOMBIE_S = 40.0  # traffic in each zombie test
ZOMBIE_SESSION_TIMEOUT_MS = 6000
ZOMBIE_STOPPED_AFTER_TAKEOVER_S = 3.0  # the zombie sleeps on after the other worker took over
# The broker aborts a transaction older than its timeout at its next check, every
# transaction.abort.timed.out.transaction.cleanup.interval.ms (Kafka's default 10 s).
BROKER_TXN_CHECK_S = 10.0
ONE_KILL_REQUESTS = 4000
ONE_KILL_RATE = 400
# After every request has an outcome: how long to keep reading so that a second one
# would show (a transaction commits every 100 ms by default).
SETTLE_S = 3.0
AFTER_STOP_S = 1.5  # and after the last SIGTERM
OUT = Path(os.environ.get("FAULT_TESTS_OUT", opsutil.REPO / "out" / "faults" / "exactly_once.jsonl"))


# ----------------------------------------------------------------------------- workers
@dataclass
class Identity:
    """A worker and how it is started again after a kill: the same group membership
    (with `instance_id`, static: the new process takes the old one's partitions at
    once) and the same transactional.id (it fences its predecessor and aborts the
    transaction that one left open as it starts, instead of after
    transaction_timeout_ms). `processes`: every process started, the current last."""

    broker: LocalBroker
    topics: opsutil.Topics
    group: str
    log_dir: Path
    name: str
    delivery: str = "exactly_once"
    instance_id: str | None = None
    transactional_id: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    processes: list[opsutil.WorkerProcess] = field(default_factory=list)

    def start(self) -> opsutil.WorkerProcess:
        args: tuple[str, ...] = ("--delivery", self.delivery)
        if self.instance_id:
            args += ("--group-instance-id", self.instance_id)
        env = dict(self.env)
        if self.transactional_id:
            env["TIDEBATCH_TRANSACTIONAL_ID"] = self.transactional_id
        worker = opsutil.start_worker_process(self.broker, self.topics, self.group, self.log_dir,
                                              f"{self.name}-{len(self.processes)}", args=args, **env)
        self.processes.append(worker)
        return worker

    @property
    def current(self) -> opsutil.WorkerProcess:
        return self.processes[-1]

    def alive(self) -> None:
        """The current process has not exited on its own."""
        code = self.current.proc.poll()
        assert code is None, f"{self.current.name} exited ({code}) by itself:\n{self.current.log_tail(60)}"

    def owns_all(self) -> bool:
        return len(self.current.assigned() or []) == PARTITIONS

    def kill(self) -> None:
        """SIGKILL the current process (it must still be running) and reap it."""
        self.alive()
        self.current.kill(signal.SIGKILL)
        self.current.proc.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM the current process: it drains, commits and exits."""
        return self.current.stop()

    def close(self) -> None:
        for worker in self.processes:
            worker.kill(signal.SIGKILL)
            with contextlib.suppress(Exception):
                worker.proc.wait(timeout=30)


# ----------------------------------------------------------------------------- readers
@dataclass
class Readers:
    """The same outcome topics read twice: read_committed (what a downstream consumer
    of exactly-once output sees) and read_uncommitted (aborted transactions included)."""

    committed: OutcomeCollector
    uncommitted: OutcomeCollector

    @classmethod
    def open(cls, bootstrap: str, topics: opsutil.Topics) -> Readers:
        return cls(OutcomeCollector(bootstrap, topics, PARTITIONS, isolation="read_committed"),
                   OutcomeCollector(bootstrap, topics, PARTITIONS, isolation="read_uncommitted"))

    def close(self, linger: float = 0.0) -> tuple[Outcomes, Outcomes]:
        """Stop reading, `linger` s from now: what the workers' last transactions
        (committed on SIGTERM) hold shows too."""
        time.sleep(linger)
        return self.committed.close(), self.uncommitted.close()


@contextlib.contextmanager
def scenario(broker: LocalBroker, topic_factory: Callable[..., str]) -> Iterator[tuple[opsutil.Topics, Readers]]:
    """Fresh topics (PARTITIONS input and output partitions) and both readers."""
    topics = opsutil.make_topics(topic_factory, PARTITIONS)
    readers = Readers.open(broker.bootstrap_servers, topics)
    try:
        yield topics, readers
    finally:
        readers.close()


def pause(seconds: float, alive: Callable[[], None]) -> None:
    """Sleep while checking that the workers that must live do."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive()
        time.sleep(0.2)


def await_outcomes(producer: PacedProducer, readers: Readers, alive: Callable[[], None]) -> list[str]:
    """Wait for the traffic to end and for a read_committed outcome of every request,
    then SETTLE_S more (a second outcome would show). The delivered request ids."""
    while producer.running:
        pause(0.5, alive)
    assert not producer.errors, f"requests not delivered to Kafka: {producer.errors[:3]}"
    ids = producer.delivered
    assert len(ids) == producer.count
    opsutil.wait_for(lambda: alive() or not readers.committed.missing(ids), 180,
                     "a read_committed outcome for every request")
    pause(SETTLE_S, alive)
    return ids


def report(name: str, ids: list[str], committed: Outcomes, uncommitted: Outcomes, *,
           exactly_once: bool = True, **extra: object) -> dict:
    """Print and append the counts, then check them: no request without an outcome;
    with exactly_once, none with two (read_committed). Read_uncommitted duplicates are
    only reported."""
    missing = [i for i in ids if i not in committed.kinds]
    doubled = committed.duplicated()
    doubled_at = committed.duplicated_where()
    record = {
        "test": name,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
        "requests": len(ids),
        "outcomes": committed.by_kind(),
        "missing": len(missing),
        "duplicates": committed.duplicates,
        "uncommitted_records": sum(len(k) for k in uncommitted.kinds.values()),
        "uncommitted_duplicates": uncommitted.duplicates,
        "uncommitted_missing": sum(1 for i in ids if i not in uncommitted.kinds),
        "duplicates_read_at": doubled_at,
    }
    print(f"\nEOS {json.dumps(record)}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    assert not missing, f"{len(missing)} requests without a read_committed outcome, e.g. {missing[:5]}"
    if exactly_once:
        assert not doubled, (
            f"{len(doubled)} requests with several read_committed outcomes, e.g. {list(doubled.items())[:5]}; "
            f"read at: {doubled_at}; workers' logs: "
            f"{ {k: v for k, v in extra.items() if k.endswith('_log')} }"
        )
    return record


def log_mentions(worker: opsutil.WorkerProcess, group: str, *words: str) -> list[str]:
    """The worker's log lines that mention any of `words` (case-insensitive) outside
    the group id (a test's name is in it), for reports."""
    try:
        lines = worker.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in lines if any(w in line.replace(group, "").lower() for w in words)]


# ----------------------------------------------------------------------------- one kill
@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_one_kill_single_broker(kafka_broker, kafka_topic_factory, unique_group_id, tmp_path, delivery) -> None:
    """ONE_KILL_REQUESTS requests at ONE_KILL_RATE/s; the worker is SIGKILLed once a
    third of them have outcomes (read_uncommitted) and restarted with the same identity.
    exactly_once: one read_committed outcome per request. at_least_once: none missing;
    the duplicates that the replay produced are reported (possible, not required)."""
    exactly = delivery == "exactly_once"
    with scenario(kafka_broker, kafka_topic_factory) as (topics, readers):
        worker = Identity(kafka_broker, topics, unique_group_id, tmp_path, "worker", delivery=delivery,
                          instance_id=f"{unique_group_id}-w",
                          transactional_id=f"{unique_group_id}-tx" if exactly else None)
        try:
            worker.start()
            opsutil.wait_for(lambda: worker.alive() or worker.owns_all(), 90, "the worker to own every partition")
            producer = PacedProducer(kafka_broker.bootstrap_servers, topics.input,
                                     ONE_KILL_REQUESTS / ONE_KILL_RATE, seed=184, rate=ONE_KILL_RATE).start()
            opsutil.wait_for(lambda: worker.alive() or readers.uncommitted.seen() >= ONE_KILL_REQUESTS // 3, 120,
                             "outcomes of a third of the requests")
            worker.kill()
            worker.start()
            ids = await_outcomes(producer, readers, worker.alive)
            code = worker.stop()
            assert code == 0, f"exit code {code} after SIGTERM:\n{worker.current.log_tail(60)}"
        finally:
            worker.close()
        committed, uncommitted = readers.close(linger=AFTER_STOP_S)
    report(f"one_kill_{delivery}", ids, committed, uncommitted, exactly_once=exactly, kills=1)


# ----------------------------------------------------------------------------- zombie
@pytest.mark.parametrize("transaction_timeout_ms, outsleep", [(10_000, True), (60_000, False)],
                         ids=["txn-timed-out-asleep", "txn-open-on-wake"])
def test_zombie_worker_is_fenced(kafka_broker, kafka_topic_factory, unique_group_id, tmp_path,
                                 transaction_timeout_ms, outsleep) -> None:
    """Two workers in one group (own transactional.ids, session timeout 6 s). One is
    SIGSTOPped until the other owns every partition, and a little longer, then
    SIGCONTed. "txn-open-on-wake": a 60 s transaction timeout, the zombie sleeps
    ZOMBIE_STOPPED_AFTER_TAKEOVER_S past the takeover, so its transaction is still
    open when it wakes and only the stale group generation in its offset commit
    (KIP-447) or its own rebalance handling keeps it from committing results the other
    worker has produced again. "txn-timed-out-asleep": a 10 s timeout and a sleep past
    it (and the broker's next check), so the broker has aborted the zombie's
    transaction and bumped its producer epoch by the time it wakes. Either way a
    read_committed reader sees one outcome per request. The zombie may carry on or
    exit (fenced): reported."""
    env = {"TIDEBATCH_SESSION_TIMEOUT_MS": str(ZOMBIE_SESSION_TIMEOUT_MS),
           "TIDEBATCH_TRANSACTION_TIMEOUT_MS": str(transaction_timeout_ms)}
    with scenario(kafka_broker, kafka_topic_factory) as (topics, readers):
        zombie = Identity(kafka_broker, topics, unique_group_id, tmp_path, "zombie",
                          transactional_id=f"{unique_group_id}-tx-a", env=env)
        other = Identity(kafka_broker, topics, unique_group_id, tmp_path, "other",
                         transactional_id=f"{unique_group_id}-tx-b", env=env)
        try:
            zombie.start()
            opsutil.wait_for(lambda: zombie.alive() or zombie.owns_all(), 90, "the first worker to own every partition")
            other.start()

            def both_own_some() -> bool:
                zombie.alive()
                other.alive()
                a, b = zombie.current.assigned() or [], other.current.assigned() or []
                return bool(a) and bool(b) and len(a) + len(b) == PARTITIONS

            opsutil.wait_for(both_own_some, 90, "both workers to own partitions")
            owned_before = len(zombie.current.assigned() or [])
            producer = PacedProducer(kafka_broker.bootstrap_servers, topics.input, ZOMBIE_S, seed=183,
                                     rate=RATE).start()
            pause(ZOMBIE_S / 6, other.alive)
            zombie.current.kill(signal.SIGSTOP)
            stopped, stopped_ms = time.monotonic(), int(time.time() * 1000)
            try:
                opsutil.wait_for(lambda: other.alive() or other.owns_all(), 90,
                                 "the other worker to take the zombie's partitions")
                pause(ZOMBIE_STOPPED_AFTER_TAKEOVER_S, other.alive)
                if outsleep:
                    pause(stopped + transaction_timeout_ms / 1000 + BROKER_TXN_CHECK_S + 3 - time.monotonic(),
                          other.alive)
            finally:
                zombie.current.kill(signal.SIGCONT)
                woke_ms = int(time.time() * 1000)
            stopped_s = round(time.monotonic() - stopped, 1)
            ids = await_outcomes(producer, readers, other.alive)
            zombie_exit = zombie.current.proc.poll()
            zombie_owns = None if zombie_exit is not None else len(zombie.current.assigned() or [])
            other_code = other.stop()
            assert other_code == 0, f"exit code {other_code} after SIGTERM:\n{other.current.log_tail(60)}"
            if zombie_exit is None:
                code = zombie.stop()
                assert code == 0, f"zombie exit code {code} after SIGTERM:\n{zombie.current.log_tail(60)}"
        finally:
            zombie.close()
            other.close()
        committed, uncommitted = readers.close(linger=AFTER_STOP_S)
    words = ("fenc", "abort", "generation", "fatal", "error", "sesstmout", "assigned", "revoked", "not committed",
             "dropped")
    notes = log_mentions(zombie.current, unique_group_id, *words)
    other_notes = log_mentions(other.current, unique_group_id, *words)
    report(f"zombie_{'txn_timed_out_asleep' if outsleep else 'txn_open_on_wake'}", ids, committed, uncommitted,
           transaction_timeout_ms=transaction_timeout_ms, zombie_owned_before=owned_before, stopped_s=stopped_s,
           stopped_at_ms=stopped_ms, woke_at_ms=woke_ms,
           zombie_exit_by_itself=zombie_exit, zombie_partitions_at_end=zombie_owns,
           zombie_log=notes[-16:], other_log=other_notes[-16:])


# ----------------------------------------------------------------------------- chaos
@dataclass
class LeaderKill:
    """SIGKILL the leader of the input's partition 0 at `at_s` into the traffic, restart
    it LEADER_DOWN_S later and wait until every replica is back in sync; in a thread,
    while the worker kills go on."""

    cluster: KafkaBroker
    topic: str
    at_s: float
    node: int | None = None
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    def start(self, began: float) -> LeaderKill:
        self._thread = threading.Thread(target=self._run, args=(began,), name="leader-kill", daemon=True)
        self._thread.start()
        return self

    def _run(self, began: float) -> None:
        try:
            time.sleep(max(0.0, began + self.at_s - time.monotonic()))
            victim = self.cluster.leader_of(self.topic, 0)
            self.node = victim.node_id
            self.cluster.kill(victim)
            time.sleep(LEADER_DOWN_S)
            self.cluster.restart(victim)
            self.cluster.wait_in_sync()
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join(timeout=180)
        assert not self._thread.is_alive(), "the leader kill did not finish"
        if self.error is not None:
            raise self.error


def chaos(cluster: KafkaBroker, topic_factory: Callable[..., str], group: str, tmp_path: Path,
          name: str, seed: int, *, leader_kill: bool) -> dict:
    """The chaos loop: traffic for CHAOS_S while the worker is SIGKILLed and restarted,
    each life lasting a seeded random KILL_EVERY_S and at least until it owned every
    input partition (so each kill lands on a worker that was scoring, with a
    transaction open). Then the last worker drains and is stopped with SIGTERM."""
    rng = random.Random(seed)
    with scenario(cluster, topic_factory) as (topics, readers):
        worker = Identity(cluster, topics, group, tmp_path, "worker",
                          instance_id=f"{group}-w", transactional_id=f"{group}-tx")
        fault: LeaderKill | None = None
        lives: list[float] = []
        try:
            worker.start()
            opsutil.wait_for(lambda: worker.alive() or worker.owns_all(), 90, "the worker to own every input partition")
            producer = PacedProducer(cluster.bootstrap_servers, topics.input, CHAOS_S, seed, rate=RATE).start()
            began = time.monotonic()
            if leader_kill:
                fault = LeaderKill(cluster, topics.input, CHAOS_S / 2).start(began)
            while producer.running:
                life = rng.uniform(*KILL_EVERY_S)
                born = time.monotonic()
                pause(life, worker.alive)
                opsutil.wait_for(lambda: worker.alive() or worker.owns_all() or not producer.running, 120,
                                 f"{worker.current.name} to own every input partition")
                if not producer.running:
                    break
                lives.append(round(time.monotonic() - born, 1))
                worker.kill()
                worker.start()
            ids = await_outcomes(producer, readers, worker.alive)
            if fault is not None:
                fault.join()
            code = worker.stop()
            assert code == 0, f"{worker.current.name} exit code {code} after SIGTERM:\n{worker.current.log_tail(60)}"
        finally:
            worker.close()
            for node in cluster.nodes:
                if not node.running:
                    cluster.restart(node)
        committed, uncommitted = readers.close(linger=AFTER_STOP_S)
    # Aborts the workers themselves logged (a commit refused or timed out); those of
    # killed workers' open transactions are done by their successors' init_transactions.
    aborts = sum(len(log_mentions(w, group, "transaction aborted")) for w in worker.processes)
    extra: dict[str, object] = {"seed": seed, "kills": len(lives), "lives_s": lives, "aborts_logged": aborts}
    if fault is not None:
        extra["leader_killed"] = fault.node
    return report(name, ids, committed, uncommitted, **extra)


def test_chaos_worker_kills(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path) -> None:
    """Issue 18's chaos loop: worker SIGKILLs only."""
    chaos(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path, "chaos_worker_kills", seed=181,
          leader_kill=False)


def test_chaos_worker_kills_and_input_leader_kill(kafka_cluster, cluster_topic_factory, unique_group_id,
                                                  tmp_path) -> None:
    """The same, and the input partition 0's leader node SIGKILLed once halfway (the
    worker kills go on meanwhile), restarted LEADER_DOWN_S later."""
    chaos(kafka_cluster, cluster_topic_factory, unique_group_id, tmp_path, "chaos_worker_and_leader_kills",
          seed=182, leader_kill=True)
