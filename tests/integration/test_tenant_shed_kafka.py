"""Admission's tenant-aware shedding on Apache Kafka (issue 24; pipeline/worker/admission.py
`expired_before_decoding`, docs/BATCHING.md "The fix: admission sheds classes over their
share first"): a backlog that waits in Kafka before the worker starts, too old for the
reserve, is shed for the class over its share, while the older records of the classes
within their shares are decoded, queued and scored.

Deterministic, not timed: the backlog is produced before the worker starts, with Kafka
timestamps set by hand (CreateTime), so every record's age when the worker polls it is
its set age plus the worker's start-up, whatever the machine's pace. With a budget of
an hour, the reserve before anything was answered is half of it (pipeline/batching/
shed.py `reserve_ms`, learned only from answered batches) and the decode cost is not
yet known (`DecodeCost`: 0 until a poll was timed), so in the first poll a record of a
class over its share is shed when older than 30 min, one of a class within its share
only when past the whole hour. The backlog (190 requests of ~5 items, ~0.3 MB) is well
under one fetch's 1 MiB a partition and one poll's records (worker/compose.py
POLL_RECORDS), and the over-share class's records come first in the partition, so even
a fetch that split it would hand them all to the first poll. The over-share class has a share of 0 (best effort):
a class with a share is over it only once its records reached the gate lately
(TenantGate.over_share: the recent rate, an empty estimate when the worker starts),
which would make the outcome hang on which poll saw what.

Before the fix (admission tenant-blind, the oldest first) every record past 30 min was
routed, whatever its class; and admission's routes were not counted per class in
tidebatch_tenant_requests_total."""

from __future__ import annotations

import time
from collections import Counter

from confluent_kafka import Producer

from consumers.profiles import producer_config
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.ops import stats as S
from tests.integration import opsutil
from tests.integration.outcome_reader import OutcomeReader, exactly_one

BUDGET_MS = 3_600_000  # every class's SLO; the loosest budget, admission's expiry horizon
MIN_MS = 60_000
# Per request group: (tenant, its class, how many, age at produce time in ms). In
# partition order: the over-share class first (see the module docstring).
BACKLOG = (
    ("noisy", "bronze", 60, 33 * MIN_MS),  # over its share, 33 min old: past the reserve
    ("silver", "silver", 10, 66 * MIN_MS),  # within its share but past its deadline
    ("acme", "gold", 60, 45 * MIN_MS),  # within its share, older than bronze's
    ("silver", "silver", 60, 40 * MIN_MS),
)
TENANTS = {
    "capacity_rows_per_s": 2000,
    "classes": {
        "gold": {"share": 0.5, "slo_ms": BUDGET_MS, "members": ["acme"]},
        "silver": {"share": 0.3, "slo_ms": BUDGET_MS},
        "bronze": {"share": 0.0, "slo_ms": BUDGET_MS, "members": ["noisy"]},
    },
}


def _produce_backlog(bootstrap: str, profile: str, topic: str) -> list[str]:
    """The backlog, one partition, in BACKLOG's order; the class of each offset."""
    producer = Producer(producer_config(profile, bootstrap))
    now_ms = int(time.time() * 1000)
    classes: list[str] = []
    for seed, (tenant, name, count, age_ms) in enumerate(BACKLOG):
        factory = CtrRequestFactory(seed=seed + 1, mean_items=5, tenant=tenant)
        for i in range(count):
            key, value = factory.make(i)
            producer.produce(topic, key=key, value=value, timestamp=now_ms - age_ms)
            classes.append(name)
    assert producer.flush(30) == 0
    return classes


def _metric(samples: S.Samples, name: str, **labels: str) -> float:
    return sum(v for ls, v in samples.get(name, {}).items() if labels.items() <= dict(ls).items())


def test_a_backlog_sheds_the_class_over_its_share_and_scores_the_older_records_within_theirs(
    kafka_broker, kafka_topic_factory, unique_group_id
) -> None:
    broker = kafka_broker
    topics = opsutil.make_topics(kafka_topic_factory, 1)
    classes = _produce_backlog(broker.bootstrap_servers, broker.profile, topics.input)
    cfg = opsutil.worker_config(
        broker, topics, unique_group_id,
        batching={"policy": "adaptive", "expiry_action": "route_late", "slo_ms": BUDGET_MS, "shed_reserve": 0.5},
        tenants=TENANTS,
    )
    reader = OutcomeReader(broker.bootstrap_servers, topics)
    try:
        with opsutil.live_worker(cfg) as live:
            outcomes = reader.read_until(len(classes), timeout=60)

            results = sum(kind == "result" for outs in outcomes.values() for kind, _ in outs)

            def scored_counted() -> S.Samples | None:
                m = S.from_text(opsutil.http_get(live.url + "/metrics")[2])
                counted = sum(_metric(m, "tidebatch_tenant_requests_total", outcome=o) for o in ("ok", "late"))
                return m if counted >= results else None

            # The publisher counts a result around its send: wait for the results read
            # to be counted, not for a time.
            m = opsutil.wait_for(scored_counted, 30, "the scored requests counted per class")
            assert live.thread.is_alive()
        assert live.worker.failure is None
    finally:
        reader.close()

    # None lost, none twice: one outcome per input offset, a result or a late record.
    exactly_one(outcomes, len(classes))
    kinds = Counter((classes[offset], kind) for offset, ((kind, _),) in outcomes.items())
    expired = BACKLOG[1][2]
    # The class over its share: all of it routed late, though its records are the
    # youngest of the backlog; within their shares: everything scored but the records
    # already past their deadline (late whatever their class).
    assert kinds == {
        ("bronze", "late"): 60,
        ("gold", "result"): 60,
        ("silver", "result"): 60,
        ("silver", "late"): expired,
    }, kinds

    # Admission's routes count under the right class, one outcome per request.
    requests = "tidebatch_tenant_requests_total"
    assert _metric(m, requests, tenant_class="bronze", outcome="routed_late") == 60
    assert _metric(m, requests, tenant_class="silver", outcome="routed_late") == expired
    assert _metric(m, requests, tenant_class="gold", outcome="routed_late") == 0
    assert _metric(m, requests, tenant_class="gold", outcome="ok") == 60
    assert _metric(m, requests, tenant_class="silver", outcome="ok") == 60
    assert _metric(m, requests, tenant_class="bronze") == 60  # routed before the gate: none reached it
    assert _metric(m, "tidebatch_tenant_rows_total", tenant_class="bronze") == 0
