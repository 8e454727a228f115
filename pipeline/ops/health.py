"""Liveness and readiness of a worker, as pure functions of its state and a clock.

Liveness (/healthz) answers "should this process be restarted?": it fails only when a
thread the worker needs has died or the source loop has stopped going round. It stays
200 while the model loads, while the group rebalances and while Kafka is unreachable:
a restart fixes none of those.

Readiness (/readyz) answers "is this worker serving?": partitions assigned, model
loaded, broker answered a poll in the last few seconds, its writes to Kafka getting
through (no outage: results acknowledged and offsets committed within
`outage_after_s` while work waits, pipeline/delivery/kafka_progress.py), and Redis (when
used) does not reject the worker's password or certificates. A worker that has no partition (more
workers than partitions) is alive but not ready. A Redis outage leaves it ready: the
worker scores on with default features (docs/REDIS.md "Outages"); a rejected password
is a configuration fault that will not pass by itself.

The worker is read through the attributes documented on pipeline.worker.Worker:
`started`, `assigned`, `last_poll_ok`, `kafka_progress` (optional), `session.provider`,
`stopping`, `failure` (why it failed, or None), `redis.link` (up, problem) and `threads()` (the executor and publisher threads it needs).

A failed worker (a dead executor or publisher thread, an outcome it could not write)
is neither alive nor ready from that moment, also while it shuts down: an
orchestrator must not send it traffic, and may restart it.
"""

from __future__ import annotations

import threading
from typing import Any

READY_POLL_S = 5.0  # a poll older than this makes the worker unready
STALL_S = 60.0  # a source loop silent this long is stuck (revoke waits up to 10 s)


def _stopping(worker: Any) -> bool:
    return bool(getattr(worker, "stopping", False))


def liveness(
    worker: Any,
    now: float,
    *,
    stall_s: float = STALL_S,
    source_thread: threading.Thread | None = None,
) -> tuple[bool, dict[str, Any]]:
    """(alive, body). `now` is time.monotonic(); `source_thread` the thread running
    worker.run(), when the caller knows it."""
    started = worker.started.is_set()
    body: dict[str, Any] = {"alive": True, "started": started, "stopping": _stopping(worker)}
    problems: list[str] = []
    failure = getattr(worker, "failure", None)
    if failure:
        problems.append(f"worker failed: {failure}")
    if source_thread is not None and started and not source_thread.is_alive():
        problems.append("the worker's source loop has exited")
    if started and not _stopping(worker):
        # Executors and the publisher end only at shutdown; a dead one mid-run means
        # batches pile up for ever.
        dead = [t.name for t in worker.threads() if not t.is_alive()]
        if dead:
            problems.append(f"worker threads died: {', '.join(dead)}")
        last = worker.last_poll_ok
        if last is not None and now - last > stall_s:
            problems.append(f"source loop stalled: last poll {now - last:.0f} s ago")
    calls = getattr(worker, "calls", None)  # pipeline/delivery/watchdog.py
    overdue = calls.overdue(now) if calls is not None else None
    if overdue:
        problems.append(overdue)
    if problems:
        body.update(alive=False, reason=problems[0], reasons=problems)
    return not problems, body


def readiness(worker: Any, now: float, *, max_poll_age_s: float = READY_POLL_S) -> tuple[bool, dict[str, Any]]:
    """(ready, body): 200 material, or 503 material with the reasons."""
    provider = getattr(getattr(worker, "session", None), "provider", None)
    last = worker.last_poll_ok
    poll_age = None if last is None else round(now - last, 3)
    assigned = list(worker.assigned)
    checks: dict[str, Any] = {
        "started": worker.started.is_set(),
        "model_provider": provider,
        "assigned_partitions": [f"{t}[{p}]" for t, p in assigned],
        "last_poll_age_s": poll_age,
    }
    session = getattr(worker, "session", None)
    if hasattr(session, "restarts"):  # a model process (runtime.model_process)
        checks["model_process"] = {"pid": session.pid, "restarts": session.restarts}
    reasons: list[str] = []
    failure = getattr(worker, "failure", None)
    if failure:
        reasons.append(f"worker failed: {failure}")
    link = getattr(getattr(worker, "redis", None), "link", None)
    if link is not None:
        checks["redis"] = {"up": link.up, "problem": link.problem}
        if link.problem:
            reasons.append(link.problem)
    if _stopping(worker):
        reasons.append("worker is stopping")
    if not checks["started"]:
        reasons.append("worker not started (loading the model or subscribing)")
    if not provider:
        reasons.append("model not loaded")
    if not assigned:
        reasons.append("no partitions assigned")
    progress = getattr(worker, "kafka_progress", None)
    if progress is not None:
        stalls = progress.stalled(now)
        checks["kafka_writes"] = stalls or "ok"
        reasons.extend(f"Kafka outage: {why}" for why in stalls)
    if poll_age is None:
        reasons.append("no successful broker poll yet")
    elif poll_age > max_poll_age_s:
        reasons.append(f"no successful broker poll for {poll_age:.1f} s")
    body: dict[str, Any] = {"ready": not reasons, "checks": checks}
    if reasons:
        body.update(reason=reasons[0], reasons=reasons)
    return not reasons, body
