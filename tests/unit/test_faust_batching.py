"""The Faust batching helper without Faust: the pure core on a fake clock, and the
asyncio driver over a stand-in stream that records acks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.request import REASON_LATE, REASON_LINGER
from pipeline.clock import FakeClock
from pipeline.faust.batching import (
    REASON_REJECTED,
    AckGate,
    BatchMetrics,
    adaptive_batches,
    make_core,
)

WALL0 = 1_700_000_000_000  # wall clock (ms) at fake time 0


def wall(clock: FakeClock) -> int:
    return WALL0 + int(round(clock.now() * 1000))


# ----------------------------------------------------------------------------- core
def test_linger_counts_from_the_oldest_event_not_from_the_last_wait() -> None:
    clock = FakeClock()
    core = make_core("static", max_batch_rows=64, max_queue_delay_ms=10, slo_ms=1000)
    core.offer("a", now=clock.now(), now_wall_ms=wall(clock))
    assert core.next_batch(clock.now()) is None
    assert core.next_wakeup() == pytest.approx(0.010)
    clock.advance(0.006)
    core.offer("b", now=clock.now(), now_wall_ms=wall(clock))
    # Faust's take(within=10 ms) would restart its wait here and flush at 16 ms.
    assert core.next_batch(clock.now()) is None
    assert core.next_wakeup() == pytest.approx(0.010)
    clock.advance(0.0039)
    assert core.next_batch(clock.now()) is None
    clock.set(0.010)
    batch = core.next_batch(clock.now())
    assert batch is not None and batch.reason == REASON_LINGER
    assert [r.item.event for r in batch.requests] == ["a", "b"]


def test_acks_only_after_success_and_a_failure_teaches_the_cost_model_nothing() -> None:
    clock = FakeClock()
    cost = CostModel(prior=AffineCost(a=1e-3, b=1e-5))
    core = make_core("greedy", max_batch_rows=2, cost_model=cost)
    for name in ("a", "b", "c"):
        core.offer(name, now=clock.now(), now_wall_ms=wall(clock))
    first = core.next_batch(clock.now())
    assert first is not None and core.in_flight == 1
    # The body raised: nothing to ack, and the events are reported as left unacked.
    assert [p.event for p in core.fail(first)] == ["a", "b"]
    assert cost.observations(0) == 0
    with pytest.raises(ValueError):
        core.complete(first, 0.01)  # a failed batch can never be acked later
    second = core.next_batch(clock.now())
    assert second is not None
    assert [p.event for p in core.complete(second, 0.002)] == ["c"]
    assert cost.observations(0) == 1
    assert core.in_flight == 0


def test_deadline_is_the_kafka_timestamp_plus_the_slo() -> None:
    clock = FakeClock(100.0)
    core = make_core("adaptive", slo_ms=100, cost_model=CostModel(prior=AffineCost(a=1e-3, b=1e-6)))
    now_wall = wall(clock)
    fresh = core.offer("fresh", now=clock.now(), now_wall_ms=now_wall, timestamp_ms=now_wall - 20)
    tight = core.offer("tight", now=clock.now(), now_wall_ms=now_wall, timestamp_ms=now_wall - 20, deadline_ms=50)
    stale = core.offer("stale", now=clock.now(), now_wall_ms=now_wall, timestamp_ms=now_wall - 150)
    assert fresh.deadline_wall_ms == now_wall + 80
    assert tight.deadline_wall_ms == now_wall + 30  # the request's own budget only tightens
    assert stale.deadline_wall_ms == now_wall - 50
    batches = []
    while (b := core.next_batch(clock.now())) is not None:
        batches.append(b)
    in_time = [b for b in batches if not b.late]
    late = [b for b in batches if b.late]
    # Earliest deadline first among the in-time ones; the expired one in the late lane.
    assert [r.item.event for b in in_time for r in b.requests] == ["tight", "fresh"]
    assert [r.item.event for b in late for r in b.requests] == ["stale"]
    assert late[0].reason == REASON_LATE


def test_ack_gate_releases_in_offset_order_and_holds_behind_a_failure() -> None:
    gate = AckGate()
    tp = ("t", 0)
    for offset in range(5):
        gate.taken(tp, offset)
    assert gate.done(tp, 1, "e1") == []  # 0 is not done yet
    assert gate.done(tp, 0, "e0") == ["e0", "e1"]
    # Offset 2's batch failed: it is never done, so 3 and 4 are held, not acked.
    assert gate.done(tp, 3, "e3") == []
    assert gate.done(tp, 4, "e4") == []
    assert gate.held(tp) == 2
    # Another partition is independent.
    gate.taken(("t", 1), 7)
    assert gate.done(("t", 1), 7, "x7") == ["x7"]
    # A rebalance (new generation): Faust delivers from the committed offset again,
    # so the old entries stop blocking, and acks of the old generation are dropped.
    gate.taken(tp, 2, generation=2)
    assert gate.done(tp, 3, "old e3", generation=None) == []
    assert gate.done(tp, 2, "e2", generation=2) == ["e2"]
    assert gate.held() == 0


# ----------------------------------------------------------------------------- driver
@dataclass
class FakeMessage:
    topic: str
    partition: int
    offset: int
    timestamp: float | None = None
    headers: list = field(default_factory=list)
    generation_id: int | None = None


@dataclass(eq=False)
class FakeEvent:
    value: Any
    message: FakeMessage
    key: bytes | None = None


class FakeStream:
    """What the driver uses of a Faust stream: noack(), events(), ack(event)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[FakeEvent | None] = asyncio.Queue()
        self.acked: list[FakeEvent] = []
        self.noack_calls = 0
        self._offset = 0

    def noack(self) -> FakeStream:
        self.noack_calls += 1
        return self

    async def events(self):
        while True:
            ev = await self.queue.get()
            if ev is None:
                return
            yield ev

    async def ack(self, event: FakeEvent) -> bool:
        self.acked.append(event)
        return True

    def put(self, *values: Any) -> list[FakeEvent]:
        out = []
        for v in values:
            ev = FakeEvent(v, FakeMessage("t", 0, self._offset))
            self._offset += 1
            self.queue.put_nowait(ev)
            out.append(ev)
        return out


