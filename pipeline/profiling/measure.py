"""`tidebatch profile`'s run: the pipeline's sample requests, one model session per
configuration opened as the worker opens it (pipeline/runtime/sessions.py), timed
through the worker's own scoring step (pipeline/scoring.py `ScoringStep.infer`), then
the fits, the choice, the Python stage and the simulator's predictions.

    profile = run_profile(pipeline, cfg, settings, seconds=30.0)
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from models.registry import ModelSpec
from pipeline.app.compose import executor_count
from pipeline.batching.concurrent import BatchQueue
from pipeline.codecs.base import Codec, Decoded
from pipeline.config import RuntimeConfig, WorkerConfig
from pipeline.errors import UserError
from pipeline.profiling.calibration import ThreadCpu, calibrate
from pipeline.profiling.capacity import WorkerStages
from pipeline.profiling.fit import Fitted, best, fit
from pipeline.profiling.stages import PythonStage, measure_python_stage
from pipeline.profiling.sweep import EXECUTORS, Setting, ladder, sweep
from pipeline.registry.pipelines import PipelineSpec
from pipeline.runtime.sessions import open_session
from pipeline.scoring import ScoringStep, sample_requests
from pipeline.simulate.compare import compare
from pipeline.simulate.engine import SimConfig
from pipeline.simulate.results import RunResult

SIM_REQUESTS = 20_000  # simulated requests at the highest load: enough for a p99
# Requests whose Python stage is timed: on a shared machine a few dozen gave 158-332 µs
# for the same JSON CTR request from one run to the next.
PYTHON_REQUESTS = 1000
DISTINCT = 2000  # distinct sample requests in a calibration (as bench/harness.py RequestPool)


@dataclass
class Profile:
    pipeline: str
    fitted: list[Fitted]
    chosen: Fitted
    python: PythonStage
    rows_dist: str  # rows per request, in the simulator's notation (pipeline/simulate/rows.py RowsDist)
    provider: str
    policy: str
    loads: list[float] = field(default_factory=list)  # relative to predicted_capacity
    predictions: list[RunResult] = field(default_factory=list)  # one per load
    # The broker-backed calibrations, at most one per executor kind; none: Kafka work not measured.
    calibrations: list[ThreadCpu] = field(default_factory=list)
    cores: int = 1  # cores the worker may use (this process's CPU affinity)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)  # the config's, for the executor count
    linger_ms: float = 10.0  # the config's batching.max_queue_delay_ms: static's linger

    @property
    def calibrated(self) -> ThreadCpu | None:
        """The calibration the chosen configuration's prediction rests on."""
        return self.calibration_for(self.chosen)

    def calibration_for(self, fitted: Fitted) -> ThreadCpu | None:
        """The calibration run with `fitted`'s executor kind, else any there is."""
        return next((c for c in self.calibrations if calibrated_in(c, fitted)), None) or next(
            iter(self.calibrations), None)

    def stages(self, fitted: Fitted | None = None) -> WorkerStages:
        """The worker's stages in a configuration (the chosen one by default)."""
        f = fitted or self.chosen
        return worker_stages(f, self.python, self.calibration_for(f), self.cores, self.runtime)

    @property
    def predicted_capacity(self) -> float:
        """Rows/s of a worker in the chosen configuration (pipeline/profiling/capacity.py)."""
        return self.stages().capacity

    @property
    def limited_by(self) -> str:
        return self.stages().limited_by


def calibrated_in(cal: ThreadCpu, fitted: Fitted) -> bool:
    """Was `cal` run with `fitted`'s executor kind (a model process or in-process)?"""
    return (cal.model_process_s is not None) == (fitted.setting.executor == "model-process")


