"""`tidebatch etl` throughput against the CTR model's direct peak.

    .venv/bin/python bench/etl_throughput.py [--rows 1000000] [--format parquet]

1. Generates the input once (flat CTR rows from the load generator's request factory;
   a block of distinct requests repeated with new request ids), cached in /tmp.
2. Alternates, for --rounds rounds: the model's direct peak with bench/model_peak.py
   (best rows/s over batch sizes, synthetic feeds, no I/O), then the ETL job over the
   file into a fresh output directory (whole job: read, featurise, score, write
   Parquet, checkpoint).
3. Prints every round and the ratio of the medians. Single numbers on a shared 2-core
   machine are noisy; alternating keeps both sides under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.csv as pcsv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.model_peak import measure  # noqa: E402
from pipeline.etl.job import run_etl  # noqa: E402
from pipeline.etl.settings import EtlJob  # noqa: E402
from pipeline.loadgen.ctr_files import flat_rows_table  # noqa: E402

BLOCK_ROWS = 50_000  # distinct requests generated (the rest repeats them with new ids)


def make_input(path: Path, rows: int, fmt: str) -> None:
    """`rows` flat rows; generating 1M distinct requests would take minutes, and
    repeated feature values cost the job exactly what fresh ones do."""
    # 2.5k requests 10 ms apart (~2k rows/s, like a busy topic): chunks of one file each
    base = flat_rows_table(seed=7, min_rows=BLOCK_ROWS, t0_ms=1_767_225_600_000, spacing_ms=10)
    parts, have, k = [], 0, 0
    while have < rows:
        rid = pc.binary_join_element_wise(base["request_id"], pa.scalar(f"-r{k}"), "")
        parts.append(base.set_column(base.schema.get_field_index("request_id"), "request_id", rid))
        have += base.num_rows
        k += 1
    table = pa.concat_tables(parts).slice(0, rows)
    tmp = path.with_suffix(path.suffix + ".tmp")
    if fmt == "parquet":
        pq.write_table(table, tmp, row_group_size=131_072)
    else:
        pcsv.write_csv(table, tmp)
    os.replace(tmp, path)


def cpu_peak(batch: int, threads: int, seconds: float) -> float:
    """Model rows per CPU-second at one batch size (synthetic feeds, fresh rows each
    call, as model_peak): unlike wall-clock rows/s this barely moves with other load on
    the machine."""
    import numpy as np

    from bench.model_peak import call_feeds, make_session, pool_rows, synthetic_feeds
    from models.registry import load_spec

    spec = load_spec("ctr")
    session = make_session(spec, threads, "cpu")
    pool = synthetic_feeds(spec, pool_rows(spec, [batch]), np.random.default_rng(0))
    parts = call_feeds(pool, batch)
    outputs = [o.name for o in session.get_outputs()]
    for feeds in parts[:3]:
        session.run(outputs, feeds)
    rows, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        session.run(outputs, parts[(rows // batch) % len(parts)])
        rows += batch
    return rows / (time.process_time() - t0)


def run_job(input_path: Path, output: Path, args: argparse.Namespace) -> tuple[int, float, float, str, float]:
    """(rows scored, seconds of the job loop, seconds wall incl. model load, provider,
    CPU seconds of the whole job)."""
    shutil.rmtree(output, ignore_errors=True)
    job = EtlJob(
        output=str(output),
        inputs=[str(input_path)],
        chunk_rows=args.chunk_rows,
        batch_rows=args.batch_rows,
        threads=args.threads,
        providers="cpu",
        progress=False,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    summary = run_etl(job)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return summary.rows_scored, summary.seconds, wall, summary.provider, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    p.add_argument("--workdir", default="/tmp/tidebatch-etl-bench")
    p.add_argument("--batch-rows", type=int, default=2048, help="rows per ONNX call in the job")
    p.add_argument("--chunk-rows", type=int, default=131_072)
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (both sides)")
    p.add_argument("--peak-sizes", default="512,1024,2048,4096,8192")
    p.add_argument("--peak-seconds", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3, help="alternating peak/etl measurements")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    input_path = work / f"ctr-{args.rows}-v2.{args.format}"
    if not input_path.exists():
        t0 = time.perf_counter()
        make_input(input_path, args.rows, args.format)
        print(f"generated {input_path} ({args.rows:,} rows) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    sizes = [int(s) for s in args.peak_sizes.split(",")]
    rounds = []
    for _ in range(args.rounds):  # alternate: both sides see the same machine load
        peak = measure("ctr", sizes, args.threads, "cpu", args.peak_seconds)["best"]
        rows, loop_s, wall_s, provider, cpu_s = run_job(input_path, work / "out", args)
        rounds.append({"peak_rows_per_s": peak["rows_per_s"], "peak_batch": peak["batch"],
                       "etl_rows_per_s": rows / loop_s, "etl_seconds": loop_s, "etl_wall_seconds": wall_s,
                       "etl_rows_per_cpu_s": rows / cpu_s,
                       "peak_rows_per_cpu_s": cpu_peak(peak["batch"], args.threads, args.peak_seconds)})
    peak_med = statistics.median(r["peak_rows_per_s"] for r in rounds)
    etl_med = statistics.median(r["etl_rows_per_s"] for r in rounds)
    cpu_ratio = statistics.median(r["etl_rows_per_cpu_s"] / r["peak_rows_per_cpu_s"] for r in rounds)
    result = {
        "rows": rows, "format": args.format, "provider": provider, "threads": args.threads,
        "etl_batch_rows": args.batch_rows, "chunk_rows": args.chunk_rows, "rounds": rounds,
        "peak_rows_per_s_median": peak_med, "etl_rows_per_s_median": etl_med, "ratio": etl_med / peak_med,
        "cpu_ratio_median": cpu_ratio,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"input: {input_path} ({rows:,} rows, {args.format}); ONNX Runtime {provider}, "
          f"{args.threads} intra-op thread(s) on both sides; etl {args.batch_rows} rows per call")
    print(f"{'round':>5} {'model peak rows/s':>18} {'(batch)':>8} {'etl rows/s':>12} {'etl s':>7} {'ratio':>7}")
    for i, r in enumerate(rounds, 1):
        print(f"{i:>5} {r['peak_rows_per_s']:>18,.0f} {r['peak_batch']:>8} {r['etl_rows_per_s']:>12,.0f} "
              f"{r['etl_seconds']:>7.1f} {r['etl_rows_per_s'] / r['peak_rows_per_s']:>7.1%}")
    print(f"{'median':>5} {peak_med:>18,.0f} {'':>8} {etl_med:>12,.0f} {'':>7} {etl_med / peak_med:>7.1%}")
    print(f"per CPU-second (load-independent): etl / model alone = {cpu_ratio:.1%} "
          f"(etl {statistics.median(r['etl_rows_per_cpu_s'] for r in rounds):,.0f} rows per CPU-s over both threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
