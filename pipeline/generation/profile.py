"""`tidebatch profile generate`: the per-step cost curve of the generate worker's
decoder on this machine (pipeline/generation/cost.py: t(step) = a + b·sequences + c·
context tokens + p·prefill tokens), for `tidebatch simulate --workload generate
--curve FILE`.

Real decoding steps, as the worker runs them: the shipped decoder through the
DecoderRunner (pipeline/generation/runner.py), with its decoding steps in place on the
KV slots when open_in_place builds the in-place decoder for the provider and through
the gathered fallback when it does not (the same call pipeline/app/generation.py
makes), planned by the GenerationScheduler and with each token pushed into its
stream's chunks: whole steps, as bench/generation_steps.py --curve times them (the
shipped curve pipeline/curves/generation-decoder-tiny-cpu.json is this profile's, of
2026-12-03). Per sequence count
and prompt length of a small grid, two cells (run_cell): a static one, which tells
the terms apart, and a continuous one, whose steps are what continuous batching runs
(prefill beside decoding, rows of different lengths). Every round runs the same steps
(greedy decoding, a deterministic scheduler), so each step's time is its median over
the rounds (a shared machine's preemptions and GC pauses are outliers a least-squares
fit over single steps would follow); the fit is least squares of the relative error
over those steps (fit_step_cost).

What the four terms cannot hold: the gathered fallback's decoding call costs rows ×
the longest row, and nothing where the rows stay the same from one step to the next,
so its curve holds for static batching and is far too cheap for continuous batching's
steps (docs/GENERATION.md, "Profiling the decoder").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import UserError
from pipeline.generation.cost import plan_counts

CHUNK_TOKENS, FLUSH_S = 16, 0.1  # the generate worker's defaults (pipeline/generation/service.py)
POLICIES = ("static", "continuous")  # the cells' kinds (run_cell)
MAX_NEW_SPREAD = 3  # a continuous cell's requests ask for up to this many times `steps` tokens
PROMPT_TEXT = "Kafka records in, token chunks out: the scheduler admits, decodes and retires every step. "


@dataclass(frozen=True, slots=True)
class StepPoint:
    """A step's size and its seconds (one step, or the median of a cell's)."""

    decoded: int  # rows decoded: sequences, or the in-place call's slot range (cost.plan_counts)
    context: int  # context tokens those sequences attend
    prefilled: int  # prompt tokens prefilled (padded to the longest chunk of the call, in place)
    seconds: float


@dataclass(frozen=True, slots=True)
class StepFit:
    """t(step) = a + b·decoded + c·context + p·prefilled, seconds; `dropped` names the
    terms fitted negative and so held at 0."""

    a: float
    b: float
    c: float
    p: float
    dropped: tuple[str, ...] = ()

    def predict(self, point: StepPoint) -> float:
        return self.a + self.b * point.decoded + self.c * point.context + self.p * point.prefilled


TERMS = ("step", "sequence", "context", "prefill")


def fit_step_cost(points: Sequence[StepPoint]) -> StepFit:
    """Least squares of the relative error over the points (each row divided by its
    time): a 70 ms prefill of 3,072 tokens and a 0.2 ms decoding step of one sequence
    count alike, where plain least squares would fit the prefills and leave the
    decoding steps, most of a generation's steps, to the rounding. Every cost >= 0: a
    term that fits negative (noise on a cost too small to see at this grid) is held at
    0 and the rest fitted again, the most negative first. Pure."""
    if len(points) < len(TERMS):
        raise UserError(f"a step cost fit needs >= {len(TERMS)} points, got {len(points)}")
    y = np.array([p.seconds for p in points])
    if not np.isfinite(y).all() or (y <= 0).any():
        raise UserError("step times must be finite and > 0")
    x = np.array([[1.0, p.decoded, p.context, p.prefilled] for p in points]) / y[:, None]
    keep = list(range(len(TERMS)))
    coef = np.zeros(0)
    while keep:
        coef, *_ = np.linalg.lstsq(x[:, keep], np.ones_like(y), rcond=None)
        if (coef >= 0).all():
            break
        keep.pop(int(np.argmin(coef)))
    full = dict.fromkeys(range(len(TERMS)), 0.0) | dict(zip(keep, coef.tolist(), strict=True))
    return StepFit(full[0], full[1], full[2], full[3], tuple(TERMS[i] for i in range(len(TERMS)) if i not in keep))


def median_steps(rounds: Sequence[Sequence[StepPoint]]) -> list[StepPoint]:
    """A cell's rounds, step by step: each step's median seconds over the rounds that
    had a step of its shape there. Greedy decoding and the scheduler are deterministic,
    so every round of a cell runs the same steps; the median drops a round's outlier
    (a preemption, a GC pause) that a least-squares fit over single steps would follow."""
    out = []
    for i, first in enumerate(rounds[0]):
        times = [r[i].seconds for r in rounds if i < len(r) and (r[i].decoded, r[i].context, r[i].prefilled)
                 == (first.decoded, first.context, first.prefilled)]
        out.append(StepPoint(first.decoded, first.context, first.prefilled, statistics.median(times)))
    return out


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...] = (1, 4, 16)  # sequences per cell (capped at the KV slots)
    prompts: tuple[int, ...] = (16, 96, 192)  # prompt tokens per sequence
    steps: int = 8  # decoding steps per cell

    def check(self, slots: int, context: int) -> Grid:
        """The grid within the decoder and its KV slots; refused with one line where not."""
        batches = tuple(sorted({min(b, slots) for b in self.batches}))
        if self.steps < 1 or min(batches) < 1 or min(self.prompts) < 1:
            raise UserError("the grid's sequences, prompt tokens and decoding steps must be >= 1")
        if max(self.prompts) + MAX_NEW_SPREAD * self.steps + 1 > context:
            raise UserError(f"prompt tokens + {MAX_NEW_SPREAD} x decoding steps must fit the decoder's "
                            f"{context}-token context (largest prompt {max(self.prompts)}, {self.steps} steps)")
        if len(batches) < 2 or len(set(self.prompts)) < 2:
            raise UserError("the grid needs >= 2 sequence counts and >= 2 prompt lengths to tell the terms apart")
        return Grid(batches, tuple(sorted(set(self.prompts))), self.steps)


def run_cell(runner, slots: int, context: int, policy: str, n: int, prompt_tokens: int, steps: int,
             clock: Callable[[], float]) -> list[StepPoint]:  # runner: pipeline.generation.runner.DecoderRunner
    """One cell of the grid, run to the end: each step's size and its whole time (plan,
    run, complete, chunks).

    static: n requests of `prompt_tokens` tokens admitted together, `steps` + 1 tokens
    each: one prefill step of n prompts, then `steps` decoding steps of n sequences,
    which tell the terms apart. continuous: 2n requests through n KV slots, prompts of
    1/2 to all of `prompt_tokens` and between 1/2 and 2 1/2 × `steps` tokens, so
    sequences retire at different steps and the waiting ones are admitted into their
    slots: steps that prefill while others decode, rows of different lengths in one
    call (what the gathered fallback pays most for), free slots in the in-place range,
    as continuous batching runs them."""
    from models.decoder import tokenizer
    from pipeline.generation.budget import KvBudget
    from pipeline.generation.policies import make_generation_policy
    from pipeline.generation.runner import gen_request
    from pipeline.generation.scheduler import GenerationScheduler
    from pipeline.generation.stream import Generation

    text = tokenizer.encode(PROMPT_TEXT * (1 + prompt_tokens // len(PROMPT_TEXT)))
    held = n if policy == "continuous" else slots
    sched = GenerationScheduler(make_generation_policy(policy), KvBudget(held, held * context))
    for i in range(2 * n if policy == "continuous" else n):
        length, new = prompt_tokens, steps + 1
        if policy == "continuous":
            length = max(1, prompt_tokens - (i % n) * prompt_tokens // (2 * n))
            new = steps // 2 + 1 + (i * steps) // n
        prompt = text[i % len(PROMPT_TEXT):][:length]  # rows differ, so their tokens do
        refused = sched.submit(gen_request(Generation(f"p{i}", prompt, new), 0.0, float("inf")))
        if refused is not None:
            raise UserError(f"the profile's request was refused: {refused.reason}")
    out: list[StepPoint] = []
    while sched.has_work:
        t0 = clock()
        plan = sched.plan(t0)
        result = runner.run(plan)
        now = clock()
        sched.complete(plan, now, result.stopped)
        for seq in plan.emitting:
            seq.request.item.chunk(now, CHUNK_TOKENS, FLUSH_S)
        out.append(StepPoint(*plan_counts(plan, runner_counts(runner)), clock() - t0))
    return out


def runner_counts(runner: Any) -> str:
    """How the runner's steps are charged (pipeline/generation/cost.py plan_counts):
    the in-place decoder computes its whole slot range, the gathered path its rows."""
    return "live" if getattr(runner, "in_place", None) is None else "computed"


@dataclass(frozen=True)
class Cell:
    policy: str  # static or continuous (run_cell)
    sequences: int
    prompt_tokens: int
    steps: list[StepPoint]  # each its median over the rounds


@dataclass(frozen=True)
class GenerationProfile:
    fit: StepFit
    cells: list[Cell]  # their steps are what the fit is over
    steps: int  # steps timed
    rounds: int
    decoding: str  # "in place" or "gathered"
    seconds: float  # measuring time
    grid: Grid  # as measured (Grid.check)


def measure(runner, slots: int, context: int, grid: Grid, *, seconds: float, min_rounds: int,
            clock: Callable[[], float] = time.perf_counter) -> GenerationProfile:
    """Rounds over the grid's cells, static and continuous (a warm-up cell first, not
    kept), until `seconds` have passed and at least `min_rounds` are done; the fit over
    the cells' steps, each step its median over the rounds."""
    grid = grid.check(slots, context)
    run_cell(runner, slots, context, "continuous", max(grid.batches), max(grid.prompts), 2, clock)  # first calls allocate
    cells: dict[tuple[str, int, int], list[list[StepPoint]]] = {}
    t0, rounds = clock(), 0
    while rounds < min_rounds or clock() - t0 < seconds:
        for policy in POLICIES:
            for n in grid.batches:
                for length in grid.prompts:
                    cells.setdefault((policy, n, length), []).append(
                        run_cell(runner, slots, context, policy, n, length, grid.steps, clock))
        rounds += 1
    measured = [Cell(policy, n, length, median_steps(r)) for (policy, n, length), r in cells.items()]
    fit = fit_step_cost([q for c in measured for q in c.steps])
    steps = sum(len(r) for cell in cells.values() for r in cell)
    decoding = "gathered" if getattr(runner, "in_place", None) is None else "in place"
    return GenerationProfile(fit, measured, steps, rounds, decoding, clock() - t0, grid)


