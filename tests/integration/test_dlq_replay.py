"""Dead letters a real worker wrote carry Kafka Connect's headers; `tidebatch dlq
inspect` counts them by grouped reason; `tidebatch dlq replay --reason` sends exactly
the chosen requests again, and a second run sends nothing new (pipeline/dlq/); a
replayed request that fails again is not sent by the next run (issue 48)."""

from __future__ import annotations

import json
import time

import pytest

from consumers.dead_letter import (
    C_CLASS,
    C_CONNECTOR,
    C_EXCEPTION,
    C_MESSAGE,
    C_OFFSET,
    C_PARTITION,
    C_STAGE,
    C_TASK,
    C_TOPIC,
    H_ERROR,
    H_STAGE,
)
from pipeline.cli import main
from pipeline.dlq.letters import H_REPLAYED_FROM, H_REPLAYED_ORIGIN
from pipeline.loadgen.ctr import CtrRequestFactory
from tests.integration import opsutil
from tests.integration.outcome_reader import OutcomeReader, produce, score_in_thread, topics_for
from tests.integration.pipeline_helpers import read_topic

pytestmark = pytest.mark.timeout(300)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_dead_letters_are_inspected_and_replayed_once(broker, topic_factory, unique_group_id, capsys) -> None:
    topics = topics_for(topic_factory)
    target = topic_factory("replayed-to", 1)
    topic_factory(f"{topics.dlq}.replayed", exact=True)  # the ledger; created here to be deleted at teardown
    factory = CtrRequestFactory(seed=8)
    valid = [(k, v, []) for k, v in (factory.make(i) for i in range(10))]
    trace = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
    malformed = [(b"m", b"{not json", trace) for _ in range(3)]
    too_big = [(b"b", b"{" + b"x" * size, trace) for size in (30_000, 42_345)]
    messages = valid[:5] + malformed + too_big + valid[5:]
    cfg = opsutil.worker_config(broker, topics, unique_group_id, metrics={"enabled": False},
                                limits={"max_request_bytes": 20_000})
    outcomes = score_in_thread(broker, topics, cfg, messages)
    dead = {o: v[0][1] for o, v in outcomes.items() if v[0][0] == "dlq"}
    assert sorted(dead) == [5, 6, 7, 8, 9]

    # Connect's headers, alongside ours.
    headers, _ = dead[5]
    assert headers[H_STAGE] == b"decode" and headers[C_STAGE] == b"VALUE_CONVERTER"
    assert (headers[C_TOPIC], headers[C_PARTITION], headers[C_OFFSET]) == (topics.input.encode(), b"0", b"5")
    assert headers[C_CONNECTOR] == unique_group_id.encode() and headers[C_TASK]
    assert headers[C_CLASS] == b"pipeline.codecs.ctr.CtrCodec"
    assert headers[C_EXCEPTION].endswith(b"Error") and headers[C_MESSAGE] == headers[H_ERROR]
    big, _ = dead[8]
    assert big[C_EXCEPTION] == b"tidebatch.RequestTooLarge" and big[C_STAGE] == b"KAFKA_CONSUME"

    kafka = ["--topic", topics.dlq, "--bootstrap-servers", broker.bootstrap_servers, "--broker-profile", broker.profile]
    report = json.loads(_run(capsys, "dlq", "inspect", *kafka, "--json"))
    assert report["total"] == 5 and report["stages"] == {"decode": 3, "admit": 2}
    assert report["source_topics"] == {topics.input: 5}
    by_reason = {r["reason"]: r["count"] for r in report["reasons"]}
    assert by_reason["request is N bytes, over the N-byte limit (limits.max_request_bytes)"] == 2, by_reason
    assert sorted(by_reason.values()) == [2, 3]
    assert "5 dead letters" in _run(capsys, "dlq", "inspect", *kafka)

    replay = ["dlq", "replay", *kafka, "--to", target, "--rate", "1000"]
    assert _run(capsys, *replay, "--reason", "over the .*limit").startswith(f"replayed 2 of 2 selected dead letters to {target}")
    sent = read_topic(broker.bootstrap_servers, target, 2, timeout=30)
    assert sorted(len(m.value()) for m in sent) == [30_001, 42_346]
    for m in sent:
        h = m.headers()
        assert h[0] == trace[0] and [k for k, _ in h[1:]] == [H_REPLAYED_FROM, H_REPLAYED_ORIGIN]  # none of ours
        assert m.key() == b"b"

    again = _run(capsys, *replay, "--reason", "over the .*limit")
    assert again.startswith("replayed 0 of 2") and "2 already replayed" in again
    dry = _run(capsys, *replay, "--dry-run")
    assert dry.startswith("would replay 3 of 5") and "2 already replayed" in dry
    assert len(read_topic(broker.bootstrap_servers, target, 3, timeout=3)) == 2  # nothing more was sent

    # The rate bound: 3 records at 10/s take at least 0.2 s (the first goes at once).
    elsewhere = topic_factory("replayed-again", 1)
    t0 = time.monotonic()
    out = _run(capsys, "dlq", "replay", *kafka, "--to", elsewhere, "--rate", "10", "--stage", "decode")
    assert out.startswith("replayed 3 of 3") and time.monotonic() - t0 >= 0.2
    assert sorted(m.value() for m in read_topic(broker.bootstrap_servers, elsewhere, 3, timeout=30)) == [b"{not json"] * 3


