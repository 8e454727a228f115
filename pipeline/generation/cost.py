"""The per-step cost of a decoder, and the generation curve file that holds it.

    t(step) = a + b·(sequences decoded) + c·(context tokens they attend) + p·(prompt
              tokens prefilled)

a is what every step pays whatever its size (on a GPU, reading the weights: why
batching decoding steps pays), b the per-sequence work, c the attention over each
sequence's KV cache, p the prefill per prompt token.

What a step is charged for (the curve file's "counts"): "live", the sequences decoded
and the prompt tokens prefilled; or "computed", what the runner's ORT calls compute
(pipeline/generation/runner.py): the in-place decoding call runs every slot in the range
it binds, from the lowest decoded slot to the highest, a finished sequence's slot inside
it too (pipeline/generation/slot_decoder.py), and one prefill call pads every prompt
chunk to the longest. On the bench's workload a static batch computes 9.7 rows a step
for 5.2 live ones and pads its prompts to 1.6× their tokens; continuous 15.5 for 15.0,
1.08× (docs/GENERATION.md, "The simulator against the pipeline"). `tidebatch profile
generate` writes "computed" for the in-place decoder. A curve file is JSON with
"kind": "generation" (pipeline/curves/generation-assumed.json), read through the same
lookup as the batch curves (pipeline/simulate/curves.py `read_curve_file`). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import UserError
from pipeline.generation.scheduler import Plan
from pipeline.simulate.curves import read_curve_file


@dataclass(frozen=True)
class StepCost:
    name: str
    a: float  # seconds per step
    b: float  # seconds per decoded sequence
    c: float  # seconds per context token attended
    p: float  # seconds per prompt token prefilled
    max_slots: int  # the KV budget the curve was measured (or assumed) with
    max_tokens: int
    slo: dict[int, float]  # priority -> admission deadline budget, seconds
    source: str = ""
    assumed: bool = False
    counts: str = "live"  # or "computed" (plan_counts)

    def step_time(self, sequences: int, context_tokens: int, prefill_tokens: int = 0) -> float:
        return self.a + self.b * sequences + self.c * context_tokens + self.p * prefill_tokens

    def plan_time(self, plan: Plan) -> float:
        """What one scheduler plan costs: its decodes and prefill chunks in one step."""
        return self.step_time(*plan_counts(plan, self.counts))

    def budget(self, priority: int) -> float:
        """Deadline budget of a priority level; an undeclared level gets the loosest."""
        return self.slo.get(priority, self.slo[max(self.slo)])

    def capacity_req_s(self, mean_prompt: float, mean_output: float, max_new_tokens: int) -> float:
        """Requests/s with every slot busy decoding: each request takes mean_output - 1
        decoding steps' share of a full step (its first token comes from prefill) plus
        its prefill. Slots are as many as the KV budget holds: max_slots, or fewer when
        the reservations (prompt + max_new_tokens, pipeline/generation/budget.py) fill
        max_tokens first. The load of the simulator's workload is relative to this."""
        s = max(1, min(self.max_slots, int(self.max_tokens // (mean_prompt + max_new_tokens))))
        full = self.step_time(s, round(s * (mean_prompt + mean_output / 2)))
        return 1.0 / (max(mean_output - 1, 0.0) * full / s + self.p * mean_prompt)

    def to_dict(self) -> dict:
        return {"kind": "generation", "name": self.name, "source": self.source, "assumed": self.assumed,
                "step_ms": self.a * 1e3, "ms_per_sequence": self.b * 1e3,
                "ms_per_context_token": self.c * 1e3, "prefill_ms_per_token": self.p * 1e3,
                "max_slots": self.max_slots, "max_tokens": self.max_tokens,
                "slo_ms": {str(k): v * 1e3 for k, v in self.slo.items()}, "counts": self.counts}


COUNTS = ("live", "computed")


def plan_counts(plan: Plan, counts: str = "live") -> tuple[int, int, int]:
    """(rows, context tokens, prefill tokens) a step is charged for: live, or as the
    runner computes them (the module's docstring)."""
    if counts == "live":
        return len(plan.decode), plan.context_tokens, plan.prefill_tokens
    slots = [s.slot for s in plan.decode]
    rows = max(slots) - min(slots) + 1 if slots else 0
    prefill = len(plan.prefill) * max(c.tokens for c in plan.prefill) if plan.prefill else 0
    return rows, plan.context_tokens, prefill


def step_cost_from_dict(d: dict, name: str = "curve") -> StepCost:
    try:
        cost = StepCost(
            name=str(d.get("name", name)),
            a=float(d["step_ms"]) / 1e3,
            b=float(d["ms_per_sequence"]) / 1e3,
            c=float(d.get("ms_per_context_token", 0.0)) / 1e3,
            p=float(d["prefill_ms_per_token"]) / 1e3,
            max_slots=int(d["max_slots"]),
            max_tokens=int(d["max_tokens"]),
            slo={int(k): float(v) / 1e3 for k, v in d.get("slo_ms", {"0": 10000}).items()},
            source=str(d.get("source", "")),
            assumed=bool(d.get("assumed", False)),
            counts=str(d.get("counts", "live")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"generation curve {name!r}: bad or missing field ({exc})") from None
    if min(cost.a, cost.b, cost.c, cost.p) < 0 or cost.a + cost.b <= 0:
        raise UserError(f"generation curve {name!r}: costs must be >= 0, step_ms + ms_per_sequence > 0")
    if cost.counts not in COUNTS:
        raise UserError(f"generation curve {name!r}: counts must be one of {', '.join(COUNTS)}, not {cost.counts!r}")
    if cost.max_slots < 1 or cost.max_tokens < 1 or not cost.slo:
        raise UserError(f"generation curve {name!r}: need max_slots >= 1, max_tokens >= 1 and an slo_ms entry")
    return cost


def load_step_cost(spec: str) -> StepCost:
    """A shipped generation curve by name, or a JSON file of "kind": "generation"."""
    name, data = read_curve_file(spec, "generation")
    return step_cost_from_dict(data, name)
