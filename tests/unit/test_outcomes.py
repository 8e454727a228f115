"""Outcome records with a fake producer (pipeline/delivery/outcomes.py): every request ends with
exactly one outcome or an explicit, logged policy decision; a refused record never
stops the worker by default."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from consumers.dead_letter import H_DEADLINE_MISSED_BY, H_ERROR, H_LATE_RULE, H_STAGE, H_TRUNCATED
from consumers.records import AckCallback, SendError, SourceRecord
from pipeline.delivery.limits import DEAD_LETTER_HEADROOM_BYTES, resolve_limits
from pipeline.delivery.outcomes import MAX_SEND_ATTEMPTS, Outcomes, Topics
from pipeline.observe.metrics import WorkerMetrics

TOPICS = Topics.for_input("in", "out", None, None)
REFUSED = SendError("Broker: Message size too large", refused=True)
BROKER_DOWN = SendError("Local: Message timed out")


class FakeProducer:
    """Acks each send at once with what `answer(topic, value, attempt)` says."""

    def __init__(self, answer: Callable[[str, bytes | None, int], SendError | None]) -> None:
        self.answer = answer
        self.sent: list[tuple[str, bytes | None, bytes | None, dict[str, bytes]]] = []

    def send(self, topic, key, value, headers, on_ack: AckCallback) -> None:
        self.sent.append((topic, key, value, dict(headers or [])))
        on_ack(self.answer(topic, value, len(self.sent)))


class Harness:
    def __init__(self, answer, on_undeliverable: str = "skip", producer_bytes: int = 1_000_000, carry=()) -> None:
        limits, _ = resolve_limits(
            requested_request_bytes=512 * 1024,
            producer_bytes=producer_bytes,
            described={},
            outgoing=TOPICS.all(),
            dead_letter_topic=TOPICS.dead_letter,
            prefix_bytes=1024,
        )
        self.producer = FakeProducer(answer)
        self.acked: list[int] = []
        self.counts: dict[str, int] = {}
        self.failures: list[str] = []
        self.metrics = WorkerMetrics("ctr", "static")
        self.outcomes = Outcomes(
            self.producer,
            lambda rec: self.acked.append(rec.offset),
            TOPICS,
            limits,
            metrics=self.metrics,
            pipeline="ctr",
            on_undeliverable=on_undeliverable,
            count=lambda name, n: self.counts.__setitem__(name, self.counts.get(name, 0) + n),
            fail=self.failures.append,
            carry_headers=carry,
        )

    def topics_sent(self) -> list[str]:
        return [t for t, *_ in self.producer.sent]


def _rec(offset: int = 7, value: bytes = b"{}") -> SourceRecord:
    return SourceRecord("in", 0, offset, b"k", value, {}, 1)


def test_a_result_kafka_refuses_becomes_the_requests_dead_letter() -> None:
    h = Harness(lambda topic, _v, _n: REFUSED if topic == "out" else None)
    h.outcomes.result(_rec(), b'{"scores": []}')
    assert h.topics_sent() == ["out", "in.dlq"]
    dead = h.producer.sent[1][3]
    assert dead[H_STAGE] == b"publish" and dead[H_ERROR].startswith(b"Kafka refused the result")
    assert h.acked == [7] and h.counts == {"dlq": 1} and not h.failures


def test_a_result_over_the_output_limit_is_known_before_it_is_sent() -> None:
    h = Harness(lambda *_: None, producer_bytes=10_000)
    assert h.outcomes.result_too_large(_rec(), b"x" * 100) is None
    reason = h.outcomes.result_too_large(_rec(), b"x" * 20_000)
    assert reason is not None and "over the 10000-byte record limit of out" in reason


def test_a_refused_dead_letter_is_resent_minimal_and_then_skipped_with_one_line(caplog) -> None:
    h = Harness(lambda topic, _v, _n: REFUSED if topic == "in.dlq" else None)
    h.outcomes.dead_letter(_rec(value=b"v" * 5000), "malformed JSON", "decode")
    assert h.topics_sent() == ["in.dlq", "in.dlq"]
    minimal = h.producer.sent[1]
    assert minimal[2] == b"" and minimal[3][H_TRUNCATED] == b"value,headers"
    # skip: the offset is released (no crash loop on it), counted, and said in one line
    assert h.acked == [7] and h.counts == {"dlq": 1, "undeliverable": 1} and not h.failures
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "in[0]@7" in errors[0]
    assert h.metrics.records.labels("ctr", "in", "undeliverable")._value.get() == 1


def test_the_stop_policy_fails_without_releasing_the_offset_and_says_how_to_skip() -> None:
    h = Harness(lambda topic, _v, _n: REFUSED if topic == "in.dlq" else None, on_undeliverable="stop")
    h.outcomes.dead_letter(_rec(), "malformed JSON", "decode")
    assert h.acked == []
    [failure] = h.failures
    assert "in[0]@7" in failure and "commit offset 8 of partition 0" in failure


def test_broker_errors_are_retried_then_stop_the_worker_without_an_ack() -> None:
    h = Harness(lambda *_: BROKER_DOWN)
    h.outcomes.result(_rec(), b"{}")
    assert h.topics_sent() == ["out"] * MAX_SEND_ATTEMPTS
    assert h.acked == [] and h.failures == ["cannot deliver to out: Local: Message timed out"]


def test_a_transient_error_then_success_acks_once() -> None:
    h = Harness(lambda _t, _v, n: BROKER_DOWN if n == 1 else None)
    h.outcomes.result(_rec(), b"{}")
    assert h.acked == [7] and not h.failures


def test_a_refused_late_record_becomes_a_dead_letter() -> None:
    h = Harness(lambda topic, _v, _n: REFUSED if topic == "in.late" else None)
    h.outcomes.late([(_rec(3), 0.0), (_rec(4), 0.0)], 1000, "expired")
    assert h.topics_sent() == ["in.late", "in.dlq", "in.late", "in.dlq"]
    assert sorted(h.acked) == [3, 4] and h.counts == {"routed_late": 2, "dlq": 2}


def test_a_late_record_names_the_rule_that_routed_it() -> None:
    h = Harness(lambda *_: None)
    h.outcomes.late([(_rec(3), 900.0)], 1000, "shed")
    h.outcomes.late([(_rec(4), 900.0), (_rec(5), 950.0)], 1000, "hopeless")
    headers = [sent[3] for sent in h.producer.sent]
    assert [hd[H_LATE_RULE] for hd in headers] == [b"shed", b"hopeless", b"hopeless"]
    assert headers[2][H_DEADLINE_MISSED_BY] == b"50.0"
    routed = h.metrics.registry.get_sample_value
    assert routed("tidebatch_routed_late_total", {"pipeline": "ctr", "rule": "shed"}) == 1
    assert routed("tidebatch_routed_late_total", {"pipeline": "ctr", "rule": "hopeless"}) == 2


@pytest.mark.parametrize(("requested", "described", "expect"), [(512 * 1024, {}, 512 * 1024), (2_000_000, {}, 1_000_000 - DEAD_LETTER_HEADROOM_BYTES), (512 * 1024, {"in.dlq": 100_000}, 100_000 - DEAD_LETTER_HEADROOM_BYTES)])
def test_the_entry_limit_stays_below_what_the_dead_letter_topic_takes(requested, described, expect) -> None:
    limits, warnings = resolve_limits(
        requested_request_bytes=requested,
        producer_bytes=1_000_000,
        described=described,
        outgoing=TOPICS.all(),
        dead_letter_topic=TOPICS.dead_letter,
        prefix_bytes=0,
    )
    assert limits.request_bytes == expect
    assert bool(warnings) == (expect != requested)
    assert limits.for_topic("in.dlq") == min(described.get("in.dlq", 1_000_000), 1_000_000)


def test_refused_requests_leave_no_reference_cycles() -> None:
    """decode_all's exceptions hold tracebacks whose frames hold the refused values and
    the list of outcomes: a cycle only the (rarely run) cyclic collector frees, which
    grew a worker by gigabytes under refused 10 MB camera frames. The worker drops the
    tracebacks (pipeline/worker/admission.py, drop_traceback)."""
    import gc

    from pipeline.codecs.base import decode_all
    from pipeline.codecs.ctr import CtrCodec
    from pipeline.worker.admission import drop_traceback

    messages = [(b"{" + b"x" * 10_000, {}), (b'{"request_id": 3}', {}), (b"\xff", {})]
    gc.disable()
    try:
        gc.collect()
        outcomes = decode_all(CtrCodec(), messages)
        for outcome in outcomes:
            assert isinstance(outcome, Exception)
            drop_traceback(outcome)
        del outcomes, outcome
        assert gc.collect() == 0
        outcomes = decode_all(CtrCodec(), messages)  # and without the fix, there are cycles
        del outcomes
        assert gc.collect() > 0
    finally:
        gc.enable()


def _stage_count(metrics: WorkerMetrics, stage: str) -> tuple[float, float]:
    """(count, sum) of tidebatch_stage_seconds for one stage."""
    samples = {s.name: s.value for fam in metrics.registry.collect() for s in fam.samples
               if s.name.startswith("tidebatch_stage_seconds") and s.labels.get("stage") == stage}
    return samples.get("tidebatch_stage_seconds_count", 0.0), samples.get("tidebatch_stage_seconds_sum", 0.0)


def test_a_result_s_publish_stage_runs_from_ready_to_kafka_s_ack(monkeypatch) -> None:
    import pipeline.delivery.outcomes as outcomes_module

    h = Harness(lambda *_: None)
    monkeypatch.setattr(outcomes_module, "wall_ms", lambda: 1_000_250)
    h.outcomes.result(_rec(), b"{}", ready_wall_ms=1_000_000)
    assert _stage_count(h.metrics, "publish") == (0.0, 0.0)  # noted, observed in bulk:
    h.outcomes.observe_stages()
    assert _stage_count(h.metrics, "publish") == (1.0, 0.25)
    # Without a ready time (nothing to measure from) and on a refusal, nothing is observed.
    h.outcomes.result(_rec(8), b"{}")
    refused = Harness(lambda topic, _v, _n: REFUSED if topic == "out" else None)
    refused.outcomes.result(_rec(), b"{}", ready_wall_ms=1_000_000)
    h.outcomes.observe_stages()
    refused.outcomes.observe_stages()
    assert _stage_count(h.metrics, "publish") == (1.0, 0.25)
    assert _stage_count(refused.metrics, "publish") == (0.0, 0.0)


def test_a_missing_acl_stops_the_worker_at_once_without_retry_dead_letter_or_ack() -> None:
    # Before: retried MAX_SEND_ATTEMPTS times per record (a warning each), then a failure
    # line without the ACL's name; a dead letter would have released the offset.
    line = "Kafka topic authorization failed at b:9093: writing to out: ... (the principal lacks a topic ACL)"
    h = Harness(lambda topic, _v, _n: SendError(line, forbidden=True) if topic == "out" else None)
    h.outcomes.result(_rec(), b"{}")
    assert h.topics_sent() == ["out"]
    assert h.acked == [] and h.failures == [line] and not h.counts


def test_a_result_carries_the_requests_trace_headers_and_no_others() -> None:
    h = Harness(lambda *_: None, carry=("traceparent", "baggage"))
    trace = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    rec = SourceRecord("in", 0, 7, b"k", b"{}", {"traceparent": trace, "x-secret": b"s", "baggage": b"a=1"}, 1)
    h.outcomes.result(rec, b"{}")
    assert h.producer.sent[0][3] == {"traceparent": trace, "baggage": b"a=1"}
    h.outcomes.result(_rec(8), b"{}")  # no headers on the request: none on the result
    assert h.producer.sent[1][3] == {}
