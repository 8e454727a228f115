"""The composition root (pipeline/app/compose.py) and the rooms it feeds: each room is
built from explicit dependencies (the shared Lifecycle, the offsets, values decided
from the configuration), with no Worker to reach back into, and a Worker built from
hand-made parts wires every room to the same shared objects. No Kafka, no model, no
Redis; nothing sleeps."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from consumers.dead_letter import Origin
from consumers.offsets import OffsetTracker
from consumers.records import SourceRecord, TopicPartition
from models.registry import ModelSpec
from pipeline.app.compose import accept_id_requests, admission_rules, batch_queue, build_redis
from pipeline.batching.backpressure import Backpressure
from pipeline.batching.cost import CostModel
from pipeline.batching.registry import make_policy
from pipeline.clock import FakeClock
from pipeline.codecs.base import Decoded
from pipeline.codecs.ctr import CtrCodec
from pipeline.config import WorkerConfig, load_config
from pipeline.delivery.kafka_progress import KafkaProgress
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.limits import Limits
from pipeline.delivery.outage_log import Acks
from pipeline.delivery.outcomes import Topics
from pipeline.delivery.partitions import Partitions
from pipeline.delivery.stats import WorkerStats
from pipeline.delivery.transactions import Transactions
from pipeline.delivery.watchdog import CallWatch
from pipeline.observe.metrics import WorkerMetrics
from pipeline.redisio.codec import CtrIdCodec
from pipeline.registry.pipelines import pipeline_for
from pipeline.scoring import ScoringStep
from pipeline.versions.slot import ModelSlot
from pipeline.worker import Worker, WorkerParts
from pipeline.worker.admission import Admission
from pipeline.worker.late_routing import outcome_server

P0: TopicPartition = ("req", 0)
P1: TopicPartition = ("req", 1)
WALL = 1_700_000_000_000


def config(**batching: Any) -> WorkerConfig:
    return load_config(overrides={"batching": batching} if batching else {}, environ={})


def record(tp: TopicPartition, offset: int, value: bytes = b"r", ts: int | None = WALL) -> SourceRecord:
    return SourceRecord(tp[0], tp[1], offset, b"k", value, {}, ts)


class ToyCodec:
    name = "toy"

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None) -> Decoded:
        assert value is not None
        priority = int(value[1:]) if value.startswith(b"p") else 0
        return Decoded(request_id=value.decode(), rows=1, payload=value, priority=priority)


class Routed:
    """Admission's and the late routing's outcomes, kept."""

    def __init__(self) -> None:
        self.dead: list[tuple[int, str]] = []
        self.late_offsets: list[int] = []

    def dead_letter(self, rec: SourceRecord, reason: str, stage: str, *, error: object = None) -> None:
        self.dead.append((rec.offset, stage))

    def late(self, routed: Sequence[tuple[SourceRecord, float]], now_wall: int, rule: str) -> None:
        self.late_offsets += [rec.offset for rec, _ in routed]


class JoinedSource:
    """The consumer once the group is joined: commits land here."""

    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []

    def commit(self, offsets: Mapping[TopicPartition, int], on_done: Callable[[Exception | None], None] | None = None) -> None:
        self.commits.append(dict(offsets))
        if on_done is not None:
            on_done(None)

    def group_metadata(self) -> object:
        return "generation-1"

    def in_group(self) -> bool:
        return True


class TxnProducer:
    """A transactional producer that takes everything."""

    max_record_bytes = 1_000_000

    def __init__(self) -> None:
        self.committed: list[dict[TopicPartition, int]] = []

    def init_transactions(self, timeout: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def flush(self, timeout: float = 0.0) -> int:
        return 0

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def commit_transaction(self, offsets: Mapping[TopicPartition, int], metadata: object, timeout: float) -> None:
        self.committed.append(dict(offsets))

    def abort_transaction(self, timeout: float) -> None: ...

    def __len__(self) -> int:
        return 0


# ----------------------------------------------------------------------------- lifecycle
def test_the_lifecycle_keeps_the_first_failure_and_the_drain_deadline() -> None:
    life = Lifecycle()
    assert not life.stopping and life.failure is None and life.drain_left(30.0) == 30.0
    life.fail("sink failed")
    life.fail("a later reason")
    assert life.stopping and life.failure == "sink failed"
    life.drain(30.0)
    assert life.drain_deadline is not None and 0.0 < life.drain_left(30.0) <= 30.0


# ----------------------------------------------------------------------------- rooms
def test_partitions_built_before_the_source_exists_commit_to_it_once_it_joins() -> None:
    """Partitions gets the lifecycle, not a getter into a worker: the source the run
    loop sets there later is the one it commits to, and the partitions its rebalance
    callbacks keep are the lifecycle's, where every other reader finds them."""
    life, tracker, stats = Lifecycle(), OffsetTracker(), WorkerStats()
    parts = Partitions(tracker, life, None, [], WorkerMetrics("toy", "adaptive"), "toy", stats,  # type: ignore[arg-type]
                       lambda: None)
    tracker.track(P0, 0)
    tracker.ack(P0, 0)
    parts.commit()  # no source yet: nothing to commit to
    source = JoinedSource()
    life.source = source  # type: ignore[assignment]
    parts.on_assign([P1, P0])
    assert life.assigned == [P0, P1]
    parts.commit()
    assert source.commits == [{P0: 1}] and stats.commits == 1


