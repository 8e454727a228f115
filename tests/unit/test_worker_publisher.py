"""The worker's publisher (pipeline/worker/publisher.py) without Kafka: dispatch order,
one outcome per request, the stages it observes, per-tenant counts; with fake outcomes
(tests/unit/worker_fakes.py); clock readings are passed in, nothing sleeps."""

from __future__ import annotations

from collections.abc import Sequence

from consumers.offsets import OffsetTracker
from consumers.records import SourceRecord
from pipeline.clock import wall_ms
from pipeline.codecs.base import Decoded
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.stats import WorkerStats
from pipeline.observe.metrics import WorkerMetrics
from pipeline.scoring import BatchTiming
from pipeline.worker.executors import Done
from pipeline.worker.publisher import Publisher
from tests.unit.worker_fakes import (
    MODEL,
    WALL,
    FakeOutcomes,
    finished,
    make_batch,
    publisher,
    record,
)


class DropSecond:
    name = "drop-second"

    def before_inference(self, decoded: Sequence[Decoded]) -> None:
        pass

    def after_inference(self, records: Sequence[SourceRecord], docs: list[dict]) -> list[bool]:
        return [i != 1 for i in range(len(docs))]


def test_the_publisher_publishes_in_dispatch_order_whatever_order_batches_finish_in() -> None:
    outcomes, tracker, stats = FakeOutcomes(), OffsetTracker(), WorkerStats()
    pub = publisher(outcomes, tracker, [], stats)
    first, second = make_batch([b"r0"], seq=0), make_batch([b"r1"], seq=1)
    second.requests[0].item.rec = record(1, b"r1")
    pub._finished.put(Done(1, [finished(second, [{"score": 1.0}])]))
    pub._finished.put(Done(0, [finished(first, [{"score": 0.0}])]))
    pub._finished.put(None)
    pub.loop()
    assert [o for o, _ in outcomes.results] == [0, 1]
    assert stats.scored == 2 and stats.batches == 2 and stats.batch_rows == 2


def test_the_publisher_gives_each_request_one_outcome() -> None:
    """A result over the topic's limit is its own request's dead letter; a replay a hook
    drops is acked without a record; the others are published."""
    outcomes, tracker, stats = FakeOutcomes(limit=300), OffsetTracker(), WorkerStats()
    pub = publisher(outcomes, tracker, [DropSecond()], stats)
    batch = make_batch([b"r0", b"r1", b"r2"])
    tracker.track_many([(("in", 0), i) for i in range(3)])
    results = [{"score": 0.0}, {"score": 1.0}, {"score": 2.0, "blob": "x" * 400}]
    pub.publish_part(finished(batch, results))
    assert [o for o, _ in outcomes.results] == [0]
    assert [(o, s) for o, _, s in outcomes.dead] == [(2, "publish")]
    assert stats.duplicates == 1 and stats.scored == 1
    assert outcomes.settled == [1]  # the dropped replay: done without a record


def test_a_publisher_bug_before_any_outcome_dead_letters_the_whole_part() -> None:
    outcomes, tracker, stats = FakeOutcomes(), OffsetTracker(), WorkerStats()
    pub = publisher(outcomes, tracker, [], stats)
    batch = make_batch([b"r0", b"r1"])
    pub.publish_part(finished(batch, [{"score": 0.0}]))  # one result for two requests: a bug
    assert outcomes.results == []
    assert [(o, s) for o, _, s in outcomes.dead] == [(0, "publish"), (1, "publish")]
    assert all(r.startswith("internal error: AssertionError") for _, r, _ in outcomes.dead)


def test_the_publisher_observes_where_each_request_s_time_went() -> None:
    """tidebatch_stage_seconds: to_worker (Kafka timestamp → consumed), decode (consumed →
    its poll decoded), queue (decoded → batch started), model (the batch's model time),
    per published request; the publish stage starts at the ready time handed to
    outcomes.result (pipeline/delivery/outcomes.py)."""
    outcomes, metrics = FakeOutcomes(), WorkerMetrics("toy", "adaptive")
    pub = publisher(outcomes, OffsetTracker(), [], WorkerStats(), metrics)
    batch = make_batch([b"r0", b"r1"])  # timestamps WALL, consumed at WALL
    batch.requests[0].item.decoded_wall_ms = WALL + 3  # its poll took 3 ms to decode
    batch.requests[1].item.consumed_wall_ms = WALL + 40  # this one reached the worker 40 ms late
    batch.requests[1].item.decoded_wall_ms = WALL + 45
    pub.publish(batch.requests, [{"score": 0.0}, {"score": 1.0}], BatchTiming(2, 0.004, WALL + 50, WALL + 55), MODEL)

    def stage(name: str) -> tuple[float, float]:
        got = {s.name: s.value for fam in metrics.registry.collect() for s in fam.samples
               if s.name.startswith("tidebatch_stage_seconds") and s.labels.get("stage") == name}
        return got["tidebatch_stage_seconds_count"], round(got["tidebatch_stage_seconds_sum"], 6)

    assert stage("to_worker") == (2, 0.040)
    assert stage("decode") == (2, 0.008)  # 3 ms and 5 ms
    assert stage("queue") == (2, 0.052)  # 47 ms and 5 ms
    assert stage("model") == (2, 0.008)
    assert outcomes.ready == [WALL + 55, WALL + 55]


