"""The outage watch (pipeline/delivery/kafka_progress.py): work waiting on Kafka without
a success for stall_s is an outage, said in one line at its start, one per report
interval, one at its end with its length; readiness reads it (pipeline/ops/health.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from pipeline.delivery.kafka_progress import COMMIT, DELIVERY, KafkaProgress
from pipeline.ops.health import readiness


def test_waiting_without_success_becomes_an_outage_and_ends() -> None:
    p = KafkaProgress(0.0, stall_s=10.0, report_every_s=10.0)
    lines: list[tuple[float, str]] = []
    p.waiting(DELIVERY, 40, 1.0)
    p.waiting(COMMIT, 3, 1.0)
    for t in range(2, 45):
        if t == 13:
            p.failed(COMMIT)
            p.failed(COMMIT)
        if t < 35:
            lines += [(t, line) for line in p.step(float(t))]
            continue
        p.ok(DELIVERY, float(t))
        p.ok(COMMIT, float(t))
        p.waiting(DELIVERY, 0, float(t))
        p.waiting(COMMIT, 0, float(t))
        lines += [(t, line) for line in p.step(float(t))]
    assert [t for t, _ in lines] == [11, 21, 31, 35]
    assert lines[0][1] == ("Kafka outage: no delivery acknowledged for 10 s (40 records waiting); "
                           "no offset commit for 10 s (3 partitions waiting); not ready until it ends")
    assert lines[1][1].startswith("Kafka outage for 20 s: no delivery acknowledged for 20 s")
    assert "(2 commit failures meanwhile)" in lines[1][1]
    assert lines[3][1] == ("Kafka outage over after 34.0 s: deliveries and commits go through again "
                           "(2 commit failures meanwhile)")
    assert p.outages == 1 and not p.in_outage and p.stalled(45.0) == []


def test_successes_while_work_waits_are_no_outage() -> None:
    # A busy worker always has records in flight; acks keep coming, so no stall.
    p = KafkaProgress(0.0, stall_s=10.0)
    for t in range(1, 60):
        p.waiting(DELIVERY, 500, float(t))
        p.ok(DELIVERY, float(t))
        assert p.step(float(t)) == []
    assert p.outages == 0


def test_idle_worker_is_never_in_an_outage() -> None:
    p = KafkaProgress(0.0, stall_s=10.0)
    p.waiting(DELIVERY, 0, 1.0)
    assert p.stalled(1000.0) == [] and p.step(1000.0) == []


def test_waiting_counts_from_when_work_began_to_wait() -> None:
    # Last success long ago, but the work has waited only 5 s: not yet an outage.
    p = KafkaProgress(0.0, stall_s=10.0)
    p.waiting(COMMIT, 1, 100.0)
    assert p.stalled(105.0) == []
    assert p.stalled(110.0) == ["no offset commit for 10 s (1 partitions waiting)"]


def test_work_aborted_and_sent_again_goes_on_waiting() -> None:
    # exactly_once through a lost quorum: each open transaction is aborted at
    # transaction_timeout_ms (10 s) and its records sent again. The wait must add up
    # across the aborts: before, each one started it afresh, so with stall_s 15 s a
    # 20 s quorum loss was never an outage (a CI run of test_cluster_faults.py).
    p = KafkaProgress(0.0, stall_s=15.0)
    p.ok(DELIVERY, 1.0)
    p.waiting(DELIVERY, 40, 2.0)
    p.aborted()  # pipeline/delivery/transactions.py, at transaction_timeout_ms
    p.waiting(DELIVERY, 0, 12.0)  # purged, nothing acknowledged
    p.waiting(DELIVERY, 40, 13.0)  # the same records again
    assert p.stalled(16.0) == []
    assert p.stalled(17.0) == ["no delivery acknowledged for 15 s (40 records waiting)"]
    p.ok(DELIVERY, 18.0)
    assert p.stalled(18.0) == []


def test_aborted_work_waits_while_nothing_is_sampled() -> None:
    # A new producer being made, or the source loop held in calls shorter than
    # stall_s each: the sampled count stays 0 for as long, yet the work still waits.
    p = KafkaProgress(0.0, stall_s=15.0)
    p.waiting(COMMIT, 3, 2.0)
    p.aborted()
    p.waiting(COMMIT, 0, 12.0)
    assert p.stalled(16.0) == []
    assert p.stalled(17.0) == ["no offset commit for 15 s (an aborted transaction's, to be sent again)"]
    p.ok(COMMIT, 40.0)
    p.waiting(COMMIT, 0, 40.0)
    assert p.stalled(100.0) == []


def test_work_that_went_through_or_was_let_go_starts_a_new_wait() -> None:
    p = KafkaProgress(0.0, stall_s=15.0)
    p.waiting(COMMIT, 2, 2.0)
    p.ok(COMMIT, 10.0)
    p.waiting(COMMIT, 0, 10.0)  # committed: nothing waits
    p.aborted()  # an abort with nothing waiting owes nothing
    p.waiting(COMMIT, 2, 11.0)
    assert p.stalled(25.0) == [] and p.stalled(26.0) != []
    # A success in the same turn as the wait began was for earlier work: the aborted
    # work waits from then (a quorum run: ok and 28 records waiting at one sample).
    o = KafkaProgress(0.0, stall_s=15.0)
    o.ok(DELIVERY, 45.0)
    o.waiting(DELIVERY, 28, 45.0)
    o.aborted()
    o.waiting(DELIVERY, 0, 50.0)
    assert o.stalled(59.0) == [] and o.stalled(60.0) == [
        "no delivery acknowledged for 15 s (an aborted transaction's, to be sent again)"]
    q = KafkaProgress(0.0, stall_s=15.0)
    q.waiting(COMMIT, 2, 2.0)
    q.aborted(owed=False)  # every partition of it let go
    q.waiting(COMMIT, 0, 5.0)
    q.waiting(COMMIT, 2, 6.0)  # new partitions' work: its own wait
    assert q.stalled(20.0) == [] and q.stalled(21.0) != []
    s = KafkaProgress(0.0, stall_s=15.0)
    s.waiting(COMMIT, 2, 2.0)
    s.aborted()
    s.waiting(COMMIT, 0, 5.0)
    s.settled()  # the next transaction had nothing to commit: let go since
    assert s.stalled(100.0) == []
    # Partitions revoked with their commit unanswered, new ones assigned 1 s later: a
    # rebalance, not an abort; the new partitions' wait is their own.
    r = KafkaProgress(0.0, stall_s=10.0)
    r.waiting(COMMIT, 2, 2.0)
    r.waiting(COMMIT, 0, 8.0)
    r.waiting(COMMIT, 2, 9.0)
    assert r.stalled(18.0) == [] and r.stalled(19.0) != []


def test_failures_before_a_success_are_not_the_outages() -> None:
    p = KafkaProgress(0.0, stall_s=10.0)
    p.failed(COMMIT)
    p.ok(COMMIT, 1.0)
    p.waiting(COMMIT, 1, 2.0)
    assert p.step(12.0)[0].endswith("not ready until it ends")  # no "1 commit failures"


def _worker(progress: KafkaProgress) -> SimpleNamespace:
    started = threading.Event()
    started.set()
    return SimpleNamespace(started=started, assigned=[("t", 0)], last_poll_ok=99.0, kafka_progress=progress,
                           session=SimpleNamespace(provider="CPUExecutionProvider"), stopping=False, failure=None)


def test_readiness_fails_during_an_outage_and_recovers() -> None:
    p = KafkaProgress(0.0, stall_s=10.0)
    p.waiting(DELIVERY, 7, 80.0)
    ready, body = readiness(_worker(p), 100.0)
    assert not ready
    assert body["reason"] == "Kafka outage: no delivery acknowledged for 20 s (7 records waiting)"
    assert body["checks"]["kafka_writes"] == ["no delivery acknowledged for 20 s (7 records waiting)"]
    p.ok(DELIVERY, 100.0)
    ready, body = readiness(_worker(p), 100.5)
    assert ready and body["checks"]["kafka_writes"] == "ok"


def test_a_call_that_does_not_return_is_an_outage_of_its_own() -> None:
    # The source thread inside abort_transaction samples nothing: the call itself,
    # reported by the watchdog thread, is the wait (pipeline/delivery/outage_log.py).
    p = KafkaProgress(0.0, stall_s=10.0)
    p.in_call(None, 5.0, 5.0)
    p.in_call("abort_transaction", 6.0, 7.0)
    assert p.step(15.0) == []
    assert p.step(16.0) == ["Kafka outage: Kafka call abort_transaction not returned for 10 s; not ready until it ends"]
    p.in_call(None, 30.0, 30.0)
    assert p.step(30.0) == ["Kafka outage over after 24.0 s: deliveries and commits go through again"]


def test_calls_one_after_another_without_a_loop_turn_add_up() -> None:
    # A quorum test's exactly_once worker: flush 4 s, abort 0.6 s, then a new
    # producer's init_transactions twice (10 s, a 1 s pause, 8 s); the source loop
    # sampled nothing for 24 s and, each call shorter than stall_s, no outage was said.
    p = KafkaProgress(0.0, stall_s=15.0)
    p.in_call(None, 46.0, 46.0)  # the loop's turn
    p.in_call("flush", 46.6, 47.0)
    p.in_call("abort_transaction", 50.6, 51.0)
    p.in_call("init_transactions", 51.2, 52.0)
    p.in_call(None, 61.2, 61.2, loop=False)  # the watchdog, in the pause between two
    assert p.stalled(61.5) == []  # in no call just now
    p.in_call("init_transactions", 62.2, 62.5)
    assert p.step(62.5) == ["Kafka outage: Kafka calls held the source loop for 16 s "
                            "(flush first, now init_transactions); not ready until it ends"]
    p.in_call(None, 70.1, 70.1)  # the loop turns again
    assert p.step(70.1) == ["Kafka outage over after 23.5 s: deliveries and commits go through again"]
    p.in_call("commit_transaction", 71.0, 71.0)
    assert p.stalled(85.0) == [] and p.stalled(86.0) == ["Kafka call commit_transaction not returned for 15 s"]
    # The same call twice is two calls, not one that has not returned.
    q = KafkaProgress(0.0, stall_s=15.0)
    q.in_call("init_transactions", 1.0, 1.0)
    q.in_call(None, 11.0, 11.0, loop=False)
    q.in_call("init_transactions", 12.0, 12.0)
    assert q.stalled(16.0) == ["Kafka calls held the source loop for 15 s (init_transactions first, now init_transactions)"]


def test_broker_statistics_feed_the_connection_counters() -> None:
    import orjson

    from pipeline.delivery.outage_log import OutageLog
    from pipeline.delivery.watchdog import CallWatch
    from pipeline.observe.metrics import WorkerMetrics

    metrics = WorkerMetrics("ctr", "adaptive")
    out = OutageLog(KafkaProgress(0.0), metrics, "ctr", CallWatch())
    brokers = {"a:1/1": {"state": "UP", "connects": 1, "disconnects": 0, "source": "learned"},
               "b:2/2": {"state": "DOWN", "connects": 1, "disconnects": 1, "source": "learned"}}
    out.broker_stats(orjson.dumps({"brokers": brokers}).decode())
    out.broker_stats("not json")  # a bad document is skipped, never raised into the poll
    value = metrics.registry.get_sample_value
    assert value("tidebatch_broker_connects_total", {"pipeline": "ctr"}) == 2
    assert value("tidebatch_broker_disconnects_total", {"pipeline": "ctr"}) == 1
    assert value("tidebatch_brokers_up", {"pipeline": "ctr"}) == 1
