"""The variants of bench/camera_text.py and what their results say: one `tidebatch run`
worker per variant, side by side, each on its own topics; the rounds of drains and
open-loop slices sent to them in turn; merged results, latency and drain summaries, and
the tables' number format.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Producer

from bench.harness import (
    OUT,
    REPO,
    Results,
    _wait_assigned,
    fresh_topics,
    produce_now,
    read_results,
    stop_process,
)
from bench.rounds import rotated
from consumers.brokers.embedded import free_port
from pipeline.loadgen.pacing import run_open_loop

DRAIN_ROUNDS = 2  # drains per variant, the order rotated


@dataclass
class Variant:
    name: str
    policy: str
    env: dict[str, str]
    inp: str = ""
    out: str = ""


@contextmanager
def workers(bootstrap: str, pipeline: str, variants: list[Variant], slo_ms: float) -> Iterator[None]:
    """One `tidebatch run --pipeline P` process per variant, each on its own fresh
    topics, all started together; yields once every one has its partitions. Idle
    workers only poll, so the one receiving traffic has the cores (as much as the other
    tenants of this machine leave)."""
    procs: list[tuple[subprocess.Popen, int, Path]] = []
    try:
        for v in variants:
            v.inp, v.out = fresh_topics(bootstrap, f"bench-{pipeline}-{v.name}", partitions=2)
            port = free_port()
            env = dict(os.environ, TIDEBATCH_METRICS__PORT=str(port), TIDEBATCH_CREATE_TOPICS="false", **v.env)
            cmd = [
                sys.executable, "-m", "pipeline.cli", "run", "--pipeline", pipeline,
                "--bootstrap-servers", bootstrap, "--broker-profile", "embedded", "--policy", v.policy,
                "--slo-ms", str(slo_ms), "--group-id", f"bench-{pipeline}-{v.name}-{uuid.uuid4().hex[:8]}",
                "--input-topic", v.inp, "--output-topic", v.out,
            ]
            log = OUT / f"{pipeline}-{v.name}.log"
            with open(log, "wb") as fh:
                procs.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO), port, log))
        for proc, port, log in procs:
            _wait_assigned(proc, port, log, timeout=180)
        yield
    finally:
        for proc, _, _ in procs:  # one at a time (each has its own group anyway)
            stop_process(proc)


# (variant, run id, round) -> (sent, seconds): one variant's share of a round.
Send = Callable[[Variant, str, int], tuple[int, float]]


def drain_rounds(bootstrap: str, variants: list[Variant], timeout: float, send: Send) -> dict[str, list[Results]]:
    """DRAIN_ROUNDS rounds of a backlog sent to each variant and drained, the order
    rotated: each variant's results, a Results per round."""
    drains: dict[str, list[Results]] = defaultdict(list)
    for r in range(DRAIN_ROUNDS):
        for v in rotated(variants, r):
            run = f"drain{r}{uuid.uuid4().hex[:4]}"
            sent, _ = send(v, run, r)
            drains[v.name].append(read_results(bootstrap, v.out, sent, timeout=timeout, run=run))
    return drains


@dataclass
class Slices:
    """The open-loop slices of every variant: results per slice, requests sent and
    seconds taken in all, by variant name."""

    parts: dict[str, list[Results]] = field(default_factory=lambda: defaultdict(list))
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def load_rounds(bootstrap: str, variants: list[Variant], rounds: int, tag: str, timeout: float,
                send: Send) -> Slices:
    """`rounds` rounds of one open-loop slice per variant, the order rotated; run ids
    start with `tag`."""
    slices = Slices()
    for r in range(rounds):
        for v in rotated(variants, r):
            run = f"{tag}r{r}{uuid.uuid4().hex[:4]}"
            sent, took = send(v, run, r)
            slices.parts[v.name].append(read_results(bootstrap, v.out, sent, timeout=timeout, run=run))
            slices.sent[v.name] += sent
            slices.seconds[v.name] += took
    return slices


def slice_p99(parts: list[Results]) -> list[float | None]:
    """p99 per slice, in round order: one slow spell of the machine shows here."""
    return [round(p.percentiles()[1], 1) if p.docs else None for p in parts]


def merge(parts: list[Results]) -> Results:
    docs = [d for r in parts for d in r.docs]
    ts = np.concatenate([r.result_ts_ms for r in parts]) if parts else np.array([])
    return Results(docs, ts)


def summarize(res: Results, sent: int, seconds: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"sent": sent, "scored": len(res.docs)}
    if res.docs:
        p50, p99 = res.percentiles()
        rows = [d["batch_rows"] for d in res.docs]
        out |= {"p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "mean_batch_rows": round(float(np.mean(rows)), 2),
                "late_share": round(sum(bool(d["late"]) for d in res.docs) / len(res.docs), 3),
                # Model time per row: tells a slower model (a busy machine) from queueing.
                "model_ms_per_row": round(float(np.mean([d["inference_ms"] / d["batch_rows"] for d in res.docs])), 2)}
    if seconds is not None:
        out["offered_per_s"] = round(sent / seconds, 2)
    return out


def drain_summary(parts: list[Results]) -> dict[str, Any]:
    """Drains of one variant: requests/s over all of them (each drain's span summed),
    per drain, mean batch rows and model time per row."""
    docs = [d for p in parts for d in p.docs]
    rates = [drain_rate(p) for p in parts if p.docs]
    spans = sum(len(p.docs) / r for p, r in zip(parts, rates, strict=False) if r > 0)
    return {
        "requests": sum(len(p.docs) for p in parts), "per_s": round(len(docs) / spans, 2) if spans else None,
        "per_drain_per_s": [round(r, 2) for r in rates],
        "mean_batch_rows": round(float(np.mean([d["batch_rows"] for d in docs])), 2),
        "model_ms_per_row": round(float(np.mean([d["inference_ms"] / d["batch_rows"] for d in docs])), 2),
    }


def drain_rate(res: Results) -> float:
    """Results/s of a drained backlog: from the first request's consumption (its
    scored_at - inference - queue wait) to the last result."""
    start = min(d["scored_at_ms"] - d["inference_ms"] - d["queue_wait_ms"] for d in res.docs)
    span = (max(d["scored_at_ms"] for d in res.docs) - start) / 1000.0
    return len(res.docs) / span if span > 0 else float("nan")


def fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def send_paced(producer: Producer, topic: str, times: Iterator[float],
               message: Callable[[int], tuple]) -> tuple[int, float]:
    """Produce message(i) ((key, value) or (key, value, headers)) at each of `times`
    (run_open_loop); (sent, seconds) once every one is delivered."""

    def send(i: int) -> None:
        produce_now(producer, topic, *message(i))
        producer.poll(0)

    sent, seconds = run_open_loop(times, send, idle=lambda s: producer.poll(s))
    assert producer.flush(60) == 0
    return sent, seconds
