"""Issue 47's GPU figures, in one run, one JSON out (docs/MODELS.md, "On a GPU host").

    python3 bench/gpu.py [--sizes 1,2,4,...,8192] [--threads 1,2,4,8,16] [--seconds 0.3]
        [--models ctr,camera] [--no-pipeline] [--out out/bench/gpu.json]

- the model alone, through the project's own session (pipeline/runtime/session.py), per
  provider and mode: CPU at 1..N intra-op threads; CUDA plain, CUDA + IO binding, CUDA
  graphs (pipeline/runtime/io_binding.py); TensorRT where the build and the host have it.
  Per batch size: median wall ms, the calling thread's and the whole process's CPU ms
  per call (time.thread_time / time.process_time: a CUDA call that spins while it waits
  shows CPU = wall), rows/s; t(n) = a + b*n fitted over the sizes <= 512 and over all.
- the CUDA IO-binding and graph rows again with CUDA's waits sleeping instead of spinning
  (cudaDeviceScheduleBlockingSync, a process of its own): by default a thread waiting
  for the GPU spins, so a call's CPU time equals its wall time whatever the GPU does;
- CPU against CUDA outputs (max |diff| per output) with TF32 off and on, CTR and CenterFace;
- CenterFace at 480x640: frames/s at batch 1 and 16, per mode;
- the pipeline: bench/pipeline_capacity.py on the embedded broker, its worker on CUDA
  plain and on CUDA graphs (its JSON included).

Without a usable CUDA device every CUDA row says "skipped: no CUDA device" and the CPU
rows are still measured, so the script is checked on any machine (tests/unit/test_bench_gpu.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.model_peak import call_feeds, fit_affine, pool_rows, synthetic_feeds  # noqa: E402
from models.registry import ModelSpec, load_spec  # noqa: E402
from pipeline.runtime.device import DeviceOptions  # noqa: E402
from pipeline.runtime.session import InferenceSession  # noqa: E402

NO_CUDA = "skipped: no CUDA device"
SIZES = tuple(2**i for i in range(14))  # 1 .. 8192
CAMERA_SHAPE = (3, 480, 640)
# mode -> (providers, device options at the sizes measured)
CUDA_MODES = {
    "cuda-plain": ("cuda", {"io_binding": False}),
    "cuda-io-binding": ("cuda", {"io_binding": True}),
    "cuda-graphs": ("cuda", {"io_binding": True, "cuda_graphs": True}),
    # as in the model process: no hop to the graph thread (what the hop costs)
    "cuda-graphs-caller-thread": ("cuda", {"io_binding": True, "cuda_graphs": True, "graphs_on_caller_thread": True}),
}


def cuda_device() -> str | None:
    """None when a CUDA session can be had here, else why not."""
    import onnxruntime as ort

    from pipeline.runtime.session import _cuda_loadable

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "this onnxruntime build has no CUDA provider"
    why = _cuda_loadable()
    if why is not None:
        return why
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"no CUDA driver ({exc})"
    return None


def tensorrt_missing() -> str | None:
    """None when ORT's TensorRT provider and TensorRT's libraries (libnvinfer) load."""
    import onnxruntime as ort

    lib = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_tensorrt.so"
    if not lib.exists():
        return "this onnxruntime build has no TensorRT provider"
    try:
        ctypes.CDLL(str(lib))
    except OSError as exc:
        return f"TensorRT libraries not loadable: {str(exc).splitlines()[0]}"
    return None


def model_feeds(spec: ModelSpec, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if any(isinstance(d, str) for d in spec.inputs[0]["shape"][1:]):  # CenterFace: frames of one size
        return {spec.inputs[0]["name"]: rng.uniform(0, 1, (n, *CAMERA_SHAPE)).astype(np.float32)}
    return synthetic_feeds(spec, n, rng)


def time_calls(session: InferenceSession, parts: list[dict[str, np.ndarray]], seconds: float) -> dict[str, float]:
    """Median wall, calling-thread CPU and process CPU ms per call."""
    for feeds in parts[:3]:
        session.run(feeds)  # first calls allocate, plan (and capture)
    wall: list[float] = []
    thread: list[float] = []
    proc: list[float] = []
    start = time.perf_counter()
    while len(wall) < 5 or (time.perf_counter() - start < seconds and len(wall) < 2000):
        feeds = parts[len(wall) % len(parts)]
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        session.run(feeds)
        wall.append(time.perf_counter() - t0)
        thread.append(time.thread_time() - c0)
        proc.append(time.process_time() - p0)
    return {"calls": len(wall), "wall_ms": statistics.median(wall) * 1e3,
            "thread_cpu_ms": statistics.median(thread) * 1e3, "process_cpu_ms": statistics.median(proc) * 1e3}


def fits(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, keep in (("fit_le_512", lambda n: n <= 512), ("fit_all", lambda n: True)):
        pts = [(r["batch"], r["wall_ms"] / 1e3) for r in rows if keep(r["batch"])]
        if len(pts) >= 2:
            a, b = fit_affine([p[0] for p in pts], [p[1] for p in pts])
            out[label] = {"fixed_ms": a * 1e3, "per_row_us": b * 1e6}
    small = [r for r in rows if r["batch"] <= 512]
    if small:
        out["process_cpu_over_wall_le_512"] = statistics.median(r["process_cpu_ms"] / r["wall_ms"] for r in small)
        out["thread_cpu_over_wall_le_512"] = statistics.median(r["thread_cpu_ms"] / r["wall_ms"] for r in small)
    return out


def model_mode(spec: ModelSpec, providers: str, threads: int, device: DeviceOptions, sizes: list[int],
               seconds: float) -> dict[str, Any]:
    session = InferenceSession(spec.onnx_path, providers, threads, device=device)
    try:
        rng = np.random.default_rng(0)
        pool = model_feeds(spec, pool_rows(spec, sizes) if "ctr" in spec.name else max(sizes), rng)
        rows = []
        for n in sizes:
            row = {"batch": n, **time_calls(session, call_feeds(pool, n)[:64], seconds)}
            row["rows_per_s"] = n / (row["wall_ms"] / 1e3)
            rows.append(row)
        return {"provider": session.provider, "graphs": session.graphs, "intra_op_threads": threads,
                "batches": rows, **fits(rows)}
    finally:
        session.close()


def model_rows(spec: ModelSpec, sizes: list[int], threads: list[int], seconds: float, no_cuda: str | None,
               no_trt: str | None, modes: list[str] | None = None) -> dict[str, Any]:
    """Every provider and mode of one model: name -> its table, or why it was skipped."""
    out: dict[str, Any] = {}
    for t in threads:
        out[f"cpu-{t}-threads"] = model_mode(spec, "cpu", t, DeviceOptions(), sizes, seconds)
    if threads:  # what the buffers cost or save where no copy to a device is saved
        dev = DeviceOptions(io_binding=True, batch_sizes=tuple(sizes))
        out[f"cpu-{threads[0]}-threads-io-binding"] = model_mode(spec, "cpu", threads[0], dev, sizes, seconds)
    for mode, (providers, opts) in CUDA_MODES.items():
        if modes is not None and mode not in modes:
            continue
        if no_cuda:
            out[mode] = NO_CUDA
            continue
        out[mode] = model_mode(spec, providers, 1, DeviceOptions(batch_sizes=tuple(sizes), **opts), sizes, seconds)
    if no_cuda or no_trt:
        out["tensorrt"] = f"skipped: {no_cuda or no_trt}"
    else:
        # TensorRT builds an engine per new shape (seconds to minutes each): a few sizes
        few = [n for n in sizes if n in (1, 16, 512, 8192)] or sizes[:2]
        try:
            out["tensorrt"] = model_mode(spec, "tensorrt", 1, DeviceOptions(), few, seconds)
            out["tensorrt"]["ran"] = out["tensorrt"]["provider"] == "tensorrt"
        except Exception as exc:  # TensorRT's own failures, kept as the row
            out["tensorrt"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return out


def accuracy(spec: ModelSpec, rows: int, no_cuda: str | None) -> dict[str, Any]:
    """max |CPU - CUDA| per output on the same rows, TF32 off and on."""
    if no_cuda:
        return {"tf32-off": NO_CUDA, "tf32-on": NO_CUDA}
    feeds = model_feeds(spec, rows, np.random.default_rng(7))
    cpu = InferenceSession(spec.onnx_path, "cpu").run(feeds)
    out: dict[str, Any] = {}
    for label, tf32 in (("tf32-off", False), ("tf32-on", True)):
        session = InferenceSession(spec.onnx_path, "cuda", device=DeviceOptions(tf32=tf32, io_binding=False))
        got = session.run(feeds)
        out[label] = {k: float(np.max(np.abs(got[k].astype(np.float64) - cpu[k]))) for k in cpu}
        out[label]["provider"] = session.provider
    return out


def pipeline_runs(no_cuda: str | None, requests: int) -> dict[str, Any]:
    """bench/pipeline_capacity.py with its worker on CUDA, plain and with graphs."""
    if no_cuda:
        return {"cuda-plain": NO_CUDA, "cuda-graphs": NO_CUDA}
    out: dict[str, Any] = {}
    envs = {"cuda-plain": {"TIDEBATCH_RUNTIME__IO_BINDING": "false"},
            "cuda-graphs": {"TIDEBATCH_RUNTIME__CUDA_GRAPHS": "true"}}
    for label, extra in envs.items():
        env = {**os.environ, "TIDEBATCH_RUNTIME__PROVIDERS": "cuda", **extra}
        cmd = [sys.executable, str(REPO / "bench" / "pipeline_capacity.py"), "--broker", "tansu",
               "--no-model-process", "--requests", str(requests), "--policies", "static,adaptive",
               "--binary-policies", "static", "--latency-seconds", "10"]
        done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
        report = REPO / "out" / "bench" / "pipeline_capacity.json"
        out[label] = {"exit": done.returncode, "command": " ".join(cmd[1:]), "env": extra,
                      "tail": done.stdout[-3000:] + done.stderr[-2000:],
                      "report": json.loads(report.read_text()) if done.returncode == 0 and report.exists() else None}
    return out


def blocking_sync() -> str:
    """Make this process's CUDA waits sleep instead of spin (cudaDeviceScheduleBlockingSync),
    before any session makes the CUDA context: what a call's CPU time is then."""
    from pipeline.runtime.io_binding import _cudart

    try:
        status = _cudart().cudaSetDeviceFlags(0x04)
    except OSError as exc:
        return f"not set: {exc}"
    return "set" if status == 0 else f"not set: cudaSetDeviceFlags returned {status}"