def test_transactions_check_the_partitions_that_the_rebalance_callbacks_keep() -> None:
    """Transactions and Partitions share one lifecycle: a record of a partition the
    callbacks never assigned (fetched before a revoke) never commits, and the rest does."""
    life, tracker, stats = Lifecycle(), OffsetTracker(), WorkerStats()
    metrics, producer = WorkerMetrics("toy", "adaptive"), TxnProducer()
    failures: list[str] = []
    txns = Transactions(producer, life, tracker, [], 1.0, metrics, "toy", stats, failures.append)  # type: ignore[arg-type]
    parts = Partitions(tracker, life, producer, [], metrics, "toy", stats, txns.release, txns)  # type: ignore[arg-type]
    txns.start()
    life.source = JoinedSource()  # type: ignore[assignment]
    parts.on_assign([P0])
    r0, q0 = record(P0, 0), record(P1, 0)
    tracker.track_many([(r0.tp, r0.offset), (q0.tp, q0.offset)])
    txns.track([r0, q0])
    txns.deliver(r0, lambda: tracker.ack(P0, 0))
    parts.commit(wait=False)
    assert producer.committed == [{P0: 1}] and not failures


def test_admission_is_built_from_the_rules_the_composition_root_decides() -> None:
    """Budgets by priority, shedding before decoding only where expiry routes late with
    a policy that separates late requests, and the size limit as a value."""
    cfg = config(priority_slo_ms={1: 250.0}, expiry_action="route_late", slo_ms=100.0)
    policy = make_policy("adaptive")
    queue = batch_queue(cfg, policy, CostModel(), FakeClock(), 1, 64)
    rules = admission_rules(cfg, policy, queue, WorkerMetrics("toy", "adaptive"))
    assert (rules.budget_ms(0), rules.budget_ms(1)) == (100.0, 250.0)
    assert rules.route_expired_ms == 250.0 and rules.tenant_budget_ms is None and rules.tenants is None
    outcomes = Routed()
    adm = Admission.from_rules(ToyCodec(), rules, outcomes, request_bytes=560)  # type: ignore[arg-type]
    requests = adm.admit([record(P0, 0, b"p1"), record(P0, 1, b"x" * 100), record(P0, 2, ts=WALL - 1000)], 5.0, WALL)
    assert [r.item.rec.offset for r in requests] == [0]
    assert requests[0].item.deadline_wall_ms == WALL + 250.0
    assert outcomes.dead == [(1, "admit")] and outcomes.late_offsets == [2]

    scoring = config()  # score_late: everything is decoded
    assert admission_rules(scoring, policy, batch_queue(scoring, policy, CostModel(), FakeClock(), 1, 64),
                           WorkerMetrics("toy", "adaptive")).route_expired_ms is None


