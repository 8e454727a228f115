"""The generate worker's loop (pipeline/generation/service.py) on the real decoder,
with Kafka replaced by an in-memory source and producer and a fake clock: an offset
commits only once its final record is acknowledged, a request that waits past its
deadline gets a `deadline` final, a revoke cancels what is unfinished (no final, no
commit: the next owner generates it), a redelivered record runs once."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson
import pytest

from consumers.records import AckCallback, SourceRecord, TopicPartition
from pipeline.clock import FakeClock
from pipeline.delivery.limits import resolve_limits
from pipeline.delivery.outcomes import Outcomes, Topics
from pipeline.generation.budget import KvBudget
from pipeline.generation.policies import make_generation_policy
from pipeline.generation.runner import DecoderRunner, open_decoder
from pipeline.generation.scheduler import GenerationScheduler
from pipeline.generation.service import GenerateSettings, GenerationLoop
from pipeline.observe.metrics import WorkerMetrics

TOPICS = Topics("out", "in.dlq", "in.late")
TP = ("in", 0)
WALL0 = 1_000_000


class Producer:
    """Holds each send's ack until release() (Kafka acknowledges later)."""

    max_record_bytes = 1_000_000

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, dict]] = []
        self.held: list[AckCallback] = []
        self.hold = False

    def send(self, topic, key, value, headers, on_ack: AckCallback) -> None:
        self.sent.append((topic, key, orjson.loads(value) if topic == "out" else {}))
        self.held.append(on_ack)
        if not self.hold:
            self.release()

    def release(self) -> None:
        held, self.held = self.held, []
        for ack in held:
            ack(None)

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        if not self.hold:
            self.release()
        return len(self.held)

    def finals(self) -> list[dict]:
        return [d for t, _, d in self.sent if t == "out" and d.get("final")]


