"""bench/gpu.py's CPU path (tiny sizes): the CPU rows measured, every CUDA row marked
skipped, one JSON out; and its cost fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu


def test_cpu_rows_and_skipped_cuda_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "cuda_device", lambda: "no GPU in this test")
    out = tmp_path / "gpu.json"
    assert gpu.main(["--sizes", "1,4", "--threads", "1", "--seconds", "0", "--models", "ctr",
                     "--no-pipeline", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    cpu = report["ctr"]["cpu-1-threads"]
    assert cpu["provider"] == "cpu" and [b["batch"] for b in cpu["batches"]] == [1, 4]
    assert all(b["calls"] >= 5 and b["wall_ms"] > 0 for b in cpu["batches"])
    assert {"fixed_ms", "per_row_us"} <= set(cpu["fit_le_512"])
    for mode in gpu.CUDA_MODES:
        assert report["ctr"][mode] == gpu.NO_CUDA
    assert report["ctr"]["tensorrt"] == "skipped: no GPU in this test"
    assert report["ctr_accuracy"] == {"tf32-off": gpu.NO_CUDA, "tf32-on": gpu.NO_CUDA}
    assert report["ctr_blocking_sync"] == gpu.NO_CUDA
    assert report["host"]["cuda"] == "no GPU in this test"


def test_the_fit_finds_fixed_and_per_row_cost() -> None:
    rows = [{"batch": n, "wall_ms": 0.5 + 0.001 * n, "thread_cpu_ms": 0.1, "process_cpu_ms": 0.2}
            for n in (1, 8, 64, 512, 4096)]
    fit = gpu.fits(rows)
    assert fit["fit_le_512"]["fixed_ms"] == pytest.approx(0.5) and fit["fit_all"]["per_row_us"] == pytest.approx(1.0)
    assert fit["process_cpu_over_wall_le_512"] == pytest.approx(0.2 / 0.5, rel=0.1)


def test_pipeline_runs_are_skipped_without_cuda() -> None:
    assert gpu.pipeline_runs("no GPU", 10) == {"cuda-plain": gpu.NO_CUDA, "cuda-graphs": gpu.NO_CUDA}
