"""Shedding before decoding with tenant classes (pipeline/worker/admission.py,
pipeline/batching/shed.py shed_prefix, TenantGate.over_share, the CTR codec's tenant
peek): a burster's old records go first, a steady tenant's record of the same age is
decoded and queued green. Fake clock and fixed wall times: no sleeps."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from prometheus_client import CollectorRegistry

from consumers.records import SourceRecord
from pipeline.batching.batcher import Batcher
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.policies import AdaptivePolicy
from pipeline.batching.request import Request
from pipeline.batching.shed import shed_prefix
from pipeline.batching.tenants import TenantClass, TenantGate
from pipeline.clock import FakeClock
from pipeline.codecs import ctr_binary
from pipeline.codecs.ctr import CtrCodec
from pipeline.codecs.tenant_peek import peek_tenant
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.observe.tenant_metrics import TenantOutcomes
from pipeline.worker.admission import Admission
from pipeline.worker.tenant_standing import GateStanding, gate_standing

WALL = 1_700_000_000_000
BUDGET_MS = 100.0  # reserve 0.5: a record must reach the queue by 50 ms of age


class Routed:
    """Where admission's routed-late and dead-lettered records go (pipeline/delivery/outcomes.py
    Outcomes in the worker): kept here to be counted."""

    def __init__(self) -> None:
        self.offsets: list[int] = []

    def dead_letter(self, rec: SourceRecord, reason: str, stage: str, *, error: object = None) -> None:
        raise AssertionError(f"offset {rec.offset}: {reason}")

    def late_records(self) -> list[int]:
        return sorted(self.offsets)

    def late(self, routed: Sequence[tuple[SourceRecord, float]], now_wall: int, rule: str) -> None:
        self.offsets += [rec.offset for rec, _ in routed]


def ctr_value(i: int, tenant: str | None) -> bytes:
    _, value = CtrRequestFactory(seed=3).make(i)
    doc = orjson.loads(value)
    if tenant is not None:
        doc["tenant"] = tenant
    return orjson.dumps(doc)


def worker_queue(clock: FakeClock) -> BatchQueue:
    """Shares in rows/s: steady 1000, burster 100 (a CTR request is ~20 rows)."""
    gate = TenantGate({"steady": TenantClass("steady", 1000.0, 100.0), "burster": TenantClass("burster", 100.0, 10.0)})
    batcher = Batcher(AdaptivePolicy(max_batch_rows=512), CostModel(prior=AffineCost(1e-4, 1e-5)), tenants=gate)
    return BatchQueue(batcher, clock=clock)


def send_for_a_second(queue: BatchQueue, clock: FakeClock) -> None:
    """Lately: steady at its share, the burster at 3x its share (through the gate)."""
    gate = queue.batcher.tenants
    assert gate is not None
    for k in range(100):
        now = clock.now() + k / 100
        gate.mark(Request(rows=10, arrival=now, deadline=now + 1, tenant="steady"), now)
        gate.mark(Request(rows=3, arrival=now, deadline=now + 1, tenant="burster"), now)
    clock.advance(1.0)


def admission(routed: Routed, codec, standing) -> Admission:
    """An admission in a burst: its polls' records have been old for half a budget (a
    backlog stands, pipeline/batching/shed.py StandingBacklog) and batches took 50 ms
    from decode to answer (the reserve: half the budget)."""
    adm = Admission(codec, lambda p: BUDGET_MS, routed, 1_000_000, BUDGET_MS, reserve=0.5, tenants=standing)
    adm.standing.poll(WALL - BUDGET_MS, BUDGET_MS, BUDGET_MS)
    adm.answer_time.observe([50.0])
    return adm


def poll() -> list[SourceRecord]:
    """Offsets 0, 1: steady and burster records 60 ms old (less than half the budget
    left); 2, 3: the same, fresh."""
    return [
        SourceRecord("in", 0, 0, b"k", ctr_value(0, "steady"), {}, WALL - 60),
        SourceRecord("in", 0, 1, b"k", ctr_value(1, "burster"), {}, WALL - 60),
        SourceRecord("in", 0, 2, b"k", ctr_value(2, "steady"), {}, WALL - 1),
        SourceRecord("in", 0, 3, b"k", ctr_value(3, "burster"), {}, WALL - 1),
    ]


def test_an_old_record_of_a_class_within_its_share_is_decoded_and_an_old_bursters_is_shed():
    clock = FakeClock(10.0)
    queue = worker_queue(clock)
    send_for_a_second(queue, clock)
    registry = CollectorRegistry()
    counts = TenantOutcomes(registry, "ctr", (0.1,), {})
    routed = Routed()
    adm = admission(routed, CtrCodec(), GateStanding(queue, counts))
    reqs = adm.admit(poll(), clock.now(), WALL)
    # Before: both 60 ms-old records were routed, whatever their tenant.
    assert routed.late_records() == [1]
    assert [r.item.rec.offset for r in reqs] == [0, 2, 3]
    assert [r.tenant for r in reqs] == ["steady", "steady", "burster"]
    # Counted per class like what the batcher routes (late_routing.py): one outcome
    # per request in tidebatch_tenant_requests_total.
    sample = registry.get_sample_value
    assert sample("tidebatch_tenant_requests_total", {"pipeline": "ctr", "tenant_class": "burster", "outcome": "routed_late"}) == 1.0
    assert sample("tidebatch_tenant_requests_total", {"pipeline": "ctr", "tenant_class": "steady", "outcome": "routed_late"}) is None


def test_a_records_past_its_loosest_deadline_is_routed_whatever_its_class():
    clock = FakeClock(10.0)
    queue = worker_queue(clock)
    send_for_a_second(queue, clock)
    routed = Routed()
    adm = admission(routed, CtrCodec(), GateStanding(queue, None))
    recs = poll()
    recs[0] = SourceRecord("in", 0, 0, b"k", ctr_value(0, "steady"), {}, WALL - 101)
    adm.admit(recs, clock.now(), WALL)
    assert routed.late_records() == [0, 1]


def test_without_tenant_classes_or_the_codecs_peek_the_oldest_go_whatever_their_tenant():
    clock = FakeClock(10.0)
    queue = worker_queue(clock)
    send_for_a_second(queue, clock)

    class NoPeek(CtrCodec):
        tenant_of = None  # a codec without the optional peek (pipeline/codecs/base.py)

    for codec, standing in ((CtrCodec(), None), (NoPeek(), GateStanding(queue, None))):
        routed = Routed()
        admission(routed, codec, standing).admit(poll(), clock.now(), WALL)
        assert routed.late_records() == [0, 1]


def test_the_gate_calls_a_class_over_its_share_past_one_tier_step_and_a_class_without_a_share_always():
    clock = FakeClock(0.0)
    queue = worker_queue(clock)
    assert queue.over_share(["steady", "burster", "nobody"], 0.0) == [False, False, True]
    send_for_a_second(queue, clock)
    assert queue.over_share(["steady", "burster", None], clock.now()) == [False, True, True]
    plain = BatchQueue(Batcher(AdaptivePolicy(max_batch_rows=8), CostModel(prior=AffineCost(1e-4, 1e-5))), clock=clock)
    assert plain.over_share(["steady"], 1.0) == [False]
    assert gate_standing(plain, None) is None


def test_shed_prefix_keeps_the_tightest_kept_record_within_its_slack_after_the_kept_decode():
    # In shed order: two over-share records (slack 5 and 25 ms), then two within their
    # share (slack 30 and 45 ms); 10 ms of decode a record. Keeping 4 or 3 would queue
    # them at 40 or 30 ms, past the slack of 5 or 25; keeping 2: 20 <= min(30, 45).
    assert shed_prefix([5.0, 25.0, 30.0, 45.0], 10.0) == 2
    # Not the oldest-first rule: a kept record's slack, not its place, decides.
    assert shed_prefix([5.0, 40.0, 30.0, 45.0], 10.0) == 1
    assert shed_prefix([5.0, 40.0, 30.0, 45.0], 1.0) == 0
    assert shed_prefix([], 1.0) == 0
    assert shed_prefix([-1.0], 0.0) == 1


def test_the_ctr_peek_reads_the_tenant_of_both_forms_and_doubts_the_rest():
    assert peek_tenant(b'{"request_id":"r","tenant":"acme","items":[]}') == "acme"
    assert peek_tenant(b'{"request_id": "r", "tenant" : "globex"}') == "globex"
    assert peek_tenant(b'{"tenant":"a\\"b"}') is None  # escaped: left to the decoder
    assert peek_tenant(b'{"tenant":null}') is None
    assert peek_tenant(None) is None
    codec = CtrCodec()
    value = ctr_value(5, "initech")
    assert codec.tenant_of(value) == "initech" == codec.decode(value).tenant
    binary = ctr_binary.encode(orjson.loads(value))
    assert codec.tenant_of(binary) == "initech" == codec.decode(binary).tenant
    assert codec.tenant_of(ctr_binary.MAGIC + b"\xff\xff\xff\xff") is None
