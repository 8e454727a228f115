"""Issue 20's check of `tidebatch profile` (pipeline/profiling/): is the profile's
predicted saturation throughput within 20 % of a measured drain?

For the shipped CTR pipeline and for a user-kind pipeline (a `pipelines:` entry
serving tests/own_models.py's ranker: two inputs, a dynamic sequence dimension,
tensor-json), in one run on this machine:

1. the profile, as `tidebatch profile --embedded-broker` runs it (every executor and
   intra-op thread count, --seconds of measuring, then the calibration on a fresh
   embedded broker: pipeline/profiling/calibration.py, a worker in the profile's
   process drains --calibration-requests sample requests and each of its threads' CPU
   is read per request), so the prediction includes the Kafka work and the GIL's
   hand-overs (pipeline/profiling/capacity.py);
2. a preloaded backlog drained on the same broker by a `tidebatch run` process with
   the profile's recommended settings (executor, threads, batch cap, policy)
   (bench/harness.py: the same drain as bench/pipeline_capacity.py, rows/s from the
   first to the last result's timestamp).

Prints predicted (and what limits it) against measured, the ratio, the calibration's
figures by thread and every process's CPU share during the drain; writes
out/bench/profile_check.json.

    flock /tmp/heavy.lock .venv/bin/python bench/profile_check.py [--seconds 30] [--requests 30000]
        [--calibration-requests 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    _BROKER_PIDS,
    OUT,
    RequestPool,
    cpu_shares,
    drop_topics,
    fresh_topics,
    local_broker,
    preload,
    read_results,
    table,
    wait_outcomes,
    worker_process,
)
from pipeline.config import load_config  # noqa: E402
from pipeline.profiling.measure import Calibration, Profile, default_settings, run_profile  # noqa: E402
from pipeline.registry.pipelines import get_pipeline  # noqa: E402

TARGET = 0.20


class SamplePool:
    """The pipeline's own sample requests with a fresh request_id per send (RequestPool's
    interface, for preload), made before the clock starts."""

    def __init__(self, make, size: int = 2000) -> None:
        self.docs = [orjson.loads(make(i)[1]) for i in range(size)]
        self.mean_rows = 1.0  # rows: one (the entry's default): one example per request

    def get(self, i: int, run: str, priority: int | None = None) -> tuple[bytes | None, bytes]:
        doc = {**self.docs[i % len(self.docs)], "request_id": f"{run}-{i}"}
        return doc["request_id"].encode(), orjson.dumps(doc)


@dataclass
class Case:
    label: str
    pipeline: str
    config: Path | None  # a worker config defining the pipeline
    pool: object


def ranker_config(folder: Path) -> Path:
    from tests.own_models import ranker

    model = ranker(folder / "ranker.onnx")
    path = folder / "ranker.yaml"
    path.write_text(yaml.safe_dump({"pipeline": "my-ranker", "pipelines": [{
        "name": "my-ranker", "model": str(model), "codec": "tensor-json",
        "inputs": {"features": "dense", "tokens": "tokens"}, "outputs": {"score": "prob"},
        "sample_dims": {"seq": 8},
    }]}))
    return path


def worker_env(profile: Profile) -> dict[str, str]:
    """The recommended settings (pipeline/profiling/fit.py recommended_config), as the
    worker's environment overrides."""
    s = profile.chosen.setting
    return {
        "TIDEBATCH_RUNTIME__MODEL_PROCESS": str(s.executor == "model-process").lower(),
        "TIDEBATCH_RUNTIME__INTRA_OP_THREADS": str(s.threads),
        "TIDEBATCH_BATCHING__MAX_BATCH_ROWS": str(profile.chosen.curve.max_batch_rows),
    }


def drain(case: Case, profile: Profile, n: int, bootstrap: str) -> dict:
    inp, out = fresh_topics(bootstrap, f"bench-profile-{case.pipeline}")
    run = f"prof-{case.pipeline}"
    preload(bootstrap, inp, case.pool, n, run)  # type: ignore[arg-type]
    with worker_process(bootstrap, inp, out, profile.policy, extra_env=worker_env(profile),
                        log_name=f"profile-check-{case.pipeline}", pipeline=case.pipeline,
                        config=case.config) as proc:
        t0 = time.monotonic()
        with cpu_shares(bootstrap, proc.pid, machine=True) as cores:
            wait_outcomes(proc, n, every=1.0)  # each scrape of /metrics takes the worker's GIL
        wall = time.monotonic() - t0
        res = read_results(bootstrap, out, n, timeout=600, run=run)
    drop_topics(bootstrap, inp, out)
    span = (res.result_ts_ms.max() - res.result_ts_ms.min()) / 1000.0
    rows = sum(len(d["scores"]) if "scores" in d else 1 for d in res.docs)
    # CPU per request while draining: where the time went that the profile does not see.
    per_request_us = {k: v * wall / n * 1e6 for k, v in cores.items() if v == v}
    return {"results": len(res.docs), "seconds": span, "requests_per_s": len(res.docs) / span,
            "rows_per_s": rows / span, "cores": cores, "cpu_us_per_request": per_request_us}


