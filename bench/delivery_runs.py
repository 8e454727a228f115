"""The two measurements of bench/delivery.py, each on fresh topics with a fresh worker:
a saturation drain of a preloaded backlog, and the latency at an open-loop load as a
read_committed reader in a process of its own sees it.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import uuid

import numpy as np

from bench.delivery_cells import EOS, Mode, drain_rates, latency_summary, policy_env
from bench.delivery_probes import end_offsets, markers, transaction_stats, wait_committed
from bench.harness import (
    RequestPool,
    cpu_shares,
    drain_throughput,
    drop_topics,
    fresh_topics,
    open_loop,
    preload,
    profile_of,
    read_results,
    stages,
    worker_process,
)


def saturation(bootstrap: str, pool: RequestPool, mode: Mode, n: int, policy: str) -> dict:
    inp, out = fresh_topics(bootstrap, f"bench-eos-sat-{mode.tag}")
    run = f"sat{uuid.uuid4().hex[:6]}"
    preload(bootstrap, inp, pool, n, run)
    ends = {p: end for p, end in end_offsets(bootstrap, inp).items() if end > 0}  # nothing to commit in an empty one
    env = {**policy_env(policy, backlog=True), **mode.env()}
    with worker_process(bootstrap, inp, out, policy, extra_env=env, log_name=f"delivery-sat-{mode.tag}") as proc:
        # The worker drains from its start; the window of cpu_shares starts when it has
        # partitions (~1 s into the drain) and ends at the commit of its last offsets.
        # No reader alongside: it would take CPU from the worker on two cores.
        with cpu_shares(bootstrap, proc.pid, machine=True) as cores:
            committed_ms = wait_committed(bootstrap, proc, inp, ends, timeout=600)
        res = read_results(bootstrap, out, n, timeout=600, run=run)  # read_committed: librdkafka's default
        drain_s = (max(committed_ms, float(res.result_ts_ms.max())) - float(res.result_ts_ms.min())) / 1000.0
        txn = transaction_stats(proc, drain_s)
    txn_markers = markers(bootstrap, out, len(res.docs))
    drop_topics(bootstrap, inp, out)
    if len(res.docs) < n:
        raise RuntimeError(f"{mode.label}: {len(res.docs)} results of {n} readable after the drain")
    rows = sum(len(d["scores"]) for d in res.docs)
    rates = drain_rates(n, rows, float(res.result_ts_ms.min()), float(res.result_ts_ms.max()), committed_ms,
                        mode.delivery)
    _, check_rows = drain_throughput(res)
    assert abs(check_rows - rates["produced_rows_per_s"]) <= 1e-6 * check_rows + 1e-9
    return {**rates, "results": len(res.docs), "txn_markers": txn_markers,
            "offsets_committed_after_last_result_ms": committed_ms - float(res.result_ts_ms.max()),
            "mean_batch_rows_seen": float(np.mean([d["batch_rows"] for d in res.docs])), "cpu_cores": cores,
            "transactions": txn,
            "no_transactions": mode.delivery == EOS and txn_markers <= 0}


# ---------------------------------------------------------------------------- latency
def _reader_main(bootstrap: str, profile: str, topic: str, parts: int, run: str, ready, expect, stop, conn) -> None:
    """A read_committed consumer of the results (process of its own): for every result
    of `run`, (read time - request CreateTime, result CreateTime - request CreateTime)
    in ms, the read time from this process's clock as each record is polled."""
    import orjson
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from consumers.profiles import consumer_config

    consumer = Consumer(consumer_config(profile, bootstrap, f"bench-rc-{uuid.uuid4().hex[:8]}",
                                        {"isolation.level": "read_committed"}))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
    consumer.poll(1.0)  # connected, fetching
    ready.set()
    seen: dict[str, tuple[float, float]] = {}
    duplicates = 0
    stop_at = None
    try:
        while True:
            want = expect.value
            if want and len(seen) >= want:
                break
            if stop.is_set():
                stop_at = stop_at or time.monotonic() + 60.0  # the tail: last commits, a slow worker
                if time.monotonic() > stop_at:
                    break
            m = consumer.poll(0.05)
            if m is None or m.error():
                continue
            read_ms = time.time() * 1000.0
            doc = orjson.loads(m.value())
            rid = doc.get("request_id", "")
            if not rid.startswith(run + "-"):
                continue
            if rid in seen:
                duplicates += 1
                continue
            req = float(doc["kafka_ts_ms"])
            seen[rid] = (read_ms - req, m.timestamp()[1] - req)
    finally:
        consumer.close()
    conn.send({"read": [v[0] for v in seen.values()], "produced": [v[1] for v in seen.values()],
               "duplicates": duplicates})
    conn.close()


class Reader:
    """The read_committed reader process; start() returns once it fetches."""

    def __init__(self, bootstrap: str, topic: str, parts: int, run: str) -> None:
        ctx = mp.get_context("spawn")  # no fork of a process with librdkafka threads
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self.expect = ctx.Value("q", 0)
        self.conn, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_reader_main, daemon=True, args=(
            bootstrap, profile_of(bootstrap), topic, parts, run, self.ready, self.expect, self.stop, child))

    def start(self) -> int:
        self.proc.start()
        if not self.ready.wait(60):
            raise RuntimeError("the read_committed reader did not start in 60 s")
        return self.proc.pid

    def finish(self, sent: int, timeout: float = 90.0) -> dict:
        self.expect.value = sent
        self.stop.set()
        if not self.conn.poll(timeout):
            self.proc.kill()
            raise RuntimeError("the read_committed reader sent nothing back")
        got = self.conn.recv()
        self.proc.join(10)
        return got


def latency(bootstrap: str, pool: RequestPool, mode: Mode, rate: float, seconds: float, policy: str) -> dict:
    inp, out = fresh_topics(bootstrap, f"bench-eos-lat-{mode.tag}")
    run = f"lat{uuid.uuid4().hex[:6]}"
    reader = Reader(bootstrap, out, 2, run)
    reader_pid = reader.start()
    env = {**policy_env(policy, backlog=False), **mode.env()}
    try:
        with worker_process(bootstrap, inp, out, policy, extra_env=env, log_name=f"delivery-lat-{mode.tag}") as proc:
            with cpu_shares(bootstrap, proc.pid, {"reader": reader_pid}, machine=True) as cores:
                sent = open_loop(bootstrap, inp, pool, rate, seconds, run)
            got = reader.finish(sent)
            breakdown = stages(proc)
            txn = transaction_stats(proc, seconds)
    finally:
        if reader.proc.is_alive():
            reader.proc.kill()
    drop_topics(bootstrap, inp, out)
    return {"rate": rate, **latency_summary(got["read"], got["produced"], sent, got["duplicates"]),
            "cpu_cores": cores, "stages": breakdown, "transactions": txn}