def test_driver_acks_a_batch_only_when_the_body_comes_back() -> None:
    async def main() -> None:
        stream = FakeStream()
        evs = stream.put(1, 2, 3)
        seen: list[list[int]] = []
        acked_during_body: list[int] = []
        async for batch in adaptive_batches(stream, policy="greedy", max_batch_rows=8):
            acked_during_body.append(len(stream.acked))
            seen.append(batch.values)
            if sum(len(s) for s in seen) == 3:
                stream.put(4)
            if sum(len(s) for s in seen) == 4:
                stream.queue.put_nowait(None)  # end of stream
        assert stream.noack_calls == 1
        assert seen[0] == [1, 2, 3]
        assert acked_during_body[0] == 0  # nothing acked while the first body ran
        assert acked_during_body[1] == 3  # the first batch was acked when the loop came back
        assert stream.acked[:3] == evs and len(stream.acked) == 4

    asyncio.run(main())


def test_driver_leaves_events_unacked_when_the_body_raises() -> None:
    async def main() -> None:
        stream = FakeStream()
        stream.put("a", "b")
        batches = adaptive_batches(stream, policy="greedy", max_batch_rows=8)

        async def agent() -> None:
            async for _batch in batches:
                stream.put("c")  # arrives while the failing body runs
                raise RuntimeError("body failed")

        task = asyncio.create_task(agent())
        with pytest.raises(RuntimeError, match="body failed"):
            await task
        assert stream.acked == []
        # The agent's task ended: the driver stopped reading, nothing is held back.
        assert batches._reader is not None
        await asyncio.wait({batches._reader}, timeout=5)
        assert batches._reader.done() and stream.acked == []
        assert batches.core.in_flight == 0

    asyncio.run(main())


def test_deferred_acks_wait_for_the_sends_and_a_failed_send_acks_nothing() -> None:
    async def main() -> None:
        stream = FakeStream()
        stream.put("a")
        loop = asyncio.get_running_loop()
        delivered = loop.create_future()
        batches = adaptive_batches(stream, policy="greedy", max_batch_rows=8)
        it = batches.__aiter__()
        first = await it.__anext__()
        first.defer_ack(delivered)
        stream.put("b")
        second = await it.__anext__()  # the next batch starts before the send completed
        assert second.values == ["b"]
        assert stream.acked == []
        delivered.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert [e.value for e in stream.acked] == ["a"]
        failed = loop.create_future()
        second.defer_ack(failed)
        stream.put("c")
        await it.__anext__()
        failed.set_exception(OSError("broker down"))
        with pytest.raises(OSError, match="broker down"):
            await it.__anext__()
        # "b" stays unacked, and so does "c" behind it although its body returned: an
        # ack after a gap would let Faust commit past "b" (see AckGate).
        assert [e.value for e in stream.acked] == ["a"]
        assert batches._gate.held(("t", 0)) == 1
        await batches.aclose()

    asyncio.run(main())


