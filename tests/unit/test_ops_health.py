"""The health rules (pipeline/ops/health.py): ready only with partitions, a model and
a recent poll; alive while loading and rebalancing; a failed worker is neither; a
Redis that rejects the worker makes it unready, an outage does not. Fake workers."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from pipeline.ops import health
from tests.unit.ops_fakes import fake_worker


def test_ready_only_with_partitions_model_and_a_recent_poll():
    assert health.readiness(fake_worker(), now=101.0)[0] is True
    for worker, now, reason in [
        (fake_worker(started=False, last_poll_ok=None), 101.0, "not started"),
        (fake_worker(assigned=[]), 101.0, "no partitions assigned"),
        (fake_worker(), 110.0, "no successful broker poll for 10.0 s"),
        (fake_worker(session=SimpleNamespace(provider=None)), 101.0, "model not loaded"),
    ]:
        ok, body = health.readiness(worker, now)
        assert not ok and reason in body["reason"], body


def test_alive_while_loading_and_rebalancing_dead_when_stuck():
    assert health.liveness(fake_worker(started=False, last_poll_ok=None), now=1e6)[0] is True
    assert health.liveness(fake_worker(assigned=[]), now=101.0)[0] is True  # no partitions: still alive
    ok, body = health.liveness(fake_worker(), now=100.0 + health.STALL_S + 1)
    assert not ok and "stalled" in body["reason"]
    dead = threading.Thread(target=lambda: None, name="executor-0")
    dead.start()
    dead.join()
    ok, body = health.liveness(fake_worker(threads=lambda: [dead]), now=101.0)
    assert not ok and "executor-0" in body["reason"]
    ok, body = health.liveness(fake_worker(), now=101.0, source_thread=dead)
    assert not ok and "exited" in body["reason"]


def test_a_failed_worker_is_neither_alive_nor_ready_also_while_it_stops():
    """A dead publisher thread used to leave /healthz and /readyz at 200 while no
    request got an outcome any more (issue: no message may wedge a worker)."""
    dead = threading.Thread(target=lambda: None, name="publisher")
    dead.start()
    dead.join()
    worker = fake_worker(failure="publisher thread died: MemoryError: ", threads=lambda: [dead], stopping=True)
    ok, body = health.liveness(worker, now=101.0)
    assert not ok and body["reason"].startswith("worker failed: publisher thread died")
    ok, body = health.readiness(worker, now=101.0)
    assert not ok and body["reason"].startswith("worker failed")
    ok, body = health.liveness(fake_worker(threads=lambda: [dead]), now=101.0)
    assert not ok and "publisher" in body["reason"]


def test_a_redis_that_rejects_the_worker_makes_it_unready_an_outage_does_not():
    """docs/REDIS.md: a Redis outage is served through with default features (ready);
    a rejected password or certificate will not pass by itself (not ready)."""
    link = SimpleNamespace(up=False, problem=None)
    ok, body = health.readiness(fake_worker(redis=SimpleNamespace(link=link)), now=101.0)
    assert ok and body["checks"]["redis"] == {"up": False, "problem": None}
    link.problem = "redis: authentication failed for user 'tb' at rediss://h:1/0 (wrong password ...): x"
    ok, body = health.readiness(fake_worker(redis=SimpleNamespace(link=link)), now=101.0)
    assert not ok and body["reason"] == link.problem
    assert "redis" not in health.readiness(fake_worker(redis=None), now=101.0)[1]["checks"]