def test_the_outcome_server_routes_late_and_releases_the_transaction() -> None:
    released: list[int] = []

    class Queue:
        def pop_routed_late(self) -> list:
            return []

    class Txns:
        def release(self) -> None:
            released.append(1)

    serve = outcome_server(Queue(), Routed(), None, Txns())  # type: ignore[arg-type]
    serve()
    serve()
    assert released == [1, 1]
    outcome_server(Queue(), Routed(), None, None)()  # at-least-once: nothing to release


def test_acks_complete_offsets_and_count_for_the_outage_watch() -> None:
    tracker = OffsetTracker()
    tracker.track_many([(P0, 0), (P0, 1)])
    acks = Acks(tracker)
    acks(record(P0, 0))
    acks(record(P0, 1))
    assert acks.count == 2 and tracker.committable() == {P0: 2}


# ----------------------------------------------------------------------------- Redis
def test_no_redis_feature_builds_nothing_and_connects_nowhere() -> None:
    assert build_redis(config().redis, WorkerMetrics("toy", "adaptive").registry) is None


def test_feature_lookup_decodes_id_requests_with_the_ctr_codec_only(caplog: pytest.LogCaptureFixture) -> None:
    with_ids = accept_id_requests(CtrCodec(max_items=7), "ctr")
    assert isinstance(with_ids, CtrIdCodec) and with_ids.max_items == 7
    assert accept_id_requests(with_ids, "ctr") is with_ids
    toy = ToyCodec()
    with caplog.at_level(logging.WARNING, logger="pipeline.app.compose"):
        assert accept_id_requests(toy, "toy") is toy  # type: ignore[arg-type]
    assert "no effect on pipeline 'toy'" in caplog.text


# ----------------------------------------------------------------------------- the Worker
def hand_made_parts(cfg: WorkerConfig) -> WorkerParts:
    """Parts as build_parts makes them, without a model, Kafka or Redis."""
    metrics = WorkerMetrics("toy", "adaptive")
    policy = make_policy("adaptive")
    queue = batch_queue(cfg, policy, CostModel(), FakeClock(), 1, 64)
    model = ModelSpec("toy", "1", Path("unused.onnx"), [], [], {})
    life, tracker, stats, producer = Lifecycle(), OffsetTracker(), WorkerStats(), TxnProducer()
    txns = Transactions(producer, life, tracker, [], 1.0, metrics, "toy", stats, life.fail)  # type: ignore[arg-type]
    limits = Limits(request_bytes=4096, topic_bytes={}, producer_bytes=1_000_000, prefix_bytes=100)
    opened: list[object] = []
    return WorkerParts(
        cfg, pipeline_for(cfg), "req", Topics.for_input("req", "res", None, None), "group", metrics, policy, queue,
        Backpressure(1000, 500, poll_records=100), 1, producer, [],  # type: ignore[arg-type]
        ModelSlot(ScoringStep(model, ToyCodec(), None, [])), None,  # type: ignore[arg-type]
        life, tracker, stats, KafkaProgress(0.0), CallWatch(), txns,
        limits=limits, describe_limits=lambda: limits, open_source=lambda *callbacks: opened.append(callbacks),  # type: ignore[arg-type, return-value]
        admission=admission_rules(cfg, policy, queue, metrics), origin=Origin("group", None, "toy"),
    )


def test_a_worker_wires_every_room_to_the_parts_shared_objects() -> None:
    parts = hand_made_parts(config())
    worker = Worker(parts.cfg, parts=parts)
    life = parts.lifecycle
    assert worker.partitions.lifecycle is life and worker.publisher.lifecycle is life
    assert worker.transactions is parts.transactions and worker.partitions.transactions is parts.transactions
    assert worker.partitions.tracker is parts.tracker is worker.publisher.tracker
    assert worker.admission.request_bytes == 4096 and worker.outcomes.limits is parts.limits
    assert worker.outcomes.records.origin is parts.origin
    parts.lifecycle.assigned = [P0]
    assert worker.assigned == [P0] and worker.source is None
    worker.publisher.fail("a room failed")  # what the rooms call: the lifecycle's fail
    assert worker.stopping and worker.failure == "a room failed"
