"""What Redis costs a batch on this machine: the feature lookup (script vs pipeline),
the dedup check, and what a dead or hung Redis costs the batch that finds it so and
the batches after it. Prints tables; not a test.

    .venv/bin/python -m bench.redis_cost [--repeats 7] [--batches 1,8,32]

Starts its own redis-server on a free port (tests/integration/redis_server.py), so
the numbers include a real loopback round trip and nobody else's commands. Times are
the minimum over repeats (the least disturbed estimate on a shared machine); the
server's own time per call comes from INFO commandstats.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry

from consumers.records import SourceRecord
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.redisio.codec import CtrIdCodec
from pipeline.redisio.config import RedisConfig
from pipeline.redisio.dedup import DedupHook
from pipeline.redisio.features import FeatureLookupHook
from pipeline.redisio.link import RedisLink
from pipeline.redisio.loader import load_features
from pipeline.redisio.metrics import register_redis_metrics
from tests.integration.redis_helpers import twin, write_csv
from tests.integration.redis_server import redis_server


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def once_ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def make_link(url: str) -> RedisLink:
    return RedisLink(RedisConfig(url=url), register_redis_metrics(CollectorRegistry())).start()


def lookup_ms(link: RedisLink, lookup: str, values: list[bytes], repeats: int) -> float:
    """Time of one batch's before_inference, decoding excluded."""
    codec = CtrIdCodec()
    hook = FeatureLookupHook(link, link.metrics, "tb:", lookup)
    total = best_ms(lambda: hook.before_inference([codec.decode(v) for v in values]), repeats)
    return total - best_ms(lambda: [codec.decode(v) for v in values], repeats)


def script_server_ms(stats, link: RedisLink, values: list[bytes], repeats: int) -> float:
    """The server's own time per lookup script call (INFO commandstats: cmdstat_evalsha)."""
    codec = CtrIdCodec()
    hook = FeatureLookupHook(link, link.metrics, "tb:", "script")
    before = stats.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    for _ in range(repeats):
        hook.before_inference([codec.decode(v) for v in values])
    after = stats.info("commandstats")["cmdstat_evalsha"]
    return (after["usec"] - before["usec"]) / max(after["calls"] - before["calls"], 1) / 1e3


def dedup_ms(link: RedisLink, n: int, repeats: int) -> float:
    hook = DedupHook(link, link.metrics)
    recs = [SourceRecord("t", 0, i, None, None, {}, None) for i in range(n)]
    return best_ms(
        lambda: hook.after_inference(recs, [{"request_id": f"x{time.perf_counter_ns()}-{i}"} for i in range(n)]),
        repeats,
    )


def dead_redis_ms(server, values: list[bytes], how: str, repeats: int) -> tuple[float, float]:
    """(the batch that finds Redis dead, the batches after it), decoding excluded."""
    codec = CtrIdCodec()
    link = make_link(server.url)
    hook = FeatureLookupHook(link, link.metrics, "tb:", "script")
    hook.before_inference([codec.decode(v) for v in values])
    pid = server.proc.pid
    if how == "kill":
        server.kill()
    else:
        os.kill(pid, signal.SIGSTOP)
    try:
        decode = best_ms(lambda: [codec.decode(v) for v in values], repeats)
        first = once_ms(lambda: hook.before_inference([codec.decode(v) for v in values])) - decode
        later = best_ms(lambda: hook.before_inference([codec.decode(v) for v in values]), repeats) - decode
    finally:
        if how == "kill":
            server.start()
        else:
            os.kill(pid, signal.SIGCONT)
        link.close()
    return first, later


def feature_rows(docs: list[dict]) -> list[dict]:
    """Feature-file rows that store every request's own features under its real ids
    (users and items repeat across requests, as in traffic; the last write wins)."""
    rows = []
    for doc in docs:
        t = twin(doc)
        rows.append({**t.rows[0], "id": doc["user_id"]})
        rows.extend({**r, "id": it["item_id"]} for r, it in zip(t.rows[1:], doc["items"], strict=True))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batches", default="1,8,32", help="requests per batch")
    args = ap.parse_args()
    sizes = [int(x) for x in args.batches.split(",")]
    factory = CtrRequestFactory(seed=5)  # mean 20 items per request, Zipf-popular items
    docs = [factory.make_doc(i) for i in range(max(sizes))]
    values = [
        orjson.dumps({"request_id": d["request_id"], "user_id": d["user_id"], "items": [it["item_id"] for it in d["items"]]})
        for d in docs
    ]
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp) / "redis") as server:
        load_features(server.client(), write_csv(Path(tmp) / "f.csv", feature_rows(docs)))
        link = make_link(server.url)
        stats = server.client()
        print(f"redis-server {stats.info('server')['redis_version']} on loopback; min of {args.repeats} runs")
        print(f"{'requests':>8} {'rows':>6} {'keys':>6} {'script ms':>10} {'(server)':>9} {'pipeline ms':>12} {'dedup ms':>9}")
        for n in sizes:
            batch = docs[:n]
            rows = sum(len(d["items"]) for d in batch)
            keys = len({d["user_id"] for d in batch}) + len({it["item_id"] for d in batch for it in d["items"]})
            script = lookup_ms(link, "script", values[:n], args.repeats)
            server_ms = script_server_ms(stats, link, values[:n], args.repeats)
            pipeline = lookup_ms(link, "pipeline", values[:n], args.repeats)
            print(f"{n:>8} {rows:>6} {keys:>6} {script:>10.2f} {server_ms:>9.2f} {pipeline:>12.2f} {dedup_ms(link, n, args.repeats):>9.2f}")
        link.close()
        print("\nDead Redis, batch of 8 requests: the lookup of the batch that finds it dead, then of the next ones")
        for how, label in (("kill", "SIGKILL (connection refused)"), ("stop", "SIGSTOP (hung: socket timeout)")):
            first, later = dead_redis_ms(server, values[:8], how, args.repeats)
            print(f"  {label:<32} first {first:8.2f} ms   next {later:6.3f} ms")


if __name__ == "__main__":
    main()
