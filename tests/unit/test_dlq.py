"""`tidebatch dlq` without a broker: what a dead letter's headers say, how reasons are
grouped, what a selection keeps and what a replay would send (pipeline/dlq/)."""

from __future__ import annotations

import pytest

from consumers.dead_letter import Origin, dead_letter_copy
from consumers.records import SourceRecord
from pipeline.cli import build_parser
from pipeline.dlq.inspect import summarize, text_lines
from pipeline.dlq.letters import (
    H_REPLAYED_FROM,
    H_REPLAYED_ORIGIN,
    DeadLetter,
    Selection,
    reason_group,
)


def _letter(offset: int, reason: str, stage: str = "decode", value: bytes = b"{bad", ts: int = 1_000, limit: int = 1_000_000) -> DeadLetter:
    rec = SourceRecord("ctr.requests", 1, 100 + offset, b"user-7", value, {"traceparent": b"00-abc-01"}, 5)
    copy = dead_letter_copy(rec, reason, stage, limit, 64, origin=Origin("g", "w", "C"))
    return DeadLetter("ctr.requests.dlq", 0, offset, ts, copy.key, copy.value, copy.headers)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("request is 600123 bytes, over the 524288-byte limit (limits.max_request_bytes)",
         "request is 700001 bytes, over the 524288-byte limit (limits.max_request_bytes)"),
        ("malformed JSON: unexpected character: line 1 column 2 (char 1)",
         "malformed JSON: unexpected character: line 3 column 40 (char 77)"),
        ("unknown request 3f2b8c1e-0d5a-4c7b-9a51-2b1f3e4d5c6a", "unknown request 00000000-1111-2222-3333-444444444444"),
        ("model rejected the request: score 0.25 for a1b2c3d4e5f60718293a", "model rejected the request: score 7 for ffeeddccbbaa99887766"),
    ],
)
def test_reasons_that_differ_only_in_numbers_and_ids_group_together(a: str, b: str) -> None:
    assert reason_group(a) == reason_group(b)


def test_words_keep_reasons_apart() -> None:
    assert reason_group("missing field 'user_id'") != reason_group("missing field 'ad_id'")
    assert reason_group("request is 600123 bytes, over the 524288-byte limit") == "request is N bytes, over the N-byte limit"


def test_a_dead_letter_reads_back_what_the_worker_wrote() -> None:
    letter = _letter(3, "malformed JSON")
    assert (letter.reason, letter.stage, letter.source_topic) == ("malformed JSON", "decode", "ctr.requests")
    assert letter.source == "ctr.requests[1]@103" and letter.truncated is None


def test_a_replay_sends_the_requests_own_headers_and_where_it_came_from() -> None:
    headers = _letter(3, "malformed JSON").replay_headers()
    assert headers == [("traceparent", b"00-abc-01"), (H_REPLAYED_FROM, b"ctr.requests.dlq/0/3"),
                       (H_REPLAYED_ORIGIN, b"ctr.requests.dlq/0/3")]


def _came_back(letter: DeadLetter, offset: int, reason: str = "malformed JSON") -> DeadLetter:
    """The dead letter a worker writes when `letter`'s replay fails again."""
    rec = SourceRecord("ctr.requests", 0, 900 + offset, letter.key, letter.value, dict(letter.replay_headers()), 5)
    copy = dead_letter_copy(rec, reason, "decode", 1_000_000, 64, origin=Origin("g", "w", "C"))
    return DeadLetter("ctr.requests.dlq", 0, offset, 2_000, copy.key, copy.value, copy.headers)


def test_a_replayed_request_that_fails_again_says_where_it_came_from() -> None:
    first = _letter(3, "malformed JSON")
    second = _came_back(first, 10)
    assert (first.replayed_from, first.origin) == (None, "ctr.requests.dlq/0/3")
    assert (second.replayed_from, second.origin) == ("ctr.requests.dlq/0/3", "ctr.requests.dlq/0/3")
    third = _came_back(second, 11)
    assert (third.replayed_from, third.origin) == ("ctr.requests.dlq/0/10", "ctr.requests.dlq/0/3")
    assert third.replay_headers()[0] == ("traceparent", b"00-abc-01")  # the request's own, once
    assert [k for k, _ in third.replay_headers()] == ["traceparent", H_REPLAYED_FROM, H_REPLAYED_ORIGIN]


def test_a_truncated_dead_letter_says_so() -> None:
    letter = _letter(4, "too big", "admit", value=b"x" * 50_000, limit=20_000)
    assert letter.truncated == "value"


def test_a_selection_by_time_reason_and_stage() -> None:
    a, b, c = _letter(1, "malformed JSON", ts=1_000), _letter(2, "request is 9 bytes", "admit", ts=2_000), _letter(3, "x", ts=None)  # type: ignore[arg-type]
    assert [x.offset for x in (a, b, c) if Selection.of(since_ms=1_500).matches(x)] == [2]
    assert [x.offset for x in (a, b, c) if Selection.of(reason="^malformed").matches(x)] == [1]
    assert [x.offset for x in (a, b, c) if Selection.of(stages=["admit"]).matches(x)] == [2]
    assert [x.offset for x in (a, b, c) if Selection.of().matches(x)] == [1, 2, 3]
    with pytest.raises(ValueError, match="not a regular expression"):
        Selection.of(reason="(")