def check(case: Case, seconds: float, n: int, calibration_requests: int) -> dict:
    cfg = load_config(case.config, {"pipeline": case.pipeline}, environ={})
    spec = get_pipeline(case.pipeline, cfg.pipelines)
    # One fresh broker per case: the profile's calibration drains through it (its
    # scratch topics deleted after), then the check's drain.
    with local_broker("tansu") as broker:
        bootstrap = broker.bootstrap_servers
        calibration = Calibration(bootstrap, broker.profile, calibration_requests, tuple(_BROKER_PIDS[bootstrap]))
        profile = run_profile(spec, cfg, default_settings(), seconds=seconds, calibration=calibration,
                              progress=lambda line: print(f"[{case.label}] {line}", flush=True))
        measured = drain(case, profile, n, bootstrap)
    predicted = profile.predicted_capacity
    cal = profile.calibrated
    assert cal is not None
    return {
        "case": case.label, "chosen": profile.chosen.setting.label, "max_batch_rows": profile.chosen.curve.max_batch_rows,
        "model_stage_rows_s": profile.chosen.capacity, "python_stage_rows_s": profile.python.capacity,
        "python_us_per_request": profile.python.per_request_s * 1e6,
        "predicted_rows_s": predicted, "limited_by": profile.limited_by, "measured": measured,
        "bounds_rows_s": {k: v * profile.python.rows_per_request for k, v in profile.stages().bounds().items()},
        "calibration_us_per_request": {k: getattr(cal, k) * 1e6 for k in (
            "source_s", "executors_s", "publisher_s", "other_s", "broker_s") if getattr(cal, k) is not None},
        "calibration_drain_rows_s": cal.drained * profile.python.rows_per_request,
        "calibration_others_cores": cal.others_cores,
        "ratio": measured["rows_per_s"] / predicted,
        "model_only_ratio": measured["rows_per_s"] / profile.chosen.capacity,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="profile measuring time per pipeline")
    ap.add_argument("--requests", type=int, default=30_000, help="backlog size of each drain")
    ap.add_argument("--calibration-requests", type=int, default=20_000,
                    help="requests the profile's broker-backed calibration drains")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        config = ranker_config(Path(tmp))
        ranker_cfg = load_config(config, environ={})
        cases = [
            Case("ctr (JSON requests)", "ctr", None, RequestPool()),
            Case("my-ranker (pipelines: entry)", "my-ranker", config,
                 SamplePool(get_pipeline("my-ranker", ranker_cfg.pipelines).make_samples(11))),
        ]
        results = [check(case, args.seconds, args.requests, args.calibration_requests) for case in cases]
    rows = [[r["case"], r["chosen"], str(r["max_batch_rows"]), f"{r['model_stage_rows_s']:,.0f}",
             f"{r['python_stage_rows_s']:,.0f}", f"{r['predicted_rows_s']:,.0f}", r["limited_by"],
             f"{r['calibration_drain_rows_s']:,.0f}", f"{r['measured']['rows_per_s']:,.0f}",
             f"{r['ratio']:.2f}", "yes" if abs(r["ratio"] - 1) <= TARGET else "no"] for r in results]
    print("\n2 cores shared with other work: noisy; ratios within one run")
    print(table(["pipeline", "chosen", "cap", "model rows/s", "python (offline) rows/s", "predicted", "limited by",
                 "calibration drain", "measured drain", "measured/predicted", f"within {TARGET:.0%}"], rows))
    print("\nCalibration: CPU µs per request by thread, and the cores the rest of the machine used meanwhile")
    print(table(["pipeline", "source", "executors", "publisher", "other (librdkafka)", "broker", "others' cores"], [
        [r["case"], *(f"{r['calibration_us_per_request'].get(k, float('nan')):.0f}"
                      for k in ("source_s", "executors_s", "publisher_s", "other_s", "broker_s")),
         f"{r['calibration_others_cores']:.2f}"] for r in results]))
    print("\nCPU per request during the drain (µs; worker = the `tidebatch run` process, python = what the "
          "profile measured of it)")
    print(table(["pipeline", "python (profile)", "worker", "broker", "bench", "others", "stolen"], [
        [r["case"], f"{r['python_us_per_request']:.0f}",
         *(f"{r['measured']['cpu_us_per_request'].get(k, float('nan')):.0f}"
           for k in ("worker", "broker", "generator", "others", "stolen"))]
        for r in results]))
    (OUT / "profile_check.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