class Source:
    """Hands out its records on the first poll; every poll moves the clock 10 ms and
    runs `each_poll` (the test's script), which may stop the loop."""

    def __init__(self, records: list[SourceRecord], clock: FakeClock, each_poll: Callable[[int], None]) -> None:
        self.records, self.clock, self.each_poll = records, clock, each_poll
        self.commits: list[Mapping[TopicPartition, int]] = []
        self.paused = False
        self.polls = 0
        self.pauses = 0

    def poll_batch(self, max_records: int, timeout: float) -> list[SourceRecord]:
        self.clock.advance(0.01)
        self.polls += 1
        self.each_poll(self.polls)
        out, self.records = self.records[:max_records], self.records[max_records:]
        return out

    def commit(self, offsets, on_done=None) -> None:
        self.commits.append(dict(offsets))
        if on_done:
            on_done(None)

    def pause_all(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_all(self) -> None:
        self.paused = False

    def close(self) -> None:
        pass

    def last_commit(self) -> int | None:
        return self.commits[-1].get(TP) if self.commits else None


@pytest.fixture(scope="module")
def decoder():
    return open_decoder("cpu")


def _loop(decoder, clock: FakeClock, producer: Producer, policy: str = "continuous", slots: int = 4,
          max_waiting: int = 256) -> GenerationLoop:
    session, shape = decoder
    limits, _ = resolve_limits(requested_request_bytes=65536, producer_bytes=1_000_000, described={},
                               outgoing=TOPICS.all(), dead_letter_topic=TOPICS.dead_letter, prefix_bytes=1024)
    metrics = WorkerMetrics("generate", policy)

    def outcomes_for(ack, fail) -> Outcomes:
        return Outcomes(producer, ack, TOPICS, limits, metrics=metrics, pipeline="generate", fail=fail)

    scheduler = GenerationScheduler(make_generation_policy(policy), KvBudget(slots, slots * shape.context))
    return GenerationLoop(producer=producer, outcomes_for=outcomes_for, scheduler=scheduler,
                          runner=DecoderRunner(session, shape, slots), context=shape.context, metrics=metrics,
                          settings=GenerateSettings(chunk_tokens=4, flush_ms=1000, commit_interval_s=0.05,
                                                    max_waiting=max_waiting),
                          clock=clock.now, wall=lambda: WALL0 + int(clock.now() * 1000))


def _rec(offset: int, doc: dict) -> SourceRecord:
    return SourceRecord("in", 0, offset, None, orjson.dumps(doc), {}, WALL0)


def test_an_offset_commits_only_once_its_final_record_is_acknowledged(decoder) -> None:
    clock, producer = FakeClock(), Producer()
    producer.hold = True
    reqs = [_rec(i, {"request_id": f"r{i}", "prompt": "Kafka ", "max_new_tokens": 6}) for i in range(3)]
    seen: dict[str, object] = {}

    def script(poll: int) -> None:
        if poll == 30:  # every request has long finished: its final record waits for Kafka
            seen["finals"] = len(producer.finals())
            seen["commit"] = source.last_commit()
            producer.release()
        if poll == 40:
            loop.stop("test")

    loop = _loop(decoder, clock, producer)
    source = Source(reqs, clock, script)
    assert loop.run(source) == 0
    assert seen == {"finals": 3, "commit": None}
    assert source.last_commit() == 3
    finals = producer.finals()
    assert [f["request_id"] for f in finals] == ["r0", "r1", "r2"]
    assert all(f["finish_reason"] == "length" and f["generated_tokens"] == 6 for f in finals)
    assert all(f["to_worker_ms"] == 10.0 for f in finals)  # polled 10 ms after their timestamp
    # the request's own key (here none: its request_id) keys chunks and final alike
    keys = {key for t, key, d in producer.sent if t == "out" and d["request_id"] == "r0"}
    assert keys == {b"r0"}


def test_a_request_waiting_past_its_deadline_gets_a_deadline_final(decoder) -> None:
    clock, producer = FakeClock(), Producer()
    late = _rec(1, {"request_id": "late", "prompt": "Kafka ", "max_new_tokens": 5, "deadline_ms": 50})
    loop = _loop(decoder, clock, producer, policy="none", slots=1)

    def script(poll: int) -> None:
        if poll == 3:  # after "long" took the one slot (EDF would admit "late" first otherwise)
            source.records.append(late)
        if poll == 80:
            loop.stop("test")

    source = Source([_rec(0, {"request_id": "long", "prompt": "Kafka ", "max_new_tokens": 40})], clock, script)
    assert loop.run(source) == 0
    by_id = {f["request_id"]: f for f in producer.finals()}
    assert by_id["late"]["finish_reason"] == "deadline"
    assert by_id["late"]["text"] == "" and by_id["late"]["ttft_ms"] is None
    assert by_id["long"]["finish_reason"] == "length"
    assert source.last_commit() == 2


def test_a_revoke_cancels_unfinished_requests_without_a_final_or_a_commit(decoder, monkeypatch) -> None:
    # Partitions.on_revoke steps the decoder up to REVOKE_WAIT s while the revoked
    # requests finish; none here, so b is still running when the partition goes.
    monkeypatch.setattr("pipeline.delivery.partitions.REVOKE_WAIT", 0.0)
    clock, producer = FakeClock(), Producer()
    reqs = [_rec(0, {"request_id": "a", "prompt": "Kafka ", "max_new_tokens": 3}),
            _rec(1, {"request_id": "b", "prompt": "Kafka ", "max_new_tokens": 200})]
    loop = _loop(decoder, clock, producer, policy="none", slots=1)

    def script(poll: int) -> None:
        if poll == 10:  # a is done, b is running
            loop.on_revoke([TP])
        if poll == 20:
            loop.stop("test")

    loop.partitions.on_assign([TP])
    source = Source(reqs, clock, script)
    assert loop.run(source) == 0
    assert [f["request_id"] for f in producer.finals()] == ["a"]
    assert {c for cs in source.commits for c in cs.values()} == {1}
    assert not loop.jobs and not loop.scheduler.has_work


def test_a_redelivered_record_runs_once_and_a_bad_one_is_dead_lettered(decoder) -> None:
    clock, producer = FakeClock(), Producer()
    good = _rec(0, {"request_id": "g", "prompt": "Kafka ", "max_new_tokens": 3})
    bad = SourceRecord("in", 0, 1, None, b"{", {}, WALL0)
    loop = _loop(decoder, clock, producer)
    source = Source([good, good, bad], clock, lambda poll: loop.stop("test") if poll == 20 else None)
    assert loop.run(source) == 0
    assert [f["request_id"] for f in producer.finals()] == ["g"]
    assert [t for t, *_ in producer.sent].count("in.dlq") == 1
    assert source.last_commit() == 2


def test_a_full_waiting_queue_holds_intake_without_pausing_the_partitions(decoder) -> None:
    # pause() purges librdkafka's prefetched records and resume() refetches only on its
    # broker thread's next wake-up: pausing at max_waiting left a saturated worker idle
    # ~13 % of the time (pipeline/batching/backpressure.py). A draining queue holds.
    clock, producer = FakeClock(), Producer()
    reqs = [_rec(i, {"request_id": f"r{i}", "prompt": "Kafka ", "max_new_tokens": 4}) for i in range(12)]
    loop = _loop(decoder, clock, producer, slots=2, max_waiting=4)
    most = {"waiting": 0, "pauses": -1}

    def script(poll: int) -> None:
        most["waiting"] = max(most["waiting"], loop.scheduler.waiting)
        if len(producer.finals()) == len(reqs) or poll == 500:
            most["pauses"] = source.pauses  # before the shutdown's own pause
            loop.stop("test")

    source = Source(reqs, clock, script)
    assert loop.run(source) == 0
    assert len(producer.finals()) == len(reqs)
    assert most["pauses"] == 0
    assert loop.stats.pauses >= 1  # it held intake at least once
    assert most["waiting"] <= 4 + 64  # one poll past the watermark at most
    assert source.last_commit() == len(reqs)
