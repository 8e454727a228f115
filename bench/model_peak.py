"""Direct ONNX Runtime throughput of a shipped model, no pipeline around it.

    .venv/bin/python bench/model_peak.py --model ctr [--threads 1] [--json]

Runs the model at each batch size (rows) on synthetic inputs built from the model's
spec (shape with the batch axis "N", dtype, optional "range"), times each call, and
prints median call latency, rows/s, and the affine cost fit t(n) ~= a + b*n that the
adaptive batching policy assumes. The fit minimises *relative* error (weights 1/t), so
the small batches that fix ``a`` count as much as the large ones that fix ``b``.

Each call is timed twice: wall clock, and the calling thread's CPU time (with one
intra-op thread ONNX Runtime computes on the calling thread). On a machine shared with
other jobs the wall figures include time spent descheduled; the CPU figures do not, so
they approximate what the model costs on a core of its own.

Every call gets rows the model has not just seen: the calls walk through a pool of
distinct rows (~32 MB, at least one batch of the largest size). Re-running one batch
over and over, as this script first did, keeps that batch's embedding rows in the
core's L2 cache and overstates the peak no pipeline can reach, since a pipeline never
scores the same requests twice: the CTR model ran 376-395k rows/s on one repeated
batch of 128-256 rows but 351-360k on fresh rows of the same requests. ``--feeds
requests`` takes the rows from the model's pipeline's own generated requests (what
bench/pipeline_capacity.py sends), ``synthetic`` (default) draws them from the input
spec's ranges.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from models.registry import ModelSpec, load_spec  # noqa: E402
from pipeline.errors import UserError  # noqa: E402

DEFAULT_SIZES = (1, 8, 32, 128, 512, 1024, 2048)


def make_session(spec: ModelSpec, threads: int, provider: str) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    available = ort.get_available_providers()
    wanted = ["CPUExecutionProvider"]
    if provider == "auto" and "CUDAExecutionProvider" in available:
        wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ort.InferenceSession(str(spec.onnx_path), opts, providers=wanted)


def synthetic_feeds(spec: ModelSpec, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for inp in spec.inputs:
        shape = [n if isinstance(d, str) else int(d) for d in inp["shape"]]
        lo, hi = inp.get("range", [0, 1])
        dtype = np.dtype(inp["dtype"])
        if dtype.kind in "iu":
            feeds[inp["name"]] = rng.integers(int(lo), int(hi) + 1, shape).astype(dtype)
        else:
            feeds[inp["name"]] = rng.uniform(lo, hi, shape).astype(dtype)
    return feeds


POOL_BYTES = 32 << 20
FEEDS = ("synthetic", "requests")


def pool_rows(spec: ModelSpec, sizes: list[int]) -> int:
    """Rows in the pool: ~POOL_BYTES of inputs, at least the largest batch, and no
    more than 64 of the largest batches."""
    one = synthetic_feeds(spec, 1, np.random.default_rng(0))
    row_bytes = sum(a.nbytes for a in one.values())
    return max(max(sizes), min(POOL_BYTES // row_bytes, 64 * max(sizes)))


def request_feeds(model: str, rows: int) -> dict[str, np.ndarray]:
    """At least `rows` model rows from the generated requests of the pipeline named
    like the model, decoded and collated as the worker does."""
    from pipeline.config import WorkerConfig
    from pipeline.registry.pipelines import get_pipeline

    pipeline = get_pipeline(model)
    codec = pipeline.make_codec(WorkerConfig(pipeline=model))
    make = pipeline.make_samples(11)  # bench/harness.py RequestPool's seed
    decoded, have = [], 0
    while have < rows:
        _key, value, headers = make(len(decoded))
        decoded.append(codec.decode(value, dict(headers)))
        have += decoded[-1].rows
    return codec.collate([d.payload for d in decoded])


def call_feeds(pool: dict[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    """The pool cut into consecutive calls of n rows (views, no copies)."""
    total = len(next(iter(pool.values())))
    return [{k: v[start : start + n] for k, v in pool.items()} for start in range(0, total - n + 1, n)]


def time_batch(
    session: Any, pool: dict[str, np.ndarray], n: int, min_seconds: float
) -> tuple[list[float], list[float]]:
    """(wall seconds, calling thread's CPU seconds) per call of n rows, each call on the
    next n rows of the pool (module doc: rows the caches have not just seen)."""
    outputs = [o.name for o in session.get_outputs()]
    parts = call_feeds(pool, n)
    for feeds in parts[:3]:  # warm-up: first calls allocate and plan
        session.run(outputs, feeds)
    wall: list[float] = []
    cpu: list[float] = []
    start = time.perf_counter()
    while len(wall) < 7 or time.perf_counter() - start < min_seconds:
        feeds = parts[len(wall) % len(parts)]
        c0, t0 = time.thread_time(), time.perf_counter()
        session.run(outputs, feeds)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return wall, cpu


def fit_affine(ns: list[int], ts: list[float]) -> tuple[float, float]:
    """(a, b) of t ~= a + b*n, least squares on relative error."""
    b, a = np.polyfit(np.array(ns, float), np.array(ts), 1, w=1.0 / np.array(ts))
    return float(a), float(b)


def measure(
    model: str, sizes: list[int], threads: int, provider: str, seconds: float, feeds: str = "synthetic"
) -> dict:
    if feeds not in FEEDS:
        raise UserError(f"feeds must be one of {', '.join(FEEDS)}, got {feeds!r}")
    spec = load_spec(model)
    session = make_session(spec, threads, provider)
    n_rows = pool_rows(spec, sizes)
    if feeds == "requests":
        pool = request_feeds(model, n_rows)
    else:
        pool = synthetic_feeds(spec, n_rows, np.random.default_rng(0))
    rows = []
    for n in sizes:
        wall, cpu = time_batch(session, pool, n, seconds)
        med, med_cpu = statistics.median(wall), max(statistics.median(cpu), 1e-9)
        rows.append(
            {
                "batch": n,
                "calls": len(wall),
                "median_ms": med * 1e3,
                "rows_per_s": n / med,
                "cpu_median_ms": med_cpu * 1e3,
                "cpu_rows_per_s": n / med_cpu,
            }
        )
    ns = [r["batch"] for r in rows]
    fits = {}
    for label, key in (("fit", "median_ms"), ("cpu_fit", "cpu_median_ms")):
        a, b = fit_affine(ns, [r[key] / 1e3 for r in rows])
        fits[label] = {"a_ms": a * 1e3, "b_ms_per_row": b * 1e3}
    best = max(rows, key=lambda r: r["rows_per_s"])
    best_cpu = max(rows, key=lambda r: r["cpu_rows_per_s"])
    return {
        "model": model,
        "onnx": spec.onnx_path.name,
        "provider": session.get_providers()[0],
        "intra_op_threads": threads,
        "feeds": feeds,
        "pool_rows": len(next(iter(pool.values()))),
        "batches": rows,
        **fits,
        "best": {"batch": best["batch"], "rows_per_s": best["rows_per_s"]},
        "cpu_best": {"batch": best_cpu["batch"], "rows_per_s": best_cpu["cpu_rows_per_s"]},
        "gain_vs_batch1": best["rows_per_s"] / rows[0]["rows_per_s"],
    }


def print_table(result: dict) -> None:
    print(
        f"{result['model']} ({result['onnx']}) on {result['provider']}, "
        f"{result['intra_op_threads']} intra-op thread(s), {result['feeds']} feeds, "
        f"a pool of {result['pool_rows']} rows"
    )
    print(f"{'':13} {'------ wall clock ------':>22} {'----- thread CPU -----':>22}")
    print(
        f"{'batch':>6} {'calls':>6} {'median ms':>10} {'rows/s':>11} {'median ms':>10} {'rows/s':>11}"
    )
    for r in result["batches"]:
        print(
            f"{r['batch']:>6} {r['calls']:>6} {r['median_ms']:>10.3f} {r['rows_per_s']:>11,.0f} "
            f"{r['cpu_median_ms']:>10.3f} {r['cpu_rows_per_s']:>11,.0f}"
        )
    for label, key in (("wall", "fit"), ("cpu", "cpu_fit")):
        fit = result[key]
        print(
            f"fit t(n) ~= a + b*n ({label}): a = {fit['a_ms']:.3f} ms, "
            f"b = {fit['b_ms_per_row'] * 1e3:.2f} us/row"
        )
    best, best_cpu = result["best"], result["cpu_best"]
    print(
        f"best: {best['rows_per_s']:,.0f} rows/s at batch {best['batch']} "
        f"(x{result['gain_vs_batch1']:.1f} over batch 1); "
        f"on thread CPU time {best_cpu['rows_per_s']:,.0f} rows/s at batch {best_cpu['batch']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ONNX Runtime throughput of a shipped model")
    parser.add_argument("--model", default="ctr", help="directory under models/ (default ctr)")
    parser.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--provider", choices=("cpu", "auto"), default="cpu")
    parser.add_argument("--seconds", type=float, default=0.5, help="time per batch size")
    parser.add_argument("--feeds", choices=FEEDS, default="synthetic", help="input rows (module doc)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",") if s]
    try:
        result = measure(args.model, sizes, args.threads, args.provider, args.seconds, args.feeds)
    except UserError as exc:
        print(f"model_peak: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