def blocking_sync_rows(args: argparse.Namespace, no_cuda: str | None) -> dict[str, Any] | str:
    """The CUDA IO-binding and graph rows again in a process whose CUDA waits sleep
    (the flag holds for a whole process: a run of this script of its own)."""
    if no_cuda:
        return NO_CUDA
    out = Path(args.out).with_name("gpu-blocking-sync.json")
    cmd = [sys.executable, __file__, "--blocking-sync", "--models", "ctr", "--threads", "", "--no-pipeline",
           "--modes", "cuda-io-binding,cuda-graphs", "--sizes", args.sizes, "--seconds", str(args.seconds),
           "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return f"failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    report = json.loads(out.read_text())
    return {"blocking_sync": report["host"].get("blocking_sync"), **report["ctr"]}


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    cores = os.cpu_count() or 1
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="CTR batch sizes (rows)")
    ap.add_argument("--camera-sizes", default="1,16", help="CenterFace batch sizes (frames)")
    ap.add_argument("--threads", default=",".join(str(t) for t in (1, 2, 4, 8, 16) if t <= cores),
                    help="CPU intra-op threads")
    ap.add_argument("--seconds", type=float, default=0.3, help="timed seconds per size and mode")
    ap.add_argument("--models", default="ctr,camera")
    ap.add_argument("--no-pipeline", action="store_true", help="skip bench/pipeline_capacity.py")
    ap.add_argument("--pipeline-requests", type=int, default=20_000)
    ap.add_argument("--out", default=str(REPO / "out" / "bench" / "gpu.json"))
    ap.add_argument("--modes", default=",".join(CUDA_MODES), help="CUDA modes to measure")
    ap.add_argument("--blocking-sync", action="store_true", help="CUDA waits sleep (a run of its own)")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    synced = blocking_sync() if args.blocking_sync else None

    no_cuda, no_trt = cuda_device(), tensorrt_missing()
    report: dict[str, Any] = {
        "host": {"machine": platform.node(), "cores": cores, "onnxruntime": ort.__version__,
                 "providers": ort.get_available_providers(), "cuda": no_cuda or "usable",
                 "tensorrt": no_trt or "usable", "load_before": os.getloadavg(), "blocking_sync": synced},
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    }
    models = args.models.split(",")
    if "ctr" in models:
        ctr = load_spec("ctr")
        modes = args.modes.split(",")
        trt = "not in this run" if args.blocking_sync else no_trt
        report["ctr"] = model_rows(ctr, parse_ints(args.sizes), parse_ints(args.threads), args.seconds, no_cuda, trt,
                                   modes)
        if not args.blocking_sync:
            report["ctr_accuracy"] = accuracy(ctr, 512, no_cuda)
            report["ctr_blocking_sync"] = blocking_sync_rows(args, no_cuda)
    if "camera" in models:
        cam = load_spec("camera")
        sizes = parse_ints(args.camera_sizes)
        table = model_rows(cam, sizes, [max(parse_ints(args.threads))], args.seconds, no_cuda, no_trt)
        report["camera"] = table
        report["camera_frames_per_s"] = {
            mode: (row if isinstance(row, str) else {str(b["batch"]): b["rows_per_s"] for b in row["batches"]})
            for mode, row in table.items()
        }
        report["camera_accuracy"] = accuracy(cam, 2, no_cuda)
    if not args.no_pipeline:
        report["pipeline"] = pipeline_runs(no_cuda, args.pipeline_requests)
    report["host"]["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(summary(report), indent=2))
    return 0


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The headline figures: each mode's fit and CPU share, accuracy, frames/s."""
    out: dict[str, Any] = {"cuda": report["host"]["cuda"], "tensorrt": report["host"]["tensorrt"]}
    for mode, row in report.get("ctr", {}).items():
        out[f"ctr {mode}"] = row if isinstance(row, str) else {
            k: row[k] for k in ("provider", "graphs", "fit_le_512", "process_cpu_over_wall_le_512") if k in row}
    sync = report.get("ctr_blocking_sync")
    if isinstance(sync, dict):
        for mode, row in sync.items():
            if isinstance(row, dict):
                out[f"ctr {mode} blocking-sync"] = {
                    k: row[k] for k in ("fit_le_512", "process_cpu_over_wall_le_512") if k in row}
    for key in ("ctr_accuracy", "camera_frames_per_s", "camera_accuracy"):
        if key in report:
            out[key] = report[key]
    return out


if __name__ == "__main__":
    sys.exit(main())
