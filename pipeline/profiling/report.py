"""What `tidebatch profile` prints and writes: a table per configuration, the
predictions, the curve file (the chosen configuration's, in the format
pipeline/simulate.py `load_curve` reads, with every configuration's measurements
beside it) and the recommended worker config."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import WorkerConfig
from pipeline.profiling.fit import Fitted, recommended_config
from pipeline.profiling.measure import Profile


def _fit_summary(f: Fitted) -> dict:
    return {
        "executor": f.setting.executor, "intra_op_threads": f.setting.threads,
        "a_ms": f.curve.a * 1e3, "b_ms_per_row": f.curve.b * 1e3,
        "max_batch_rows": f.curve.max_batch_rows, "capacity_rows_s": f.capacity,
    }


def curve_file(profile: Profile) -> dict:
    """The chosen curve plus the profile: every configuration, the Python stage."""
    py = profile.python
    return {
        **profile.chosen.document,
        "name": f"{profile.pipeline}-profile",
        "profile": {
            "pipeline": profile.pipeline,
            "provider": profile.provider,
            "rows_per_request": profile.rows_dist,
            "configurations": [{**_fit_summary(f), "measured": f.document["measured"]} for f in profile.fitted],
            "python_stage_us_per_request": {
                "admit": py.admit_s * 1e6, "collate_split": py.collate_split_s * 1e6, "publish": py.publish_s * 1e6,
            },
            "python_stage_capacity_rows_s": py.capacity,
            "model_capacity_rows_s": profile.chosen.capacity,
            "predicted_capacity_rows_s": profile.predicted_capacity,
            "limited_by": profile.limited_by,
        },
    }


def write_outputs(profile: Profile, out: Path, cfg: WorkerConfig) -> tuple[Path, Path]:
    """out/curve.json and out/worker.yaml."""
    out.mkdir(parents=True, exist_ok=True)
    curve_path, config_path = out / "curve.json", out / "worker.yaml"
    curve_path.write_text(json.dumps(curve_file(profile), indent=2) + "\n")
    head = (f"# tidebatch profile {profile.pipeline}: {profile.chosen.setting.label}, predicted "
            f"{profile.predicted_capacity:,.0f} rows/s (limited by {profile.limited_by}).\n"
            "# Merge into your worker config (docs/OWN_MODEL.md, \"Profiling\").\n")
    config_path.write_text(head + recommended_config(profile.pipeline, profile.chosen, profile.policy,
                                                     cfg.batching.slo_ms))
    return curve_path, config_path


def report_dict(profile: Profile) -> dict:
    doc = curve_file(profile)["profile"]
    doc["chosen"] = _fit_summary(profile.chosen)
    doc["predictions"] = [
        {"load": load, "rows_s": load * profile.predicted_capacity, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
         "goodput_rows_s": r.goodput_rows_s, "mean_batch_rows": r.mean_batch_rows}
        for load, r in zip(profile.loads, profile.predictions, strict=True)
    ]
    return doc


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True)))]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
              for r in rows]
    return "\n".join(lines)


def report_text(profile: Profile, curve_path: Path, config_path: Path, cfg: WorkerConfig) -> str:
    rows = [[f.setting.label + (" *" if f is profile.chosen else ""), f"{f.curve.a * 1e3:.4f}",
             f"{f.curve.b * 1e3:.6f}", str(f.curve.max_batch_rows), f"{f.capacity:,.0f}"] for f in profile.fitted]
    py = profile.python
    out = [
        f"\n{profile.pipeline} on {profile.provider}: model cost per call t(n) = a + b·n (n rows; * = chosen)",
        _table(["configuration", "a ms", "b ms/row", "batch cap", "rows/s"], rows),
        f"python stage per request (GIL): admit (decode, deadline, queue) {py.admit_s * 1e6:.1f} µs, collate+split "
        f"{py.collate_split_s * 1e6:.1f} µs, result {py.publish_s * 1e6:.1f} µs; "
        f"{py.rows_per_request:.3g} rows/request -> {py.capacity:,.0f} rows/s",
        f"predicted capacity: {profile.predicted_capacity:,.0f} rows/s, limited by {profile.limited_by}; an upper "
        "bound: per-record Kafka and queueing work is not measured (docs/OWN_MODEL.md, \"Profiling\")",
        f"\nsimulated ({profile.policy}, SLO {cfg.batching.slo_ms:g} ms; loads relative to the predicted capacity; "
        "latency from batching and the model, not decoding):",
        _table(["load", "rows/s", "p50 ms", "p99 ms", "goodput rows/s", "batch rows"], [
            [f"{load:g}", f"{load * profile.predicted_capacity:,.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}",
             f"{r.goodput_rows_s:,.0f}", f"{r.mean_batch_rows:.0f}"]
            for load, r in zip(profile.loads, profile.predictions, strict=True)
        ]),
        f"\ncurve: {curve_path} (tidebatch simulate --curve {curve_path})",
        f"recommended config: {config_path}",
        config_path.read_text().split("\n", 2)[2].rstrip(),
    ]
    return "\n".join(out)
