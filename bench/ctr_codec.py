"""Hot-path cost of the CTR codec and request generator on one core.

    .venv/bin/python bench/ctr_codec.py [--requests 2000] [--mean-items 20] [--poll 1000] [--json]

First, side by side in one run: decode + featurise of a JSON request by the reference
path (CtrCodec.decode, one by one) and by the path the worker takes (CtrCodec.decode_many
over polls of --poll messages: pipeline/codecs/ctr_fast.py), per request on thread CPU
time, best of 9 rounds that alternate the two (so both meet the same machine load), and
their ratio; with the C allocator set as a worker sets it (pipeline/runtime/allocator.py).
Then decode throughput (requests/s and item rows/s, best of 5 passes over the same
messages) for the JSON form and the binary form of the same requests, collate + split cost per batch, and how fast CtrRequestFactory produces
requests. Figures vary with machine load: quote best-of, not a single pass.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from pipeline.codecs import ctr_fast  # noqa: E402
from pipeline.codecs.ctr import CtrCodec  # noqa: E402
from pipeline.codecs.ctr_binary import encode  # noqa: E402
from pipeline.loadgen.ctr import CtrRequestFactory  # noqa: E402
from pipeline.runtime.allocator import fix_mmap_threshold  # noqa: E402


def best_of(fn, repeats: int = 5, clock=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def side_by_side(codec: CtrCodec, values: list[bytes], poll: int, rounds: int = 9) -> tuple[float, float]:
    """Best thread-CPU seconds per request of the reference and of decode_many."""
    msgs = [(v, None) for v in values]
    old = new = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        for v in values:
            codec.decode(v, None)
        old = min(old, time.thread_time() - t0)
        t0 = time.thread_time()
        for at in range(0, len(msgs), poll):
            codec.decode_many(msgs[at : at + poll])
        new = min(new, time.thread_time() - t0)
    return old / len(values), new / len(values)


def measure(n_requests: int, mean_items: float, poll: int = 1000) -> dict:
    t0 = time.perf_counter()
    factory = CtrRequestFactory(seed=5, mean_items=mean_items)
    values = [factory.make(i)[1] for i in range(n_requests)]
    gen_s = time.perf_counter() - t0
    codec = CtrCodec()
    fix_mmap_threshold()
    taken = sum(d is not None for at in range(0, n_requests, poll)
                for d in ctr_fast.decode_json(values[at : at + poll], codec.max_items))
    old_s, new_s = side_by_side(codec, values, poll)
    decoded = [codec.decode(v, None) for v in values]
    rows = sum(d.rows for d in decoded)
    dec_s = best_of(lambda: [codec.decode(v, None) for v in values])
    # thread CPU time leaves out time spent descheduled on a shared machine
    dec_cpu = best_of(lambda: [codec.decode(v, None) for v in values], clock=time.thread_time)
    binary = [encode(orjson.loads(v)) for v in values]
    bin_cpu = best_of(lambda: [codec.decode(v, None) for v in binary], clock=time.thread_time)
    batch = decoded[:25]  # ~500 rows, a typical CPU batch
    batch_rows = sum(d.rows for d in batch)
    col_s = best_of(lambda: [codec.collate([d.payload for d in batch]) for _ in range(100)]) / 100
    prob = {"prob": np.random.default_rng(0).random(batch_rows).astype(np.float32)}
    split_s = best_of(lambda: [codec.split(prob, batch) for _ in range(100)]) / 100
    return {
        "requests": n_requests,
        "mean_items": rows / n_requests,
        "mean_bytes": sum(map(len, values)) / n_requests,
        "load_average_1min": os.getloadavg()[0],
        "poll": poll,
        "fast_path_took": taken,
        "reference_cpu_us_per_request": old_s * 1e6,
        "decode_many_cpu_us_per_request": new_s * 1e6,
        "decode_many_speedup": old_s / new_s,
        "decode_requests_per_s": n_requests / dec_s,
        "decode_rows_per_s": rows / dec_s,
        "decode_us_per_request": dec_s / n_requests * 1e6,
        "decode_rows_per_cpu_s": rows / dec_cpu,
        "decode_cpu_us_per_request": dec_cpu / n_requests * 1e6,
        "binary_mean_bytes": sum(map(len, binary)) / n_requests,
        "binary_decode_rows_per_cpu_s": rows / bin_cpu,
        "binary_decode_cpu_us_per_request": bin_cpu / n_requests * 1e6,
        "batch_rows": batch_rows,
        "collate_ms": col_s * 1e3,
        "split_ms": split_s * 1e3,
        "generate_requests_per_s": n_requests / gen_s,
        "generate_rows_per_s": rows / gen_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CTR codec and generator throughput")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--mean-items", type=float, default=20)
    parser.add_argument("--poll", type=int, default=1000, help="messages per decode_many (the worker's POLL_RECORDS)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    r = measure(args.requests, args.mean_items, args.poll)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"{r['requests']} requests, {r['mean_items']:.1f} items and {r['mean_bytes']:.0f} bytes each"
    )
    print(
        f"JSON decode+featurise, side by side: reference {r['reference_cpu_us_per_request']:.1f} us/request, "
        f"decode_many {r['decode_many_cpu_us_per_request']:.1f} us/request (polls of {r['poll']}; "
        f"fast path took {r['fast_path_took']}/{r['requests']}): {r['decode_many_speedup']:.2f}x"
        f"  [load average {r['load_average_1min']:.1f} on {os.cpu_count()} CPUs]"
    )
    print(
        f"decode:   {r['decode_rows_per_s']:>9,.0f} rows/s  {r['decode_requests_per_s']:>7,.0f} req/s"
        f"  ({r['decode_us_per_request']:.0f} us/request, one core)"
    )
    print(
        f"          {r['decode_rows_per_cpu_s']:>9,.0f} rows/s on thread CPU time "
        f"({r['decode_cpu_us_per_request']:.0f} us/request)"
    )
    print(
        f"binary:   {r['binary_decode_rows_per_cpu_s']:>9,.0f} rows/s on thread CPU time "
        f"({r['binary_decode_cpu_us_per_request']:.0f} us/request, {r['binary_mean_bytes']:.0f} bytes each)"
    )
    print(
        f"collate:  {r['collate_ms']:.3f} ms, split: {r['split_ms']:.3f} ms "
        f"for a batch of {r['batch_rows']} rows"
    )
    print(
        f"generate: {r['generate_rows_per_s']:>9,.0f} rows/s  {r['generate_requests_per_s']:>7,.0f} req/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
