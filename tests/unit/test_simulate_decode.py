"""The simulator's source thread (SimConfig.decode_s, `tidebatch simulate --decode-us`):
a decode cost per request, polls queued together once decoded, and adaptive's shedding
before decoding as the worker's admission does it (pipeline/batching/shed.py). In the
real CTR pipeline a burst saturates the source thread, not the model (docs/BATCHING.md,
"Bursts in the real pipeline"); with free decoding the simulator could not show that."""

from __future__ import annotations

from functools import cache

from pipeline.simulate.arrivals import poisson_arrivals, with_hops
from pipeline.simulate.curves import curve_from_dict
from pipeline.simulate.engine import SimConfig, simulate
from pipeline.simulate.rows import DEFAULT_ROWS, RowsDist
from pipeline.simulate.workload import Workload

# The CTR model's shape as the worker's warm-up profile measured it (t(n) = 0.18 ms +
# 0.0086 ms/row), four times slower so that a run has few requests; one 100 ms SLO, the
# bench's. Decode costs below are scaled alike (180 µs -> 720 µs).
CURVE = curve_from_dict({"name": "ctr-worker-x4", "a_ms": 0.72, "b_ms_per_row": 0.0344, "max_batch_rows": 512,
                         "slo_ms": {"0": 100}})
SEED = 1
# 50 % load, a 1.5 s burst at 150 %, 50 % again (the bench's shape, shorter).
SEGMENTS = [(0.0, 0.5, 0.5), (0.5, 2.0, 1.5), (2.0, 3.0, 0.5)]


def workload() -> Workload:
    arrivals = poisson_arrivals(SEGMENTS, RowsDist.parse(DEFAULT_ROWS), CURVE.capacity, SEED)
    return Workload("burst", arrivals, 3.0, None, (0.5, 2.0), list(SEGMENTS))


@cache
def burst(policy: str, decode_us: float, reserve: float = 0.5):
    return simulate(workload(), CURVE, policy, SimConfig(seed=SEED, decode_s=decode_us / 1e6, shed_reserve=reserve))


def burst_share(r) -> float:
    return r.burst_goodput_rows_s / r.capacity_rows_s


def test_free_decoding_is_the_simulator_as_before():
    assert simulate(workload(), CURVE, "adaptive", SimConfig(seed=SEED)).to_dict() == burst("adaptive", 0.0).to_dict()


def test_routing_only_the_expired_collapses_when_decoding_is_the_bottleneck():
    """Source as fast as the model (720 µs a request = the curve's capacity at 20 rows):
    shedding only expired records lets the backlog age to the whole budget, as measured
    in the real pipeline; shedding at half the budget keeps the burst's goodput."""
    collapsed = burst_share(burst("adaptive", 720.0, reserve=0.0))
    kept = burst_share(burst("adaptive", 720.0))
    assert collapsed < 0.7
    assert kept > 0.95
    assert burst_share(burst("greedy", 720.0)) < 0.15  # greedy scores the backlog late


def test_a_slower_source_caps_goodput_at_its_own_capacity_not_below():
    # 1200 µs a request: the source serves 833 req/s = 0.59 of the model's capacity.
    source_share = (1e6 / 1200.0) * 20.0 / CURVE.capacity
    r = burst("adaptive", 1200.0)
    assert 0.9 * source_share < burst_share(r) <= 1.02 * source_share
    assert burst_share(burst("adaptive", 1200.0, reserve=0.0)) < 0.6 * source_share


def test_only_adaptive_with_route_late_sheds_before_decoding():
    assert burst("greedy", 720.0).outcomes["routed_late"] == 0
    assert burst("adaptive-score", 720.0).outcomes["routed_late"] == 0
    assert burst("adaptive", 720.0).outcomes["routed_late"] > 0


def test_a_long_hop_never_keeps_adaptive_from_answering():
    """Every request reaches the worker 70 ms old (a distant producer, a slow broker) at
    50 % load. Before, the reserve was half the budget until a batch was answered, and
    with every request shed on it none ever was: adaptive routed all 2093 requests that
    greedy answered in time (pipeline/batching/shed.py reserve_ms)."""
    segments = [(0.0, 3.0, 0.5)]
    arrivals = with_hops(poisson_arrivals(segments, RowsDist.parse(DEFAULT_ROWS), CURVE.capacity, SEED), 70.0, 70.001)
    steady = Workload("hop", arrivals, 3.0, None, None, segments)
    results = {p: simulate(steady, CURVE, p, SimConfig(seed=SEED, decode_s=360e-6)).outcomes for p in ("greedy", "adaptive")}
    assert results["adaptive"] == results["greedy"] and results["adaptive"]["in_time"] == len(arrivals)
