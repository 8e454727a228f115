"""Rebalancing the way production does it (issue 16, part 3), on real Apache Kafka:
three `tidebatch run` workers on a 12-partition topic while requests flow at a steady
rate; workers join one by one, one leaves (SIGTERM), one is SIGKILLed and restarted.
Every request gets its outcome (duplicates only as replays of the partitions whose
worker was SIGKILLed: a revoke and a clean SIGTERM commit their work first),
and at each step the partitions that moved are what the protocol promises.

Moves are read from the workers' own `assigned [...]` / `revoked [...]` log lines (the
rebalance callbacks, pipeline/delivery/partitions.py), steps are settled from `/api/stats`. Each
step's figures are printed as one `REBALANCE {json}` line (pytest -s shows them;
docs/OPERATIONS.md, "Rebalancing", has the measured spread).

Modes:
- cooperative: classic protocol, cooperative-sticky (the default). A join revokes only
  what the newcomer gets; nobody else stops.
- consumer: KIP-848 (group.protocol=consumer): the broker assigns; the same promise.
- static (classic) and static-consumer (KIP-848): group.instance.id per worker. A
  member restarted within the session timeout gets the same partitions back and the
  others see nothing: after SIGTERM on both, after SIGKILL on classic only (KIP-848
  refuses the id until the dead holder's session ends). A static member does not
  leave the group on SIGTERM: its partitions wait for the session timeout, the price
  of not rebalancing on restarts.
"""

from __future__ import annotations

import ast
import json
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from consumers.profiles import KAFKA, producer_config
from pipeline.registry.pipelines import get_pipeline
from tests.integration.opsutil import (
    ResultCollector,
    Topics,
    WorkerProcess,
    start_worker_process,
    wait_for,
)

PARTITIONS = 12
RATE = 40  # requests/s: steady, far below what three workers on two cores can score
TP = tuple[str, int]
_EVENT = re.compile(r"\b(assigned|revoked) (\[.*\])\s*$")

# Classic groups: a SIGKILLed member is noticed after the session timeout. Static
# members get longer, so that a restart (process start + model load on a busy 2-core
# machine) lands within it; their SIGTERM step waits for it in full.
MODES: dict[str, dict[str, Any]] = {
    "cooperative": {"args": (), "env": {"TIDEBATCH_SESSION_TIMEOUT_MS": "6000"}, "static": False},
    # Session timeout and heartbeats are the broker's (group.consumer.*: 6 s / 1 s in
    # the local harness, consumers/brokers/kafka.py).
    "consumer": {"args": ("--group-protocol", "consumer"), "env": {}, "static": False},
    "static": {"args": (), "env": {"TIDEBATCH_SESSION_TIMEOUT_MS": "10000"}, "static": True},
    # KIP-848 + static membership: the session timeout is a group config on the broker
    # (Kafka 4.0 takes it per group: consumer.session.timeout.ms).
    "static-consumer": {
        "args": ("--group-protocol", "consumer"), "env": {}, "static": True,
        "group_config": {"consumer.session.timeout.ms": "10000"},
    },
}


def set_group_config(bootstrap: str, group_id: str, settings: dict[str, str]) -> None:
    """Per-group broker settings (KIP-848 groups), set before the first member joins."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in settings.items()]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group_id, incremental_configs=entries)]).values():
        future.result(timeout=30)


class PacedProducer:
    """CTR requests at a steady rate from a thread, until stop(); remembers their ids."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.ids: list[str] = []
        self.errors: list[str] = []
        self._producer = Producer(producer_config(KAFKA, bootstrap))
        self._topic = topic
        self._make = get_pipeline("ctr").make_samples(53)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="paced-producer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        start = time.monotonic()
        i = 0
        while not self._stop.is_set():
            key, value, headers = self._make(i)
            self._producer.produce(
                self._topic, value=value, key=key, headers=headers or None,
                on_delivery=lambda err, _m: err and self.errors.append(str(err)),
            )
            self.ids.append(orjson.loads(value)["request_id"])
            self._producer.poll(0)
            i += 1
            # Paced against the start, so a slow moment does not lower the rate.
            self._stop.wait(max(start + i / RATE - time.monotonic(), 0))

    def halt(self) -> None:
        self._stop.set()

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(timeout=10)
        assert self._producer.flush(30) == 0 and not self.errors, self.errors[:3]
        return self.ids


def events(worker: WorkerProcess) -> list[tuple[str, list[TP]]]:
    """The worker's rebalance callbacks, in order, from its log."""
    out = []
    try:
        lines = worker.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        match = _EVENT.search(line)
        if match:
            out.append((match.group(1), [tuple(tp) for tp in ast.literal_eval(match.group(2))]))
    return out