def calibrate_choice(profile: Profile, run: Callable[[Fitted], ThreadCpu]) -> None:
    """Calibrate the configuration the offline figures favour (`run`: a drain in it),
    choose again with its figures, and calibrate the new choice too if it has the other
    executor kind, until the chosen kind has a calibration of its own (two at most).
    Why not one for both: the executors' work differs between the kinds (in-process
    they collate, run the model and split, waiting for the GIL in between; a model
    process's executors only hand batches over), and a CTR prediction for in-process
    from a model-process calibration was 0.70 of the measured drain
    (docs/OWN_MODEL.md, "How close it comes")."""
    while not any(calibrated_in(c, profile.chosen) for c in profile.calibrations):
        profile.calibrations.append(run(profile.chosen))
        profile.chosen = best(profile.fitted, capacity=lambda f: profile.stages(f).capacity)


def worker_stages(f: Fitted, python: PythonStage, calibrated: ThreadCpu | None, cores: int,
                  runtime: RuntimeConfig) -> WorkerStages:
    """The stages of a worker running configuration `f` (pipeline/profiling/capacity.py).
    The model's own time per request: the fitted curve at the batch cap (in-process
    that includes the executor's collate and split, pipeline/profiling/sweep.py
    `Point.cost_ms`, which are counted as GIL work instead). The threads' work: the
    calibration's per-thread CPU where there is one (the executors' less the model's
    own time when it runs on them), else the offline Python stage."""
    rows = python.rows_per_request
    model_process = f.setting.executor == "model-process"
    per_request = rows / f.capacity
    model_s = per_request if model_process else max(per_request - python.collate_split_s, 0.0)
    stages = WorkerStages(
        source_s=python.admit_s, publisher_s=python.publish_s, executor_python_s=python.collate_split_s,
        model_s=model_s, rows_per_request=rows,
        executors=executor_count(replace(runtime, model_process=model_process)),
        model_process=model_process, model_threads=f.setting.threads, cores=cores,
    )
    if calibrated is None:
        return stages
    on_executors = 0.0 if model_process else model_s  # ONNX Runtime's own time on the executor threads
    return replace(
        stages, source_s=calibrated.source_s, publisher_s=calibrated.publisher_s,
        executor_python_s=max(calibrated.executors_s - on_executors, python.collate_split_s),
        other_s=calibrated.other_s, broker_s=calibrated.broker_s or 0.0,
    )


@dataclass(frozen=True)
class Calibration:
    """Where `tidebatch profile` measures the worker's Kafka work (pipeline/profiling/calibration.py)."""

    bootstrap: str
    broker_profile: str = "kafka"
    requests: int = 20_000
    broker_pids: tuple[int, ...] = ()  # the broker's processes, when it runs on this machine


def default_settings(cores: int | None = None, threads: Sequence[int] | None = None,
                     executors: Sequence[str] = EXECUTORS) -> list[Setting]:
    """Every executor at every intra-op thread count from 1 to the cores this process
    may use (or the given ones)."""
    cores = cores or len(os.sched_getaffinity(0))
    counts = list(threads) if threads else list(range(1, cores + 1))
    return [Setting(e, t) for e in executors for t in counts]


def rows_distribution(rows: Sequence[int]) -> str:
    """fixed:N when every sample request has N rows, else a lognormal of their mean and
    log-spread: the simulator's arrivals then carry the pipeline's own request sizes."""
    if min(rows) == max(rows):
        return f"fixed:{rows[0]}"
    logs = [math.log(r) for r in rows]
    return f"lognormal:{statistics.fmean(rows):.3g}:{statistics.pstdev(logs):.3g}"


def _pool(pipeline: PipelineSpec, codec: Codec, max_rows: int, batches: int) -> list[Decoded]:
    """Enough decoded sample requests for `batches` distinct batches at the cap."""
    first = sample_requests(pipeline, codec, 32)
    mean = sum(d.rows for d in first) / len(first)
    want = min(max(math.ceil(batches * max_rows / mean), 32), 4096)
    return first if want <= 32 else sample_requests(pipeline, codec, want)