def test_inspect_counts_by_grouped_reason_stage_and_source() -> None:
    letters = [
        _letter(0, "request is 600123 bytes, over the 524288-byte limit", "admit", ts=2_000),
        _letter(1, "request is 700001 bytes, over the 524288-byte limit", "admit", ts=1_000),
        _letter(2, "malformed JSON", ts=3_000),
        _letter(3, "too big", "admit", value=b"x" * 50_000, limit=20_000),
    ]
    summary = summarize("ctr.requests.dlq", letters)
    doc = summary.as_dict()
    assert doc["total"] == 4 and doc["truncated"] == 1 and (doc["first_ms"], doc["last_ms"]) == (1_000, 3_000)
    assert doc["reasons"][0] == {
        "reason": "request is N bytes, over the N-byte limit", "count": 2,
        "sample": {"dead_letter": "ctr.requests.dlq/0/0", "source": "ctr.requests[1]@100",
                   "reason": "request is 600123 bytes, over the 524288-byte limit",
                   "value": "{bad", "value_bytes": 4, "truncated": None},
    }
    assert doc["stages"] == {"admit": 3, "decode": 1} and doc["source_topics"] == {"ctr.requests": 4}
    text = "\n".join(text_lines(summary))
    assert "2  request is N bytes" in text and "cannot be replayed): 1" in text
    only = summarize("ctr.requests.dlq", letters, Selection.of(stages=["decode"]))
    assert only.total == 1


def test_the_dlq_commands_take_the_kafka_flags() -> None:
    args = build_parser().parse_args(
        ["dlq", "replay", "--topic", "in.dlq", "--bootstrap-servers", "b:9092", "--to", "in",
         "--reason", "JSON", "--since", "2026-01-01T00:00:00Z", "-X", "security.protocol=SSL", "--rate", "5"]
    )
    assert (args.to, args.rate, args.kafka_settings, args.since) == ("in", 5.0, ["security.protocol=SSL"], 1767225600000)


# ----------------------------------------------------------------------------- replay, without Kafka
class _FakeSender:
    sent: list[tuple[int, float]] = []
    checkpoints = 0

    def __init__(self, job: object, ledger: str) -> None:
        _FakeSender.sent, _FakeSender.checkpoints = [], 0

    def send(self, letter: DeadLetter, wait_s: float) -> None:
        _FakeSender.sent.append((letter.offset, wait_s))

    def checkpoint(self) -> None:
        _FakeSender.checkpoints += 1


def _replay(monkeypatch: pytest.MonkeyPatch, letters: list[DeadLetter], ledger: list[bytes], **job: object):
    from pipeline.dlq import replay as r

    def read(_b: str, _p: str, topic: str, **_kw: object) -> list[DeadLetter]:
        if topic.endswith(".replayed"):
            return [DeadLetter(topic, 0, i, None, k, b"{}", []) for i, k in enumerate(ledger)]
        return letters

    monkeypatch.setattr(r, "read_topic", read)
    monkeypatch.setattr(r, "topic_exists", lambda *_a, **_k: True)
    monkeypatch.setattr(r, "_Sender", _FakeSender)
    ticks = iter(range(1000))
    settings = {"selection": Selection.of(), "rate": 10.0, **job}
    report = r.replay(r.ReplayJob("b:9092", "kafka", "ctr.requests.dlq", "ctr.requests", **settings),  # type: ignore[arg-type]
                      clock=lambda: next(ticks) * 0.01)
    return report


def test_replay_skips_what_the_ledger_lists_and_never_sends_a_truncated_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    letters = [_letter(0, "malformed JSON"), _letter(1, "too big", "admit", value=b"x" * 50_000, limit=20_000),
               _letter(2, "malformed JSON"), _letter(3, "malformed JSON"), _letter(4, "other")]
    report = _replay(monkeypatch, letters, [b"0/2"], selection=Selection.of(reason="JSON|too big"))
    assert (report.selected, report.replayed, report.already, report.truncated) == (4, 2, 1, 1)
    assert [o for o, _ in _FakeSender.sent] == [0, 3] and _FakeSender.checkpoints == 1
    assert report.line("ctr.requests", False) == (
        "replayed 2 of 4 selected dead letters to ctr.requests; 1 already replayed by an earlier run (skipped); "
        "1 truncated to fit the dead-letter topic: cannot be replayed"
    )


def test_replay_is_paced_at_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    letters = [_letter(i, "malformed JSON") for i in range(4)]
    _replay(monkeypatch, letters, [], rate=10.0)
    # 10/s: record i is due 0.1 s * i after the start; the fake clock moves 10 ms a call.
    assert [round(w, 3) for _, w in _FakeSender.sent] == [0.0, 0.08, 0.17, 0.26]