def curve_document(profile: GenerationProfile, *, name: str, model: str, provider: str, slots: int,
                   context: int, deadline_ms: float) -> dict:
    """The "kind": "generation" curve file (pipeline/generation/cost.py
    `step_cost_from_dict` reads it), with the cells' points for the reader."""
    f, grid = profile.fit, profile.grid
    return {
        "kind": "generation", "name": name, "assumed": False,
        "description": f"{model} (models/decoder/), provider {provider}, decoding steps {profile.decoding}",
        "source": f"measured by tidebatch profile generate: {profile.steps} steps in {profile.rounds} rounds "
                  f"over static and continuous cells of {','.join(map(str, grid.batches))} sequences x "
                  f"prompts of {','.join(map(str, grid.prompts))} tokens, {grid.steps} decoding steps a cell "
                  f"(pipeline/generation/profile.py run_cell), whole steps (scheduler, runner, chunks; no "
                  f"Kafka), each step's median over the rounds, least squares of the relative error, "
                  f"{time.strftime('%Y-%m-%d')}",
        "step_ms": f.a * 1e3, "ms_per_sequence": f.b * 1e3, "ms_per_context_token": f.c * 1e3,
        "prefill_ms_per_token": f.p * 1e3, "max_slots": slots, "max_tokens": slots * context,
        "slo_ms": {"0": deadline_ms},
        # what a step is charged for: the rows the in-place call computes (its slot
        # range) and padded prefill, or the live ones for the gathered fallback
        "counts": "computed" if profile.decoding == "in place" else "live",
        "fit": {"held_at_zero": list(f.dropped),
                "cells": [{"policy": c.policy, "sequences": c.sequences, "prompt_tokens": c.prompt_tokens,
                           "steps": len(c.steps), "ms": round(sum(q.seconds for q in c.steps) * 1e3, 4),
                           "fitted_ms": round(sum(f.predict(q) for q in c.steps) * 1e3, 4)}
                          for c in profile.cells]},
    }