def _stage(metrics: WorkerMetrics, name: str) -> tuple[float, float]:
    """(count, sum) of one stage of tidebatch_stage_seconds; (0, 0) with no series."""
    got = {s.name: s.value for fam in metrics.registry.collect() for s in fam.samples
           if s.name.startswith("tidebatch_stage_seconds") and s.labels.get("stage") == name}
    return got.get("tidebatch_stage_seconds_count", 0.0), round(got.get("tidebatch_stage_seconds_sum", 0.0), 6)


def test_the_produce_leg_is_observed_only_for_log_append_records_with_the_produced_header() -> None:
    """to_broker = the broker's append (a LogAppendTime timestamp) minus the producer's
    tidebatch.produced_ms; to_worker stays timestamp → consumed. A CreateTime record,
    one without the header and one whose header is not an integer give no to_broker
    observation, and a producer clock ahead of the broker's gives 0, not a negative."""
    from consumers.records import H_PRODUCED_MS

    outcomes, metrics = FakeOutcomes(), WorkerMetrics("toy", "adaptive")
    pub = publisher(outcomes, OffsetTracker(), [], WorkerStats(), metrics)
    batch = make_batch([b"r0", b"r1", b"r2", b"r3", b"r4", b"r5"])  # timestamps WALL, consumed at WALL
    stamps: list[tuple[bool, bytes | None]] = [
        (True, str(WALL - 7).encode()),  # appended 7 ms after produce()
        (True, str(WALL - 12).encode()),  # 12 ms
        (False, str(WALL - 30).encode()),  # CreateTime: the append time is unknown
        (True, None),  # no header
        (True, b"soon"),  # not an integer: ignored
        (True, str(WALL + 5).encode()),  # the producer's clock runs ahead: clamped to 0
    ]
    for req, (log_append, header) in zip(batch.requests, stamps, strict=True):
        req.item.rec.log_append_time = log_append
        if header is not None:
            req.item.rec.headers[H_PRODUCED_MS] = header
        req.item.consumed_wall_ms = WALL + 20
    pub.publish(batch.requests, [{"score": float(i)} for i in range(6)], BatchTiming(6, 0.004, WALL + 30, WALL + 35), MODEL)
    assert _stage(metrics, "to_broker") == (3, 0.019)  # 7 + 12 + 0 ms
    assert _stage(metrics, "to_worker") == (6, 0.120)  # append → consumed, 20 ms each, as before
    assert len(outcomes.results) == 6 and not outcomes.dead  # a bad header is never an error


def test_create_time_records_give_no_produce_leg_even_with_the_header() -> None:
    from consumers.records import H_PRODUCED_MS

    metrics = WorkerMetrics("toy", "adaptive")
    pub = publisher(FakeOutcomes(), OffsetTracker(), [], WorkerStats(), metrics)
    batch = make_batch([b"r0", b"r1"])
    for req in batch.requests:
        req.item.rec.headers[H_PRODUCED_MS] = str(WALL - 3).encode()
    pub.publish(batch.requests, [{"score": 0.0}, {"score": 1.0}], BatchTiming(2, 0.004, WALL + 5, WALL + 9), MODEL)
    assert _stage(metrics, "to_broker") == (0, 0.0)
    assert _stage(metrics, "to_worker")[0] == 2