def _messages(pipeline: PipelineSpec, count: int, distinct: int | None = None) -> list[
        tuple[bytes | None, bytes | None, dict[str, bytes]]]:
    """The pipeline's first `count` sample requests (key, value, headers); with
    `distinct`, the first that many over and over (a generated CTR request costs ~2 ms,
    bench/harness.py RequestPool)."""
    from pipeline.scoring import WARMUP_SEED

    make = pipeline.make_samples(WARMUP_SEED)
    first = [(key, value, dict(headers)) for key, value, headers in (make(i) for i in range(min(count, distinct or count)))]
    return [first[i % len(first)] for i in range(count)]


def source_text(pipeline: str, setting: Setting, provider: str) -> str:
    """Where and how a curve was measured (the curve file's "source")."""
    import onnxruntime as ort

    what = ("the model process's own time per batch" if setting.executor == "model-process"
            else "collate + model + split on the executor thread")
    return (f"tidebatch profile {pipeline}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, on "
            f"{platform.node()} ({len(os.sched_getaffinity(0))} cores), ONNX Runtime {ort.__version__} "
            f"{provider}, {setting.label}; median ms per call of the pipeline's sample requests ({what})")


def run_profile(
    pipeline: PipelineSpec,
    cfg: WorkerConfig,
    settings: Sequence[Setting],
    *,
    seconds: float = 30.0,
    loads: Sequence[float] = (0.1, 0.5, 0.9),
    policy: str | None = None,
    quick: bool = False,
    timer: Callable[[], float] = time.perf_counter,
    progress: Callable[[str], None] = lambda line: None,
    calibration: Calibration | None = None,
    cores: int | None = None,
) -> Profile:
    """Measure every setting for about seconds / len(settings), fit, choose, predict.
    calibration: a broker to measure the worker's Kafka work through; None: not
    measured, and the prediction is an upper bound. cores: those the worker may use
    (default: this process's CPU affinity)."""
    model = pipeline.load_model()
    # A schema-registry codec's collate and split are its document codec's; its samples
    # are documents (pipeline/codecs/base.py `inner`), measured with that codec.
    codec = pipeline.make_codec(cfg)
    codec = getattr(codec, "inner", codec)
    max_rows = cfg.batching.max_batch_rows or pipeline.max_batch_rows
    pool = _pool(pipeline, codec, max_rows, 2 if quick else 4)
    counts = ladder([d.rows for d in pool], max_rows)
    slo = {0: cfg.batching.slo_ms, **cfg.batching.priority_slo_ms}
    fitted: list[Fitted] = []
    provider = "cpu"
    for setting in settings:
        rt = replace(cfg.runtime, model_process=setting.executor == "model-process", intra_op_threads=setting.threads)
        session = open_session(model.onnx_path, rt)
        try:
            provider = session.provider
            step = ScoringStep(model, codec, session)
            points = sweep(lambda batch, step=step: step.infer(batch)[1], pool, lambda d: d.rows, counts, timer,
                           seconds / len(settings), min_repeats=3 if quick else 5)
        except Exception as exc:  # e.g. a ZipMap output the model process's wire cannot carry
            progress(f"{setting.label}: not measured ({type(exc).__name__}: {exc})".splitlines()[0])
            continue
        finally:
            session.close()
        f = fit(f"{pipeline.name}-{setting.executor}-{setting.threads}t", setting, points, slo,
                source_text(pipeline.name, setting, provider))
        fitted.append(f)
        progress(f"{setting.label}: t(n) = {f.curve.a * 1e3:.4f} ms + {f.curve.b * 1e3:.5f} ms/row, "
                 f"{f.capacity:,.0f} rows/s")
    if not fitted:
        raise UserError(f"pipeline {pipeline.name!r}: no configuration could run the model (see above)")
    # The Python stage's batches: the largest measured within the pipeline's cap.
    python = _python_stage(pipeline, cfg, codec, model, max(counts), len(pool) if quick else PYTHON_REQUESTS, timer)
    rows_dist = rows_distribution([d.rows for d in pool])
    profile = Profile(pipeline.name, fitted, fitted[0], python, rows_dist, provider, policy or cfg.batching.policy,
                      cores=cores or len(os.sched_getaffinity(0)), runtime=cfg.runtime,
                      linger_ms=cfg.batching.max_queue_delay_ms)
    profile.chosen = best(fitted, capacity=lambda f: profile.stages(f).capacity)
    if calibration is not None:
        messages = _messages(pipeline, calibration.requests, DISTINCT)
        calibrate_choice(profile, lambda chosen: calibrate(
            worker_config(cfg, chosen, profile.policy), messages, bootstrap=calibration.bootstrap,
            broker_profile=calibration.broker_profile, broker_pids=calibration.broker_pids,
            progress=lambda line: progress(f"{chosen.setting.label}: {line}")))
    profile.loads, profile.predictions = list(loads), predict(profile, loads, quick)
    return profile