def test_invalid_input_rides_along_and_is_acked_with_the_batch() -> None:
    async def main() -> None:
        stream = FakeStream()
        stream.put(b"2", b"oops", b"3")
        metrics = BatchMetrics("test", "greedy")

        def prepare(event: FakeEvent) -> int:
            return int(event.value)  # ValueError for b"oops"

        got = []
        async for batch in adaptive_batches(
            stream, policy="greedy", max_batch_rows=8, prepare=prepare, rows=lambda n: n, metrics=metrics
        ):
            got.append((batch.prepared, batch.rows, [r.event.value for r in batch.rejected], batch.reason))
            if sum(len(g[0]) + len(g[2]) for g in got) == 3:
                stream.queue.put_nowait(None)
        assert got[0][0] == [2, 3] and got[0][1] == 5
        assert [v for g in got for v in g[2]] == [b"oops"]
        assert len(stream.acked) == 3
        value = metrics.registry.get_sample_value(
            "tidebatch_records_total", {"pipeline": "test", "topic": "t", "outcome": "dlq"}
        )
        assert value == 1.0
        rows = metrics.registry.get_sample_value(
            "tidebatch_batch_rows_sum", {"pipeline": "test", "policy": "greedy"}
        )
        assert rows == 5.0

    asyncio.run(main())


def test_only_rejected_events_make_a_batch_without_model_work() -> None:
    async def main() -> None:
        stream = FakeStream()
        stream.put(b"x")

        def prepare(event: FakeEvent) -> int:
            raise ValueError("bad")

        async for batch in adaptive_batches(stream, policy="adaptive", prepare=prepare):
            assert batch.reason == REASON_REJECTED and batch.items == [] and len(batch.rejected) == 1
            stream.queue.put_nowait(None)
        assert len(stream.acked) == 1

    asyncio.run(main())


# ----------------------------------------------------------------------------- app set-up
def test_faust_settings_per_broker_profile() -> None:
    from consumers.profiles import FAUST_FETCH_MAX_WAIT_MS, faust_app_settings

    embedded = faust_app_settings("embedded")
    kafka = faust_app_settings("kafka", {"stream_wait_empty": True})
    assert embedded["broker_session_timeout"] == 6.0 and embedded["producer_max_batch_size"] == 1048576
    assert "broker_session_timeout" not in kafka  # Apache Kafka keeps Faust's defaults
    assert kafka["stream_wait_empty"] is True  # overrides win
    assert embedded["stream_wait_empty"] is False
    assert FAUST_FETCH_MAX_WAIT_MS == {"kafka": None, "embedded": 5}


def test_embedded_app_gets_the_short_fetch_wait_transport() -> None:
    pytest.importorskip("faust")
    from pipeline.faust.app import make_app

    app = make_app("unit-embedded", "kafka://127.0.0.1:1", profile="embedded")
    assert app.conf.broker_session_timeout == 6.0
    thread = app.transport.Consumer._new_consumer_thread
    assert thread.__qualname__.startswith("_fetch_wait_transport")
    plain = make_app("unit-kafka", "kafka://127.0.0.1:1", profile="kafka")
    assert type(plain.transport).__module__ == "faust.transport.drivers.aiokafka"


# ----------------------------------------------------------------------------- tenants
# The worker's `tenants:` section, as a Faust user passes it: gold 50 % of 1000 rows/s
# with a 20 ms SLA; bronze 10 % (100 rows/s, a bucket of one 100 ms SLA: 10 rows) with a
# 200 rows/s ceiling (20 rows deep) beyond which it is shed; anyone else the helper's SLO.
TENANTS = {
    "capacity_rows_per_s": 1000,
    "classes": {
        "gold": {"share": 0.5, "slo_ms": 20, "members": ["acme"]},
        "bronze": {"share": 0.1, "slo_ms": 100, "ceiling_rows_per_s": 200, "beyond": "shed"},
    },
}