def profile_decoder(*, provider: str = "cpu", slots: int = 16, intra_op_threads: int = 1, gathered: bool = False,
                    grid: Grid = Grid(), seconds: float = 5.0, min_rounds: int = 3, deadline_ms: float = 30_000.0,
                    name: str | None = None) -> tuple[GenerationProfile, dict]:
    """The shipped decoder opened as the generate worker opens it (pipeline/generation/
    serve.py: its session, and the in-place decoder where open_in_place builds one;
    gathered: the fallback on purpose), measured, and its curve file's document."""
    from models.registry import load_spec
    from pipeline.generation.runner import DecoderRunner, open_decoder
    from pipeline.generation.slot_decoder import open_in_place

    session, shape = open_decoder(provider, intra_op_threads)
    in_place = None if gathered else open_in_place(str(session.path), shape, intra_op_threads,  # type: ignore[attr-defined]
                                                   provider)
    runner = DecoderRunner(session, shape, slots, in_place)
    profile = measure(runner, slots, shape.context, grid, seconds=seconds, min_rounds=min_rounds)
    model = load_spec("decoder").name
    mode = "in-place" if profile.decoding == "in place" else "gathered"
    doc = curve_document(profile, name=name or f"generation-{model}-{provider}-{mode}", model=model,
                         provider=provider, slots=slots, context=shape.context, deadline_ms=deadline_ms)
    return profile, doc
