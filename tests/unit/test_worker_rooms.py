"""The worker's rooms (pipeline/worker/) without Kafka: admission, executors and the
publisher with fake outcomes, a fake codec and a fake model session; clock readings
are passed in, nothing sleeps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from consumers.offsets import OffsetTracker
from consumers.records import SourceRecord
from models.registry import ModelSpec
from pipeline.batching.request import Batch, Request
from pipeline.clock import wall_ms
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.stats import WorkerStats
from pipeline.observe.metrics import WorkerMetrics
from pipeline.scoring import BatchTiming, ScoringStep, result_document
from pipeline.versions.slot import ModelSlot
from pipeline.worker.admission import Admission, InFlight
from pipeline.worker.executors import Done, Executors, Finished
from pipeline.worker.publisher import Publisher

WALL = 1_700_000_000_000
MODEL = ModelSpec("toy", "1", Path("unused.onnx"), [], [], {})


# ----------------------------------------------------------------------------- fakes
class ToyCodec:
    """b"r<N>" decodes to a one-row request; b"bad" is invalid; b"crash" is a codec bug;
    b"poison" decodes but the model refuses it; b"d<ms>" carries its own deadline."""

    name = "toy"

    def __init__(self) -> None:
        self.decoded: list[bytes] = []

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None) -> Decoded:
        assert value is not None
        self.decoded.append(value)
        if value == b"bad":
            raise DecodeError("field 'x' is missing")
        if value == b"crash":
            raise ZeroDivisionError("oops")
        deadline = int(value[1:]) if value.startswith(b"d") else None
        return Decoded(request_id=value.decode(), rows=1, payload=value, deadline_ms=deadline)

    def collate(self, payloads: Sequence[Any], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        return {"x": np.array([p == b"poison" for p in payloads])}

    def split(self, outputs: Mapping[str, np.ndarray], decoded: Sequence[Decoded]) -> list[dict]:
        return [{"score": float(i), "extra": d.extra.get("unserialisable", 0)} for i, d in enumerate(decoded)]


class ToySession:
    provider = "cpu"

    def run_timed(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        if feeds["x"].any():
            raise RuntimeError("model refuses this input\nsecond line of the ORT error")
        return {"y": feeds["x"]}, 0.001 * len(feeds["x"])


class FakeOutcomes:
    def __init__(self, limit: int = 10_000) -> None:
        self.dead: list[tuple[int, str, str]] = []
        self.routed: list[tuple[int, float]] = []
        self.rules: list[str] = []
        self.results: list[tuple[int, bytes]] = []
        self.ready: list[int | None] = []
        self.traces: list = []
        self.settled: list[int] = []
        self.limit = limit

    def settle(self, rec: SourceRecord) -> None:
        self.settled.append(rec.offset)

    def dead_letter(self, rec: SourceRecord, reason: str, stage: str, *, error: object = None) -> None:
        self.dead.append((rec.offset, reason, stage))

    def late(self, routed: Sequence[tuple[SourceRecord, float]], now_wall: int, rule: str) -> None:
        self.routed += [(rec.offset, deadline) for rec, deadline in routed]
        self.rules += [rule] * len(routed)

    def result(self, rec: SourceRecord, value: bytes, ready_wall_ms: int | None = None, trace=None) -> None:
        self.results.append((rec.offset, value))
        self.ready.append(ready_wall_ms)
        self.traces.append(trace)

    def result_too_large(self, rec: SourceRecord, value: bytes) -> str | None:
        return f"result is {len(value)} bytes" if len(value) > self.limit else None


def record(offset: int, value: bytes, ts: int | None = WALL) -> SourceRecord:
    return SourceRecord("in", 0, offset, b"k", value, {}, ts)


def admission(outcomes: FakeOutcomes, codec: ToyCodec, *, limit: int = 1000, route_ms: float | None = None) -> Admission:
    return Admission(codec, lambda priority: 100.0, outcomes, limit, route_ms)


def in_a_burst(adm: Admission, now_wall: int, answered_ms: float | None = 50.0) -> Admission:
    """Polls' records have been old for half a budget before `now_wall` (a backlog
    stands: pipeline/batching/shed.py StandingBacklog) and, unless None, batches took
    `answered_ms` from decode to answer (the reserve, up to half the budget)."""
    adm.standing.poll(now_wall - 100, 100.0, 100.0)
    if answered_ms is not None:
        adm.answer_time.observe([answered_ms])
    return adm


# ----------------------------------------------------------------------------- admission
def test_admission_gives_every_refused_record_its_one_outcome_and_queues_the_rest() -> None:
    outcomes, codec = FakeOutcomes(), ToyCodec()
    records = [record(0, b"r0"), record(1, b"x" * 2000), record(2, b"bad"), record(3, b"crash"), record(4, b"r4")]
    requests = admission(outcomes, codec).admit(records, now=10.0, now_wall=WALL + 5)
    assert [r.item.rec.offset for r in requests] == [0, 4]
    assert [(o, s) for o, _, s in outcomes.dead] == [(1, "admit"), (2, "decode"), (3, "decode")]
    assert "over the 1000-byte limit" in outcomes.dead[0][1]
    assert outcomes.dead[1][1] == "field 'x' is missing"
    assert outcomes.dead[2][1] == "decoder crashed: ZeroDivisionError: oops"
    assert b"x" * 2000 not in codec.decoded  # never decoded


def test_admission_routes_expired_records_without_decoding_them_only_when_asked() -> None:
    old = record(0, b"r0", ts=WALL - 500)
    fresh = record(1, b"r1", ts=WALL - 50)
    outcomes, codec = FakeOutcomes(), ToyCodec()
    requests = admission(outcomes, codec, route_ms=200.0).admit([old, fresh], now=1.0, now_wall=WALL)
    assert [r.item.rec.offset for r in requests] == [1]
    assert outcomes.routed == [(0, WALL - 500 + 200.0)] and outcomes.rules == ["expired"]
    assert codec.decoded == [b"r1"]
    # Without route_expired_ms (expiry scores late, or a policy without a late lane): decoded.
    outcomes, codec = FakeOutcomes(), ToyCodec()
    requests = admission(outcomes, codec).admit([old, fresh], now=1.0, now_wall=WALL)
    assert len(requests) == 2 and outcomes.routed == []


def test_admission_routes_records_too_old_to_be_answered_after_their_polls_decode() -> None:
    """A burst's backlog reaches the worker first in first out: records that would reach
    the queue with less than the reserve (half) of their budget left, after the decode
    of the poll's records kept, are routed late undecoded, oldest first, so the ones
    decoded still have time to be answered (pipeline/batching/shed.py)."""
    walls = iter([WALL, WALL + 10, WALL + 100, WALL + 100])  # before/after each decode
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0, wall=lambda: next(walls))
    adm.admit([record(i, b"r%d" % i, ts=WALL - 1) for i in range(10)], now=1.0, now_wall=WALL)
    assert adm.decode_cost.per_record_ms == pytest.approx(1.0)  # 10 records in 10 ms
    in_a_burst(adm, WALL + 100)
    # Ages 70, 45, 38, 20 ms, then one without a timestamp; 1 ms a record to decode.
    poll = [record(10, b"r10", ts=WALL + 100 - 20), record(11, b"r11", ts=WALL + 100 - 70),
            record(12, b"r12", ts=WALL + 100 - 45), record(13, b"r13", ts=None), record(14, b"r14", ts=WALL + 100 - 38)]
    codec.decoded.clear()
    requests = adm.admit(poll, now=1.1, now_wall=WALL + 100)
    # Age 70 > 50 alone; age 45 + 4 records' decode = 49 <= 50 fits.
    assert [o for o, _ in outcomes.routed] == [11]
    assert outcomes.rules == ["shed"]  # within its budget, but too old to keep the reserve
    assert outcomes.routed[0][1] == WALL + 100 - 70 + 100.0  # its loosest deadline
    assert sorted(r.item.rec.offset for r in requests) == [10, 12, 13, 14]
    assert b"r11" not in codec.decoded


def test_admission_keeps_only_the_learned_answer_time_in_reserve() -> None:
    """Once batches were answered in at most 10 ms after their decode, a record needs
    10 ms of its budget left when it reaches the queue, not half of it: at 50 % load
    on a busy machine the fixed half routed records 50-100 ms old that would have made
    it (pipeline/batching/shed.py AnswerTime)."""
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = in_a_burst(Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0), WALL, None)
    adm.answer_time.observe([6.0, 10.0])
    poll = [record(0, b"r0", ts=WALL - 95), record(1, b"r1", ts=WALL - 85), record(2, b"r2", ts=WALL - 60)]
    requests = adm.admit(poll, now=1.0, now_wall=WALL)
    assert [o for o, _ in outcomes.routed] == [0]  # 95 > 90; 85 and 60 would have been routed at 50
    assert outcomes.rules == ["shed"]
    assert [r.item.rec.offset for r in requests] == [1, 2]


def test_admission_sheds_on_the_reserve_only_while_a_backlog_stands() -> None:
    """Records old from a hiccup of the hop or the machine, with fresh polls between
    them: shedding them buys nobody decode time. At 50 % load on Apache Kafka the
    reserve routed 10-145 requests a run, in 3 of 10 runs, that greedy answered in
    time; now only the expired go until every poll has been old for half a budget."""
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0)
    adm.answer_time.observe([30.0])  # the reserve: 30 ms
    adm.admit([record(0, b"r0", ts=WALL - 3)], now=1.0, now_wall=WALL)  # a fresh poll
    at = WALL + 20  # a hiccup: this poll's records are 85 and 120 ms old
    requests = adm.admit([record(1, b"r1", ts=at - 120), record(2, b"r2", ts=at - 85)], now=1.02, now_wall=at)
    assert outcomes.rules == ["expired"] and [r.item.rec.offset for r in requests] == [2]
    at = WALL + 70  # every poll old since WALL + 20: a backlog stands; the reserve applies
    requests = adm.admit([record(3, b"r3", ts=at - 85), record(4, b"r4", ts=at - 15)], now=1.07, now_wall=at)
    assert outcomes.rules == ["expired", "shed"] and [o for o, _ in outcomes.routed] == [1, 3]
    assert [r.item.rec.offset for r in requests] == [4]


def test_a_long_hop_does_not_keep_the_worker_from_ever_answering() -> None:
    """Every record arrives 70 ms old, a backlog to admission's eyes. The reserve is
    half the budget until a batch was answered: every record was shed on it, none was
    ever answered and the reserve never learned, so every request routed late, for good.
    Now, before anything was answered, the reserve never takes a whole poll."""
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0)
    for i in range(10):
        assert len(adm.admit([record(i, b"r", ts=WALL + 10 * i - 70)], now=1.0, now_wall=WALL + 10 * i)) == 1
    assert outcomes.routed == []


def test_the_batcher_gets_each_deadline_less_the_learned_answer_tail() -> None:
    """Results leave a while after the model ends (result documents and sends on the
    publisher thread): the batcher must have the model done by then, or the answer is
    late after all its work was paid for (at 120 % of capacity adaptive scored 5610
    requests late for 6664 in time). Its result and late record still report the
    deadline itself (pipeline/batching/tail.py)."""
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = admission(outcomes, codec)
    before = adm.admit([record(0, b"r0", ts=WALL - 20)], now=1.0, now_wall=WALL)[0]
    assert before.deadline == pytest.approx(1.0 + 0.080)  # nothing answered yet: the deadline itself
    adm.observe_answers([30.0], 12.0)
    after = adm.admit([record(1, b"r1", ts=WALL - 20)], now=1.0, now_wall=WALL)[0]
    assert after.deadline == pytest.approx(1.0 + 0.080 - 0.012)
    assert after.due == before.due == pytest.approx(1.0 + 0.080)  # EDF's order: its own deadline
    assert after.item.deadline_wall_ms == before.item.deadline_wall_ms == WALL + 80
    adm.observe_answers([30.0], 500.0)  # a stalled publisher takes at most half a budget
    for _ in range(40):
        adm.observe_answers([30.0], 500.0)
    assert adm.admit([record(2, b"r2", ts=WALL - 20)], now=1.0, now_wall=WALL)[0].deadline == pytest.approx(1.0 + 0.030)


def test_admission_with_no_reserve_routes_only_records_already_expired() -> None:
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0, reserve=0.0)
    poll = [record(0, b"r0", ts=WALL - 101), record(1, b"r1", ts=WALL - 95), record(2, b"r2", ts=WALL - 60)]
    requests = adm.admit(poll, now=1.0, now_wall=WALL)
    assert [o for o, _ in outcomes.routed] == [0]
    assert [r.item.rec.offset for r in requests] == [1, 2]
    with pytest.raises(ValueError):
        Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0, reserve=1.0)


def test_admission_never_routes_a_record_without_a_timestamp_however_slow_decoding_is() -> None:
    walls = iter([WALL, WALL + 500, WALL + 500, WALL + 500])
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0, wall=lambda: next(walls))
    adm.admit([record(0, b"r0", ts=None)], now=1.0, now_wall=WALL)  # 500 ms for one record
    in_a_burst(adm, WALL + 500)
    requests = adm.admit([record(1, b"r1", ts=None), record(2, b"r2", ts=WALL + 480)], now=1.5, now_wall=WALL + 500)
    assert [o for o, _ in outcomes.routed] == [2]
    assert [r.item.rec.offset for r in requests] == [1]


def test_admission_deadline_is_timestamp_plus_budget_tightened_by_the_request() -> None:
    adm = admission(FakeOutcomes(), ToyCodec())
    a, b, c = adm.admit([record(0, b"r0"), record(1, b"d30"), record(2, b"r2", ts=None)], now=50.0, now_wall=WALL + 10)
    infs: list[InFlight] = [a.item, b.item, c.item]
    assert [i.deadline_wall_ms for i in infs] == [WALL + 100.0, WALL + 30.0, WALL + 10 + 100.0]
    # On the batcher's clock: now_wall maps to now.
    assert a.deadline == pytest.approx(50.0 + 0.090)
    assert b.deadline == pytest.approx(50.0 + 0.020)
    assert c.deadline == pytest.approx(50.0 + 0.100)
    assert all(i.consumed_wall_ms == WALL + 10 for i in infs)


def test_admission_stamps_when_each_poll_was_decoded() -> None:
    """The decode stage's end (tidebatch_stage_seconds{stage="decode"}): the wall clock
    read once the whole poll is decoded, the same for every request of that poll."""
    clock = iter([WALL + 1, WALL + 7, WALL + 11, WALL + 19])  # before and after each decode
    adm = Admission(ToyCodec(), lambda priority: 100.0, FakeOutcomes(), 1 << 20, wall=lambda: next(clock))
    first = adm.admit([record(0, b"r0"), record(1, b"r1")], now=1.0, now_wall=WALL)
    second = adm.admit([record(2, b"r2")], now=1.01, now_wall=WALL + 10)
    assert [(r.item.consumed_wall_ms, r.item.decoded_wall_ms) for r in first + second] == [
        (WALL, WALL + 7), (WALL, WALL + 7), (WALL + 10, WALL + 19)]


def test_equal_timestamps_admitted_in_different_polls_get_equal_deadlines() -> None:
    """The anchor stays fixed: whole-ms wall readings that truncate differently in two
    polls must not reorder equal timestamps under EDF (pipeline/clock.py ClockAnchor)."""
    adm = admission(FakeOutcomes(), ToyCodec())
    (first,) = adm.admit([record(0, b"r0")], now=100.0009, now_wall=WALL)
    (second,) = adm.admit([record(1, b"r1")], now=100.0101, now_wall=WALL + 10)
    assert first.deadline == second.deadline
    # A wall-clock step (the clocks drift apart by more than 20 ms) re-anchors.
    (third,) = adm.admit([record(2, b"r2")], now=100.02, now_wall=WALL + 1000)
    assert third.deadline == pytest.approx(100.02 + (WALL + 100 - (WALL + 1000)) / 1000.0)


# ----------------------------------------------------------------------------- executors
class FakeQueue:
    def __init__(self, batches: list[Batch]) -> None:
        self.batches = list(batches)
        self.done_seconds: list[float] = []

    def get_batch(self) -> Batch | None:
        return self.batches.pop(0) if self.batches else None

    def done(self, batch: Batch, seconds: float) -> None:
        self.done_seconds.append(seconds)


def make_batch(values: list[bytes], seq: int = 0) -> Batch:
    requests = []
    for i, v in enumerate(values):
        d = Decoded(request_id=v.decode(), rows=1, payload=v)
        requests.append(Request(1, 0.0, 1.0, item=InFlight(record(i, v), d, WALL + 100.0, WALL)))
    return Batch(requests, len(requests), 0, "full", 0.0, seq=seq)


def test_an_executor_scores_a_batch_and_isolates_a_poison_request() -> None:
    step = ScoringStep(MODEL, ToyCodec(), ToySession())  # type: ignore[arg-type]
    queue = FakeQueue([make_batch([b"r0", b"r1"], seq=0), make_batch([b"r0", b"poison", b"r2"], seq=1)])
    handed: list[Done] = []
    dead: list[tuple[int, str, str]] = []
    ex = Executors(queue, ModelSlot(step), lambda done: handed.append(done) or True,  # type: ignore[arg-type]
                   lambda rec, reason, stage: dead.append((rec.offset, reason, stage)))
    ex.loop()
    assert [d.seq for d in handed] == [0, 1]
    (whole,) = handed[0].parts
    assert whole.is_batch and whole.batch_rows == 2 and whole.seconds == pytest.approx(0.002)
    # The refused batch: its good requests scored alone, the poison one dead-lettered.
    assert [(p.is_batch, p.batch.requests[0].item.rec.offset) for p in handed[1].parts] == [(False, 0), (False, 2)]
    assert dead == [(1, "model rejected the request: RuntimeError: model refuses this input", "inference")]
    assert queue.done_seconds == [pytest.approx(0.002), 0.0]


def test_an_executor_that_hits_a_bug_dead_letters_the_batch_and_keeps_going() -> None:
    step = ScoringStep(MODEL, ToyCodec(), ToySession())  # type: ignore[arg-type]

    def broken_hook_step(decoded: Any, pad: Any = None) -> Any:
        raise AssertionError("a bug of ours")

    step.infer = broken_hook_step  # type: ignore[method-assign]
    step.one_by_one = lambda decoded: (_ for _ in ()).throw(KeyError("worse"))  # type: ignore[method-assign]
    queue = FakeQueue([make_batch([b"r0", b"r1"], seq=0), make_batch([b"r2"], seq=1)])
    handed: list[Done] = []
    dead: list[tuple[int, str, str]] = []
    ex = Executors(queue, ModelSlot(step), lambda done: handed.append(done) or True,  # type: ignore[arg-type]
                   lambda rec, reason, stage, error=None: dead.append((rec.offset, reason, stage)))
    ex.loop()
    assert [(d.seq, d.parts) for d in handed] == [(0, []), (1, [])]  # every number handed over
    assert [o for o, _, _ in dead] == [0, 1, 0]
    assert all(r == "internal error: KeyError: 'worse'" and s == "inference" for _, r, s in dead)


# ----------------------------------------------------------------------------- publisher
class DropSecond:
    name = "drop-second"

    def before_inference(self, decoded: Sequence[Decoded]) -> None:
        pass

    def after_inference(self, records: Sequence[SourceRecord], docs: list[dict]) -> list[bool]:
        return [i != 1 for i in range(len(docs))]


def publisher(outcomes: FakeOutcomes, tracker: OffsetTracker, hooks: list, stats: WorkerStats,
              metrics: WorkerMetrics | None = None, tracer=None) -> Publisher:
    failures: list[str] = []
    return Publisher(hooks, outcomes, tracker, [], metrics or WorkerMetrics("toy", "adaptive"), "toy",  # type: ignore[arg-type]
                     "adaptive", stats, Lifecycle(), failures.append, tracer)


def finished(batch: Batch, results: list[dict]) -> Finished:
    return Finished(batch, results, batch.rows, 0.004, WALL + 1, MODEL)


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


# ----------------------------------------------------------------------------- scoring
def test_the_result_document_is_the_same_for_the_worker_and_faust() -> None:
    d = Decoded(request_id="r7", rows=3, payload=None, priority=1, tenant="acme")
    rec = record(7, b"r7")
    doc = result_document(MODEL, d, rec, {"score": 0.5}, BatchTiming(12, 0.0021, WALL + 20, WALL + 25), WALL + 5, WALL + 24.0)
    assert doc == {
        "request_id": "r7", "score": 0.5, "key": "k", "model": "toy", "model_version": "1", "batch_rows": 12,
        "queue_wait_ms": 15, "inference_ms": 2.1, "kafka_ts_ms": WALL, "scored_at_ms": WALL + 25, "priority": 1,
        "late": True, "source": {"topic": "in", "partition": 0, "offset": 7}, "tenant": "acme",
    }


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