class Group:
    """The test's workers by name, their log positions, and the steps' figures."""

    def __init__(self, kafka_broker, topics: Topics, group_id: str, log_dir: Path, mode: str) -> None:
        self.broker, self.topics, self.group_id, self.log_dir, self.mode = kafka_broker, topics, group_id, log_dir, mode
        self.workers: dict[str, WorkerProcess] = {}
        self.seen: dict[str, int] = {}  # log events already accounted to earlier steps
        self.owner: dict[str, set[TP]] = {}
        self.steps: list[dict[str, Any]] = []
        self.moved: set[int] = set()  # partitions that changed owner at any step
        self.crashed: set[int] = set()  # partitions of a SIGKILLed worker
        self.restarts = Counter[str]()

    def start(self, name: str) -> WorkerProcess:
        spec = MODES[self.mode]
        args = tuple(spec["args"])
        if spec["static"]:
            args += ("--group-instance-id", f"{self.group_id}-{name}")
        self.restarts[name] += 1
        log_name = name if self.restarts[name] == 1 else f"{name}-run{self.restarts[name]}"
        worker = start_worker_process(
            self.broker, self.topics, self.group_id, self.log_dir, log_name, args=args,
            **spec["env"],
        )
        worker.name = name
        self.workers[name] = worker
        self.seen[name] = 0
        return worker

    def live(self) -> dict[str, WorkerProcess]:
        return {n: w for n, w in self.workers.items() if w.proc.poll() is None}

    def settle(self, what: str, expect: dict[str, set[TP]] | None = None, timeout: float = 90.0) -> dict[str, set[TP]]:
        """Wait until the live workers own every partition once, evenly (or exactly
        `expect`), the same on two reads in a row; returns the ownership."""
        last: list[dict[str, set[TP]] | None] = [None]

        def check() -> dict[str, set[TP]] | None:
            owned = {}
            for name, w in self.live().items():
                parts = w.assigned()
                if parts is None:
                    return None
                owned[name] = set(parts)
            sizes = [len(p) for p in owned.values()]
            union = set().union(*owned.values()) if owned else set()
            ok = sum(sizes) == PARTITIONS == len(union) and max(sizes) - min(sizes) <= 1
            if expect is not None:
                ok = ok and owned == expect
            stable = ok and owned == last[0]
            last[0] = owned if ok else None
            return owned if stable else None

        try:
            return wait_for(check, timeout, what, interval=0.5)
        except AssertionError as exc:
            tails = "\n".join(f"--- {w.name} (exit {w.proc.poll()}):\n{w.log_tail(15)}" for w in self.workers.values())
            raise AssertionError(f"{exc}\n{tails}") from None

    def step(self, label: str, owned: dict[str, set[TP]], changed: str | None = None) -> dict[str, Any]:
        """Account the callbacks since the last step: `changed` is the worker that
        joined, left or restarted; every other live worker is a stayer."""
        revoked_on_stayers: dict[str, list[int]] = {}
        assigned: dict[str, list[int]] = {}
        for name, w in self.workers.items():
            evs = events(w)
            new, self.seen[name] = evs[self.seen[name]:], len(evs)
            rev = sorted(p for kind, tps in new if kind == "revoked" for _, p in tps)
            got = sorted(p for kind, tps in new if kind == "assigned" for _, p in tps)
            if rev and name != changed:
                revoked_on_stayers[name] = rev
            if got:
                assigned[name] = got
        before = self.owner
        moved = sorted(
            p for name, parts in owned.items() for _, p in parts - before.get(name, set())
        )
        self.moved.update(moved)
        record = {
            "mode": self.mode, "step": label, "moved": len(moved), "moved_partitions": moved,
            "revoked_on_stayers": revoked_on_stayers, "assigned": assigned,
            "owners": {n: sorted(p for _, p in parts) for n, parts in sorted(owned.items())},
        }
        print("REBALANCE " + json.dumps(record, sort_keys=True), flush=True)
        self.steps.append(record)
        self.owner = owned
        return record

    def close(self) -> list[int | None]:
        codes = []
        for w in self.workers.values():  # one at a time, each gone before the next leaves
            codes.append(w.stop() if w.proc.poll() is None else None)
        return codes


def _assert_join(record: dict[str, Any], owned: dict[str, set[TP]], before: dict[str, set[TP]], joiner: str) -> None:
    """Cooperative / KIP-848: the stayers give up exactly what the newcomer gets, keep
    everything else, and nothing moves between stayers."""
    gained = sorted(p for _, p in owned[joiner])
    revoked = sorted(p for parts in record["revoked_on_stayers"].values() for p in parts)
    assert revoked == gained, record
    for name, parts in owned.items():
        if name != joiner:
            assert parts <= before[name], (name, record)
    assert record["moved"] == len(gained), record


def _assert_departure(record: dict[str, Any], owned: dict[str, set[TP]], before: dict[str, set[TP]], gone: str) -> None:
    """A member left or died: only its partitions move; no stayer revokes anything."""
    assert record["revoked_on_stayers"] == {}, record
    for name, parts in owned.items():
        assert before[name] <= parts, (name, record)
    assert sorted(p for _, p in before[gone]) == record["moved_partitions"], record


