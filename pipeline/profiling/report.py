"""What `tidebatch profile` prints and writes: a table per configuration, the
predictions, the curve file (the chosen configuration's, in the format
pipeline/simulate/curves.py `load_curve` reads, with every configuration's measurements
beside it) and the recommended worker config."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import WorkerConfig
from pipeline.profiling.calibration import WINDOW, ThreadCpu
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
            "calibration": _calibration(profile),
            "bounds_rows_s": {k: v * py.rows_per_request for k, v in profile.stages().bounds().items()},
            "predicted_capacity_rows_s": profile.predicted_capacity,
            "limited_by": profile.limited_by,
            "upper_bound": profile.calibrated is None,
        },
    }


def _calibration(profile: Profile) -> dict | None:
    cal = profile.calibrated
    if cal is None:
        return None
    return {
        "bootstrap": cal.bootstrap, "requests": cal.requests, "drained_requests": cal.drained_requests,
        "window": list(WINDOW), "drained_rows_s": cal.drained * profile.python.rows_per_request,
        "us_per_request": {name: round(v * 1e6, 2) for name, v in _thread_figures(cal).items() if v is not None},
        "executors": cal.executors, "others_cores": cal.others_cores,
    }


def _thread_figures(cal: ThreadCpu) -> dict[str, float | None]:
    return {"source": cal.source_s, "executors": cal.executors_s, "publisher": cal.publisher_s, "other": cal.other_s,
            "model_process": cal.model_process_s, "broker": cal.broker_s}


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


def _calibration_lines(profile: Profile) -> list[str]:
    """One line per calibration (one per executor kind at most, measure.py `calibrate_choice`)."""
    lines = []
    for cal in profile.calibrations:
        spent = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in _thread_figures(cal).items() if v is not None)
        kind = "model process" if cal.model_process_s is not None else "in-process"
        lines.append(f"calibration ({kind}) at {cal.bootstrap}: a worker drained {cal.drained_requests:,} requests, "
                     f"measured from {WINDOW[0]:.0%} to {WINDOW[1]:.0%} of them ({cal.requests:,}, start-up and "
                     f"the last ones left out) at {cal.drained * profile.python.rows_per_request:,.0f} rows/s; "
                     f"CPU µs per request: {spent} "
                     f"({cal.executors} executor{'s' if cal.executors > 1 else ''}; the rest of the machine kept "
                     f"{cal.others_cores:.2f} cores busy meanwhile)")
    return lines


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
        *_calibration_lines(profile),
        "bounds (rows/s; docs/OWN_MODEL.md, \"Profiling\"): " + ", ".join(
            f"{k} {v * py.rows_per_request:,.0f}" for k, v in profile.stages().bounds().items()),
        f"predicted capacity: {profile.predicted_capacity:,.0f} rows/s, limited by {profile.limited_by}"
        + ("; an upper bound: the Kafka work is not measured without a broker (--bootstrap-servers or "
           "--embedded-broker)" if profile.calibrated is None else ""),
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
