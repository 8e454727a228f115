"""The per-step cost of a decoder, and the generation curve file that holds it.

    t(step) = a + b·(sequences decoded) + c·(context tokens they attend) + p·(prompt
              tokens prefilled)

a is what every step pays whatever its size (on a GPU, reading the weights: why
batching decoding steps pays), b the per-sequence work, c the attention over each
sequence's KV cache, p the prefill per prompt token. A curve file is JSON with
"kind": "generation" (pipeline/curves/generation-assumed.json), read through the same
lookup as the batch curves (pipeline/simulate.py `read_curve_file`). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import UserError
from pipeline.generation.scheduler import Plan
from pipeline.simulate import read_curve_file


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

    def step_time(self, sequences: int, context_tokens: int, prefill_tokens: int = 0) -> float:
        return self.a + self.b * sequences + self.c * context_tokens + self.p * prefill_tokens

    def plan_time(self, plan: Plan) -> float:
        """What one scheduler plan costs: its decodes and prefill chunks in one step."""
        return self.step_time(len(plan.decode), plan.context_tokens, plan.prefill_tokens)

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
                "slo_ms": {str(k): v * 1e3 for k, v in self.slo.items()}}


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
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"generation curve {name!r}: bad or missing field ({exc})") from None
    if min(cost.a, cost.b, cost.c, cost.p) < 0 or cost.a + cost.b <= 0:
        raise UserError(f"generation curve {name!r}: costs must be >= 0, step_ms + ms_per_sequence > 0")
    if cost.max_slots < 1 or cost.max_tokens < 1 or not cost.slo:
        raise UserError(f"generation curve {name!r}: need max_slots >= 1, max_tokens >= 1 and an slo_ms entry")
    return cost


def load_step_cost(spec: str) -> StepCost:
    """A shipped generation curve by name, or a JSON file of "kind": "generation"."""
    name, data = read_curve_file(spec, "generation")
    return step_cost_from_dict(data, name)