def _assert_nothing_moved(record: dict[str, Any], restarted: str) -> None:
    """Static membership: the restarted member got its own partitions back and no
    other member saw a callback."""
    assert record["moved"] == 0 and record["revoked_on_stayers"] == {}, record
    assert record["assigned"].keys() <= {restarted}, record


@pytest.mark.parametrize("mode", list(MODES))
def test_rebalance_moves_only_what_the_protocol_promises(
    mode: str, kafka_broker, kafka_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = Topics(
        kafka_topic_factory("rb-req", PARTITIONS), kafka_topic_factory("rb-res", PARTITIONS),
        kafka_topic_factory("rb-dlq", 1), kafka_topic_factory("rb-late", 1),
    )
    if MODES[mode].get("group_config"):
        set_group_config(kafka_broker.bootstrap_servers, unique_group_id, MODES[mode]["group_config"])
    group = Group(kafka_broker, topics, unique_group_id, tmp_path, mode)
    outcomes = ResultCollector(kafka_broker.bootstrap_servers, topics.output, profile=KAFKA)
    producer = PacedProducer(kafka_broker.bootstrap_servers, topics.input)
    codes: list[int | None] = []
    try:
        # Joins, one by one, with requests flowing.
        group.start("w0")
        owned = group.settle("w0 to own all 12 partitions")
        group.step("w0 joins", owned, "w0")
        for name in ("w1", "w2"):
            before = owned
            group.start(name)
            owned = group.settle(f"{name} to get its share")
            _assert_join(group.step(f"{name} joins", owned, name), owned, before, name)

        static = MODES[mode]["static"]
        kip848 = "--group-protocol" in MODES[mode]["args"]
        if static:
            # A rolling restart: SIGTERM, start again within the session timeout. The
            # static member keeps its partitions meanwhile and gets them back.
            before = owned
            assert group.workers["w1"].stop() == 0, group.workers["w1"].log_tail()
            group.start("w1")
            owned = group.settle("the restarted w1 to get its partitions back", expect=before)
            _assert_nothing_moved(group.step("w1 restarted (SIGTERM, start)", owned, "w1"), "w1")

        # w2 crashes (SIGKILL) and is restarted.
        before = owned
        victim = group.workers["w2"]
        victim.kill(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        group.crashed.update(p for _, p in before["w2"])
        if static and not kip848:
            # Classic static membership: the new process replaces the dead one at once.
            group.start("w2")
            owned = group.settle("w2 to get its partitions back", expect=before)
            _assert_nothing_moved(group.step("w2 SIGKILLed and restarted", owned, "w2"), "w2")
        else:
            if static:
                # KIP-848 refuses a static member's id while the crashed holder's
                # session lasts (UNRELEASED_INSTANCE_ID): a fatal error, so the worker
                # exits 1 and its supervisor starts it again later.
                early = group.start("w2")
                assert early.proc.wait(timeout=60) == 1, early.log_tail()
                assert "instance ID is still used" in early.log_path.read_text(), early.log_tail()
            owned = group.settle("the others to take the crashed w2's partitions after the session timeout")
            _assert_departure(group.step("w2 SIGKILLed", owned, "w2"), owned, before, "w2")
            before = owned
            group.start("w2")
            owned = group.settle("the restarted w2 to get its share")
            _assert_join(group.step("w2 restarted", owned, "w2"), owned, before, "w2")

        # w1 leaves for good (SIGTERM): it finishes its work, commits, leaves. A static
        # member does not leave the group: its partitions wait for the session timeout.
        before = owned
        assert group.workers["w1"].stop() == 0, group.workers["w1"].log_tail()
        owned = group.settle("the others to take w1's partitions")
        _assert_departure(group.step("w1 leaves (SIGTERM)", owned, "w1"), owned, before, "w1")

        ids = producer.stop()
        wait_for(lambda: not outcomes.missing(ids), 120, f"an outcome for each of {len(ids)} requests", interval=0.5)
        time.sleep(2.0)  # a late second outcome of any request would show up by now
        duplicated = outcomes.duplicated()
        replayed = {outcomes.partition[rid] for rid in duplicated}
        print(
            "REBALANCE " + json.dumps({
                "mode": mode, "step": "end", "requests": len(ids), "missing": 0,
                "duplicates": sum(n - 1 for n in duplicated.values()), "duplicate_partitions": sorted(replayed),
            }),
            flush=True,
        )
        # At-least-once: a request is scored twice only where its worker was SIGKILLed
        # (uncommitted work). A revoke finishes and commits its partitions' work before
        # they move, and a clean SIGTERM commits before it leaves, so neither replays
        # (this allowed moved partitions too while a commit refused mid-rebalance was
        # not retried: OffsetTracker.committed() is only told once Kafka confirms).
        assert replayed <= group.crashed, (sorted(replayed), sorted(group.crashed), sorted(group.moved))
    finally:
        producer.halt()
        outcomes.close()
        codes = group.close()
    assert all(code in (0, None) for code in codes), codes