def test_a_dry_run_or_again_changes_what_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    letters = [_letter(i, "malformed JSON") for i in range(3)]
    dry = _replay(monkeypatch, letters, [b"0/0"], dry_run=True)
    assert (dry.replayed, dry.already) == (2, 1) and dry.line("t", True).startswith("would replay 2 of 3")
    again = _replay(monkeypatch, letters, [b"0/0"], again=True)
    assert (again.replayed, again.already) == (3, 0) and len(_FakeSender.sent) == 3


def test_a_request_that_came_back_from_a_replay_is_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: a periodic replay looped for ever on a request that can never pass,
    sending each run the dead letter its previous run's replay made."""
    first = _letter(0, "malformed JSON")
    second = _came_back(first, 1)
    report = _replay(monkeypatch, [first, second], [b"0/0"])
    assert (report.selected, report.replayed, report.already, report.came_back) == (2, 0, 1, 1)
    assert _FakeSender.sent == []
    assert report.line("ctr.requests", False) == (
        "replayed 0 of 2 selected dead letters to ctr.requests; 1 already replayed by an earlier run (skipped); "
        "1 came back from an earlier replay, failed again (skipped; --again sends them)"
    )
    # --again: sent, but the request once, however many of its dead letters are selected.
    again = _replay(monkeypatch, [first, second, _came_back(second, 2), _letter(5, "other")], [b"0/0"], again=True)
    assert (again.replayed, again.same_request, again.came_back) == (2, 2, 0)
    assert [o for o, _ in _FakeSender.sent] == [0, 5]
    assert "2 of a request sent once already in this run (skipped)" in again.line("t", False)


def test_inspect_counts_how_often_a_request_came_back() -> None:
    first, other = _letter(0, "malformed JSON"), _letter(1, "malformed JSON")
    second = _came_back(first, 2)
    letters = [first, other, second, _came_back(second, 3), _came_back(other, 4)]
    summary = summarize("ctr.requests.dlq", letters)
    assert summary.as_dict()["came_back"] == {"dead_letters": 3, "requests": [
        {"first_dead_letter": "ctr.requests.dlq/0/0", "times": 2}, {"first_dead_letter": "ctr.requests.dlq/0/1", "times": 1}]}
    text = text_lines(summary)
    assert text[-3].startswith("came back from a replay (failed again; `dlq replay` skips them unless --again): "
                               "3 dead letters of 2 requests")
    assert text[-2:] == ["         2  ctr.requests.dlq/0/0", "         1  ctr.requests.dlq/0/1"]
    assert "came back" not in "\n".join(text_lines(summarize("t", [first, other])))


class _FakeProducer:
    """Records sends and flushes in order; delivery reports come at flush."""

    def __init__(self, _config: object, fail: set[int] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.pending: list[tuple[object, object]] = []
        self.fail = fail or set()

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: object, on_ack) -> None:
        self.calls.append(("send", topic, (key or b"").decode()))
        from consumers.records import SendError

        offset = int(dict(headers or []).get(H_REPLAYED_FROM, b"x/0/-1").split(b"/")[-1])
        self.pending.append((on_ack, SendError("broker said no") if offset in self.fail else None))

    def poll(self, _timeout: float = 0.0) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        self.calls.append(("flush",))
        done, self.pending = self.pending, []
        for on_ack, err in done:
            on_ack(err)
        return 0


def _sender(monkeypatch: pytest.MonkeyPatch, fail: set[int] | None = None):
    import consumers.admin
    import consumers.confluent_backend
    from pipeline.dlq import replay as r

    monkeypatch.setattr(consumers.admin, "ensure_topics", lambda *_a, **_k: {})
    producer = _FakeProducer(None, fail)
    monkeypatch.setattr(consumers.confluent_backend, "ConfluentProducer", lambda _config: producer)
    job = r.ReplayJob("b:9092", "kafka", "in.dlq", "in", Selection.of(), 100.0)
    return r._Sender(job, "in.dlq.replayed"), producer


def test_the_ledger_is_written_only_after_the_replayed_records_are_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    sender, producer = _sender(monkeypatch)
    for i in range(2):
        sender.send(_letter(i, "malformed JSON"), 0.0)
    sender.checkpoint()
    assert producer.calls == [
        ("send", "in", "user-7"), ("send", "in", "user-7"), ("flush",),
        ("send", "in.dlq.replayed", "0/0"), ("send", "in.dlq.replayed", "0/1"), ("flush",),
    ]


def test_a_record_kafka_did_not_take_is_not_listed_and_the_run_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.errors import UserError

    sender, producer = _sender(monkeypatch, fail={1})
    for i in range(3):
        sender.send(_letter(i, "malformed JSON"), 0.0)
    with pytest.raises(UserError, match="1 records were not delivered to in .*ctr.requests.dlq/0/1: broker said no"):
        sender.checkpoint()
    assert [c[2] for c in producer.calls if c[0] == "send" and c[1] == "in.dlq.replayed"] == ["0/0", "0/2"]