def test_the_publisher_counts_and_times_requests_per_tenant_class() -> None:
    from pipeline.batching.tenants import TenantClass, TenantGate
    from pipeline.observe.tenant_metrics import watch_tenants

    metrics = WorkerMetrics("toy", "adaptive")
    gate = TenantGate({"gold": TenantClass("gold", 10.0, 1.0)})
    metrics.tenants = watch_tenants(metrics.registry, "toy", gate, lambda: 0.0, (0.01, 0.1, 1.0), {"gold": 0.02})
    pub = publisher(FakeOutcomes(), OffsetTracker(), [], WorkerStats(), metrics)
    batch = make_batch([b"r0", b"r1", b"r2"])
    for req, name in zip(batch.requests, ("gold", "default", None), strict=True):
        req.tenant_class = name  # None: no gate saw it (no `tenants:` section)
    pub.publish_part(finished(batch, [{"score": 0.0}, {"score": 1.0}, {"score": 2.0}]))

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"pipeline": "toy", **labels})

    # Published now, Kafka timestamps at WALL (2023): late, one each, never the unclassed one.
    for name in ("gold", "default"):
        assert value("tidebatch_tenant_requests_total", tenant_class=name, outcome="late") == 1
        assert value("tidebatch_tenant_requests_total", tenant_class=name, outcome="ok") is None
        assert value("tidebatch_tenant_latency_seconds_count", tenant_class=name) == 1
    assert value("tidebatch_tenant_slo_seconds", tenant_class="gold") == 0.02
    classes = {s.labels.get("tenant_class") for m in metrics.registry.collect() for s in m.samples}
    assert classes == {None, "gold", "default"}


def test_requests_shed_over_a_ceiling_count_as_routed_late_for_their_class_alone() -> None:
    from pipeline.batching.batcher import Batcher
    from pipeline.batching.concurrent import BatchQueue
    from pipeline.batching.registry import make_policy
    from pipeline.batching.tenants import TenantClass, TenantGate
    from pipeline.clock import FakeClock
    from pipeline.observe.tenant_metrics import watch_tenants
    from pipeline.worker.late_routing import route_late

    # gold: a share, no ceiling; burst: a ceiling one row deep, beyond it shed.
    gate = TenantGate({"gold": TenantClass("gold", 100.0, 10.0),
                       "burst": TenantClass("burst", 1.0, 1.0, 1.0, 1.0, "shed")})
    clock = FakeClock()
    queue = BatchQueue(Batcher(make_policy("greedy", max_batch_rows=64), tenants=gate), clock)
    metrics = WorkerMetrics("toy", "adaptive")
    metrics.tenants = watch_tenants(metrics.registry, "toy", gate, clock.now)
    batch = make_batch([b"g0", b"b0", b"b1", b"b2"])
    for req, tenant in zip(batch.requests, ("gold", "burst", "burst", "burst"), strict=True):
        req.tenant = tenant
    queue.put_many(batch.requests)
    outcomes = FakeOutcomes()
    route_late(queue, outcomes, metrics.tenants)  # type: ignore[arg-type]
    assert [offset for offset, _ in outcomes.routed] == [2, 3]  # b0 took the ceiling's one row
    assert outcomes.rules == ["over_ceiling", "over_ceiling"]

    def routed(name: str) -> float | None:
        return metrics.registry.get_sample_value(
            "tidebatch_tenant_requests_total", {"pipeline": "toy", "tenant_class": name, "outcome": "routed_late"})

    assert (routed("burst"), routed("gold")) == (2, None)
    route_late(queue, outcomes, metrics.tenants)  # type: ignore[arg-type]  # nothing new: nothing counted
    assert routed("burst") == 2 and len(outcomes.routed) == 2


def test_the_publisher_reports_each_batch_s_time_from_decode_to_hand_over() -> None:
    """Admission's shed reserve learns from these (pipeline/batching/shed.py AnswerTime):
    one hand-over time for the whole batch, less each request's decode time; and the
    answer tail (pipeline/batching/tail.py) from the time since the model's end."""
    got: list[tuple[list[float], float]] = []
    pub = Publisher([], FakeOutcomes(), OffsetTracker(), [], WorkerMetrics("toy", "adaptive"),  # type: ignore[arg-type]
                    "toy", "adaptive", WorkerStats(), Lifecycle(), lambda reason: None, None,
                    lambda ms, tail: got.append((ms, tail)))
    batch = make_batch([b"r0", b"r1"])
    now = wall_ms()
    batch.requests[0].item.decoded_wall_ms = now - 40
    batch.requests[1].item.decoded_wall_ms = now - 25
    pub.publish(batch.requests, [{"score": 0.0}, {"score": 1.0}], BatchTiming(2, 0.004, now - 10, now - 5), MODEL)
    assert len(got) == 1
    ms, tail = got[0]
    assert ms[0] - ms[1] == 15 and ms[1] >= 25
    assert tail >= 6  # the model ended at now - 10 + 4 ms; its results were handed over after now
    assert tail == ms[0] - 40 + 10 - 4  # the same hand-over time, counted from the model's end