def test_tenant_classes_give_each_event_its_class_sla_and_shed_a_flood_over_its_ceiling() -> None:
    from pipeline.batching.request import RULE_OVER_CEILING

    clock = FakeClock(5.0)
    core = make_core("adaptive", slo_ms=50, max_batch_rows=12, tenants=TENANTS,
                     cost_model=CostModel(prior=AffineCost(a=1e-4, b=1e-6)))
    now_wall = wall(clock)
    flood = [core.offer(f"b{i}", now=clock.now(), now_wall_ms=now_wall, tenant="bronze") for i in range(50)]
    gold = [core.offer(f"g{i}", now=clock.now(), now_wall_ms=now_wall, tenant="acme") for i in range(5)]
    other = core.offer("x", now=clock.now(), now_wall_ms=now_wall, tenant="someone")
    assert {p.tenant_class for p in gold} == {"gold"} and other.tenant_class == "default"
    assert gold[0].deadline_wall_ms == now_wall + 20 and flood[0].deadline_wall_ms == now_wall + 100
    assert other.deadline_wall_ms == now_wall + 50  # no class: the helper's SLO
    # 10 green, 10 yellow (the ceiling's 20 rows), 30 red: shed, routed unscored at once.
    routed = core.pop_routed_late()
    assert [p.event for p in routed] == [f"b{i}" for i in range(20, 50)]
    assert {p.late_rule for p in routed} == {RULE_OVER_CEILING}
    # Gold first (green, tightest SLA: EDF), then bronze's green; its yellow waits below.
    first = core.next_batch(clock.now())
    assert first is not None
    assert [r.item.event for r in first.requests][:5] == [f"g{i}" for i in range(5)]
    assert not any(r.item.event in {f"b{i}" for i in range(10, 20)} for r in first.requests)
    assert core.batcher.tenants is not None and core.batcher.tenants.counters["bronze"].shed_rows == 30


def test_a_bad_tenants_section_is_one_line_naming_the_key() -> None:
    from pipeline.errors import UserError

    with pytest.raises(UserError, match=r"'tenants.classes.gold.share': must be within \[0, 1\]"):
        make_core("greedy", tenants={"capacity_rows_per_s": 100, "classes": {"gold": {"share": 2}}})
    with pytest.raises(UserError, match=r"'tenants.classes.gold.shares' is not known; did you mean 'tenants.classes.gold.share'"):
        make_core("greedy", tenants={"capacity_rows_per_s": 100, "classes": {"gold": {"shares": 0.2}}})
    with pytest.raises(UserError, match="'tenants.capacity_rows_per_s'"):
        make_core("greedy", tenants={"classes": {"gold": {"share": 0.2}}})
    assert make_core("greedy", tenants={}).batcher.tenants is None  # no classes: one shared queue


def test_the_driver_reads_each_events_tenant_and_exports_the_per_class_series() -> None:
    async def main() -> None:
        stream = FakeStream()
        stream.put(*({"tenant": "acme", "n": i} for i in range(3)), *({"tenant": "bronze", "n": i} for i in range(30)))
        metrics = BatchMetrics("test", "greedy")
        seen: list[dict] = []
        routed: list[str | None] = []
        # Fake clocks: on real ones the ceiling's bucket refilled while the events went
        # through (200 rows/s: 2 more admitted after 10 ms on a loaded machine), and
        # gold's 20 ms SLA could pass before its acks.
        clock = FakeClock(5.0)
        async for batch in adaptive_batches(stream, policy="greedy", max_batch_rows=64, tenants=TENANTS,
                                            metrics=metrics, clock=clock, wall_clock_ms=lambda: wall(clock)):
            seen.extend(batch.values)
            routed.extend(p.tenant_class for p in batch.routed_late)
            if len(seen) + len(routed) == 33:
                stream.queue.put_nowait(None)
        assert routed == ["bronze"] * 10  # 10 green + 10 yellow within the ceiling, 10 shed
        assert len(stream.acked) == 33

        def sample(name: str, **labels: str) -> float | None:
            return metrics.registry.get_sample_value(name, {"pipeline": "test", **labels})

        assert sample("tidebatch_tenant_requests_total", tenant_class="gold", outcome="ok") == 3
        assert sample("tidebatch_tenant_requests_total", tenant_class="bronze", outcome="routed_late") == 10
        assert sample("tidebatch_tenant_shed_rows_total", tenant_class="bronze") == 10
        assert sample("tidebatch_tenant_slo_seconds", tenant_class="gold") == pytest.approx(0.02)
        assert sample("tidebatch_tenant_rows_total", tenant_class="bronze", colour="red") == 10

    asyncio.run(main())
