"""The policies the simulator runs, by label: each registered policy's labels
(pipeline/batching/registry.py) turned into the parameters of one run, so the simulator
knows exactly the policies the worker does. none · static-64 · static-tuned ·
static:ROWS:DELAY_MS · greedy · adaptive · adaptive-score · adaptive-hold."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.batching.registry import POLICIES, SimInputs
from pipeline.errors import UserError
from pipeline.simulate.curves import Curve


@dataclass(frozen=True)
class PolicySpec:
    """A named policy configuration as the simulator runs it."""

    label: str
    policy: str
    params: dict
    batcher: dict

    def describe(self) -> str:
        shown = {**self.params, **self.batcher}
        if "max_queue_delay" in shown:
            shown["max_queue_delay_ms"] = round(shown.pop("max_queue_delay") * 1e3, 3)
        return ", ".join(f"{k}={v}" for k, v in shown.items())


# The default comparison, and every label the simulator takes, in the registry's order.
DEFAULT_POLICIES = tuple(label for e in POLICIES for label in e.default_labels)
SIM_LABELS = tuple(label for e in POLICIES for label in e.sim_labels)


def policy_spec(label: str, curve: Curve, tuned: tuple[int, float] | None = None) -> PolicySpec:
    """The run of the registered policy that takes `label`; tuned: static-tuned's
    (rows, linger s) from the grid search (pipeline/simulate/tuning.py)."""
    inputs = SimInputs(curve.max_batch_rows, tuned)
    for entry in POLICIES:
        try:
            found = entry.sim_spec(label, inputs)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if found is not None:
            params, batcher = found
            return PolicySpec(label, entry.name, params, batcher)
    more = [label for e in POLICIES for label in e.sim_more]
    raise UserError(f"unknown policy {label!r}; use {', '.join([*DEFAULT_POLICIES, *more])}")