def worker_config(cfg: WorkerConfig, chosen: Fitted, policy: str) -> WorkerConfig:
    """`cfg` with a configuration's settings, as the recommended worker.yaml has them
    (pipeline/profiling/fit.py `recommended_config`)."""
    s = chosen.setting
    return replace(cfg, runtime=replace(cfg.runtime, model_process=s.executor == "model-process",
                                        intra_op_threads=s.threads),
                   batching=replace(cfg.batching, policy=policy, max_batch_rows=chosen.curve.max_batch_rows))


def _python_stage(pipeline: PipelineSpec, cfg: WorkerConfig, codec: Codec, model: ModelSpec, per_batch: int,
                  count: int, timer: Callable[[], float]) -> PythonStage:
    """The Python stage, with the model in-process (its outputs feed split; the model
    process's wire carries numeric arrays only)."""
    from pipeline.app.compose import batch_queue, batching_params
    from pipeline.batching.cost import CostModel
    from pipeline.batching.registry import make_policy
    from pipeline.clock import MonotonicClock

    params = batching_params(cfg, pipeline.max_batch_rows)
    max_rows = params.get("max_batch_rows", pipeline.max_batch_rows)

    def new_queue() -> BatchQueue:
        policy = make_policy(cfg.batching.policy, **params)
        return batch_queue(cfg, policy, CostModel(), MonotonicClock(), 1, max_rows)

    session = open_session(model.onnx_path, replace(cfg.runtime, model_process=False, intra_op_threads=1))
    try:
        return measure_python_stage(codec, model, [(v, h) for _k, v, h in _messages(pipeline, count)], session.run,
                                    per_batch, timer, new_queue)
    finally:
        session.close()


def sim_label(policy: str, max_rows: int, linger_ms: float) -> str:
    """The simulator's label for a configured policy: `static` runs at the worker's own
    cap and linger (the simulator knows only static-64, static-tuned and
    static:ROWS:DELAY_MS); the others' names are their labels."""
    return f"static:{max_rows}:{linger_ms:g}" if policy == "static" else policy


def predict(profile: Profile, loads: Sequence[float], quick: bool = False) -> list[RunResult]:
    """The simulator (pipeline/simulate/) on the chosen curve, at each load relative to
    the predicted worker capacity, with the pipeline's own request sizes. One executor:
    the model runs one batch at a time (in a model process too)."""
    curve = profile.chosen.curve
    scale = profile.predicted_capacity / curve.capacity
    mean_rows = profile.python.rows_per_request
    requests = SIM_REQUESTS // (10 if quick else 1)
    duration = min(10.0, requests * mean_rows / (max(loads) * profile.predicted_capacity))
    comp = compare(curve, "poisson", [sim_label(profile.policy, curve.max_batch_rows, profile.linger_ms)], loads=[x * scale for x in loads], duration=duration,
                   rows=profile.rows_dist, cfg=SimConfig(executors=1))
    return comp.results
