"""Where a generation step's time goes, without Kafka: the generation scheduler
(pipeline/generation/scheduler.py) and the runner (pipeline/generation/runner.py) drain
bench/generation.py's requests (the same pool: prompts from docs/GENERATION.md,
max_new_tokens log-uniform 8..200) for each policy, with decoding steps in place on the
KV slots (pipeline/generation/slot_decoder.py) and, with --gathered, also without (the
runner's gather path). Per step, in ms: the ORT decoding call, the ORT prefill call,
the runner's own work around them (gather and write-back, or the in-place binding),
sampling and the chunks (pipeline/generation/stream.py), and the scheduler's plan and
complete. Publishing is not here: bench/generation.py measures the whole pipeline.

    .venv/bin/python bench/generation_steps.py [--requests 300] [--slots 16] [--repeat 3] [--gathered]
                                               [--curve FILE]

--curve fits the per-step cost curve of pipeline/generation/cost.py to the in-place
steps (whole steps, so the simulator's step includes the loop's own work) and writes
it as a "kind": "generation" curve file for `tidebatch simulate --workload generate`.

One process, one thread, nothing else running in it: the rows of one run compare, and
`cpu` says how much of a core the bench had (the rest went to whatever else shares
this machine). Each policy runs --repeat times, interleaved, every run printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.generation import GenPool  # noqa: E402
from bench.harness import table  # noqa: E402
from models.decoder import tokenizer  # noqa: E402
from pipeline.generation.budget import KvBudget  # noqa: E402
from pipeline.generation.cost import plan_counts  # noqa: E402
from pipeline.generation.policies import make_generation_policy  # noqa: E402
from pipeline.generation.profile import runner_counts  # noqa: E402
from pipeline.generation.runner import DecoderRunner, Session, gen_request, open_decoder  # noqa: E402
from pipeline.generation.scheduler import GenerationScheduler  # noqa: E402
from pipeline.generation.slot_decoder import InPlaceDecoder, open_in_place  # noqa: E402
from pipeline.generation.stream import Generation  # noqa: E402


@dataclass
class Clocks:
    """Seconds per part, and what a cost curve is fitted from: per decoding call the
    rows it computes (in place: its slot range), the context tokens they attend and its
    seconds; per prefill call its tokens."""

    parts: dict[str, float] = field(default_factory=dict)
    decode_calls: list[tuple[int, int, float]] = field(default_factory=list)
    prefill_calls: list[tuple[int, float]] = field(default_factory=list)
    steps: list[tuple[int, int, int, float]] = field(default_factory=list)  # decoded, context, prefilled, s

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds


class TimedSession:
    """The shipped graph's session, its calls timed: prefill calls, and decoding calls
    of the gather path (one new token per row)."""

    def __init__(self, inner: Session, clocks: Clocks) -> None:
        self.inner, self.clocks = inner, clocks

    def run(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        t0 = time.perf_counter()
        out = self.inner.run(feeds)
        dt = time.perf_counter() - t0
        ids = feeds["input_ids"]
        if ids.shape[1] == 1:
            self.clocks.add("ort_decode", dt)
            self.clocks.decode_calls.append((ids.shape[0], int(feeds["attention_mask"].sum()), dt))
        else:
            self.clocks.add("ort_prefill", dt)
            self.clocks.prefill_calls.append((int(feeds["attention_mask"][:, -ids.shape[1]:].sum()), dt))
        return out


class TimedInPlace:
    """An InPlaceDecoder's steps, its ORT call's own time (last_call_s) apart from its binding."""

    def __init__(self, inner: InPlaceDecoder, clocks: Clocks) -> None:
        self.inner, self.clocks = inner, clocks

    def step(self, cache: list[np.ndarray], lengths: np.ndarray, rows: dict[int, int]) -> np.ndarray:
        context = int(sum(lengths[s] + 1 for s in rows))
        out = self.inner.step(cache, lengths, rows)
        self.clocks.add("ort_decode", self.inner.last_call_s)
        # rows the call computes: its whole slot range (pipeline/generation/cost.py plan_counts)
        self.clocks.decode_calls.append((max(rows) - min(rows) + 1, context, self.inner.last_call_s))
        return out


def drain(policy: str, pool: GenPool, n: int, slots: int, session: Session, shape, in_place) -> tuple[dict, Clocks]:
    clocks = Clocks()
    timed = TimedSession(session, clocks)
    fast = TimedInPlace(in_place, clocks) if in_place is not None else None
    sched = GenerationScheduler(make_generation_policy(policy), KvBudget(slots, slots * shape.context))
    runner = DecoderRunner(timed, shape, slots, fast)  # type: ignore[arg-type]
    gens = []
    for i in range(n):
        prompt, new = pool.items[i]
        gens.append(Generation(f"r{i}", tokenizer.encode(prompt), new))
        sched.submit(gen_request(gens[-1], 0.0, 1e9))
    steps = tokens = decoding = live = computed = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    while sched.has_work:
        a = time.perf_counter()
        plan = sched.plan(a)
        b = time.perf_counter()
        result = runner.run(plan)
        c = time.perf_counter()
        sched.complete(plan, c, result.stopped)
        d = time.perf_counter()
        for seq in plan.emitting:
            seq.request.item.chunk(d, 16, 0.1)
        e = time.perf_counter()
        clocks.steps.append((*plan_counts(plan, runner_counts(runner)), e - a))
        clocks.add("schedule", (b - a) + (d - c))
        clocks.add("runner", c - b)
        clocks.add("chunks", e - d)
        steps += 1
        tokens += len(result.tokens)
        if plan.decode:  # rows the in-place call computes (its slot range) against the live ones
            decoding += 1
            live += len(plan.decode)
            computed += plan_counts(plan, "computed")[0]
    wall = time.perf_counter() - t0
    own = clocks.parts["runner"] - clocks.parts.get("ort_decode", 0.0) - clocks.parts.get("ort_prefill", 0.0)
    clocks.parts["runner_own"] = own  # gather/write-back or binding, sampling, pushes
    rows = f"{live / max(decoding, 1):.1f}/{computed / max(decoding, 1):.1f}"
    return {"steps": steps, "tokens": tokens, "wall": wall, "cpu": (time.process_time() - cpu0) / wall,
            "rows": rows}, clocks


def fit_curve(steps: list[tuple[int, int, int, float]], slots: int, context: int) -> dict:
    """t(step) = a + b·decoded + c·context + p·prefilled (pipeline/generation/cost.py; the
    in-place steps' rows and prefill as the runner computes them, plan_counts),
    least squares over whole steps (scheduler, runner, chunks), every cost >= 0: a
    term that fits negative is dropped and the rest fitted again."""
    x = np.array([[1.0, n, ctx, pre] for n, ctx, pre, _ in steps])
    y = np.array([t for *_, t in steps])
    keep = [0, 1, 2, 3]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (coef >= 0).all():
            break
        keep.pop(int(np.argmin(coef)))
    full = dict.fromkeys(range(4), 0.0) | dict(zip(keep, coef.tolist(), strict=True))
    return {"kind": "generation", "name": "generation-decoder-tiny-cpu", "assumed": False,
            "description": "the shipped decoder_tiny (models/decoder/) on one CPU core, decoding steps in place",
            "source": f"measured by bench/generation_steps.py --curve: {len(steps)} steps of continuous and "
                      f"static drains, whole steps (scheduler, runner, chunks; no Kafka), "
                      f"{time.strftime('%Y-%m-%d')}",
            "step_ms": full[0] * 1e3, "ms_per_sequence": full[1] * 1e3, "ms_per_context_token": full[2] * 1e3,
            "prefill_ms_per_token": full[3] * 1e3, "max_slots": slots, "max_tokens": slots * context,
            "slo_ms": {"0": 5000}, "counts": "computed"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", default="continuous,static")
    ap.add_argument("--gathered", action="store_true", help="also run decoding steps through the gather path")
    ap.add_argument("--curve", default=None, metavar="FILE",
                    help="write the in-place steps' fitted cost curve here (\"kind\": \"generation\")")
    args = ap.parse_args()
    session, shape = open_decoder("cpu")
    in_place = open_in_place(str(session.path), shape)  # type: ignore[attr-defined]
    if in_place is None:
        print("this ONNX Runtime has no CPU GroupQueryAttention: in-place rows are missing")
    pool = GenPool()
    modes = [("in place", in_place)] if in_place is not None else []
    if args.gathered:
        modes.append(("gathered", None))
    rows = []
    tps: dict[tuple[str, str], list[float]] = {}
    fitted: list[tuple[int, int, int, float]] = []
    drain("continuous", pool, 20, args.slots, session, shape, in_place)  # warm-up: first calls allocate
    for rep in range(args.repeat):
        for mode, ip in modes:
            for policy in args.policies.split(","):
                r, ck = drain(policy, pool, args.requests, args.slots, session, shape, ip)
                per = {k: v / r["steps"] * 1000 for k, v in ck.parts.items()}
                if ip is not None:
                    fitted += ck.steps
                tps.setdefault((mode, policy), []).append(r["tokens"] / r["wall"])
                rows.append([rep + 1, mode, policy, f"{r['tokens'] / r['wall']:,.0f}", r["steps"],
                             f"{r['tokens'] / r['steps']:.1f}", r["rows"], f"{per['runner'] + per['schedule'] + per['chunks']:.3f}",
                             f"{per.get('ort_decode', 0):.3f}", f"{per.get('ort_prefill', 0):.3f}",
                             f"{per['runner_own']:.3f}", f"{per['chunks']:.3f}", f"{per['schedule']:.3f}",
                             f"{r['cpu']:.2f}"])
    print(f"{args.requests} requests, {args.slots} KV slots, max_new_tokens log-uniform 8..200; ms per step")
    print(table(["run", "decode", "policy", "tokens/s", "steps", "tokens/step", "rows live/computed", "step", "ort_decode",
                 "ort_prefill", "runner_own", "chunks", "schedule", "cpu"], rows))
    for mode, _ in modes:
        c, s = tps.get((mode, "continuous")), tps.get((mode, "static"))
        if c and s:
            ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(c, s, strict=True))
            print(f"{mode}: continuous / static tokens/s per run = {ratios}")
    if args.curve and fitted:
        curve = fit_curve(fitted, args.slots, shape.context)
        Path(args.curve).write_text(json.dumps(curve, indent=2) + "\n")
        print(f"curve {args.curve}: t(step) = {curve['step_ms']:.3f} ms + {curve['ms_per_sequence']:.4f} ms/sequence"
              f" + {curve['ms_per_context_token']:.6f} ms/context token + {curve['prefill_ms_per_token']:.4f} ms/"
              f"prefill token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