def test_a_request_that_fails_again_after_its_replay_is_sent_once(broker, topic_factory, unique_group_id, capsys) -> None:
    """A periodic replay (the same command, run again and again) of a request that can
    never pass: its replay fails again and makes a new dead letter, which the next run
    skips as having come back, instead of sending the request on every run for ever."""
    topics = topics_for(topic_factory)
    topic_factory(f"{topics.dlq}.replayed", exact=True)  # the ledger; created here to be deleted at teardown
    key, value = CtrRequestFactory(seed=9).make(0)
    cfg = opsutil.worker_config(broker, topics, unique_group_id, metrics={"enabled": False})
    kafka = ["--topic", topics.dlq, "--bootstrap-servers", broker.bootstrap_servers, "--broker-profile", broker.profile]
    replay = ["dlq", "replay", *kafka, "--to", topics.input, "--rate", "1000"]
    reader = OutcomeReader(broker.bootstrap_servers, topics)
    try:
        with opsutil.live_worker(cfg) as live:
            opsutil.wait_for(lambda: live.worker.assigned, 60, "partitions")
            produce(broker.bootstrap_servers, topics.input, [(key, value, []), (b"m", b"{never valid", [])])
            reader.read_until(2)
            assert _run(capsys, *replay).startswith(f"replayed 1 of 1 selected dead letters to {topics.input}")
            reader.read_until(3)  # the replay (input offset 2) failed again: a second dead letter
            second = _run(capsys, *replay)
            assert second.startswith("replayed 0 of 2") and "1 came back from an earlier replay" in second, second
            assert _run(capsys, *replay).startswith("replayed 0 of 2")  # and so every later run
            report = json.loads(_run(capsys, "dlq", "inspect", *kafka, "--json"))
            assert report["came_back"] == {"dead_letters": 1, "requests": [
                {"first_dead_letter": f"{topics.dlq}/0/0", "times": 1}]}
            # --again sends the request once more, once, though two of its dead letters are selected.
            again = _run(capsys, *replay, "--again")
            assert again.startswith("replayed 1 of 2") and "1 of a request sent once already" in again, again
            reader.read_until(4)
            after = _run(capsys, *replay)
            assert after.startswith("replayed 0 of 3") and "2 came back" in after, after
            assert json.loads(_run(capsys, "dlq", "inspect", *kafka, "--json"))["came_back"]["requests"][0]["times"] == 2
    finally:
        reader.close()
    sent = read_topic(broker.bootstrap_servers, topics.input, 5, timeout=3)
    assert [m.value() for m in sent] == [value, b"{never valid", b"{never valid", b"{never valid"]
    assert [dict(m.headers() or [])[H_REPLAYED_ORIGIN] for m in sent[2:]] == [f"{topics.dlq}/0/0".encode()] * 2
