"""The batching policies by name, each registered once in POLICIES: its class, how a
configuration's settings become its parameters, and the labels the simulator runs it
under. Everything that names policies reads this table: the worker and the Faust helper
(policy_params, make_policy), the CLI's --policy choices and with them the shell
completion, the config check (POLICY_NAMES), and the simulator (pipeline/simulate/specs.py).
A new policy is a class and one PolicyEntry here. Pure: no I/O, no imports above
pipeline/batching/."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.batching.policies import AdaptivePolicy, GreedyPolicy, NonePolicy, StaticPolicy
from pipeline.batching.policy_base import Policy


@dataclass(frozen=True)
class PolicySettings:
    """What a configuration says about its policy: the worker's `batching` section, the
    Faust helper's arguments. Each policy takes what applies to it."""

    max_batch_rows: int
    max_queue_delay_ms: float = 10.0  # static's linger
    hold_for_efficiency: bool | None = None  # adaptive's; None: the policy's default


@dataclass(frozen=True)
class SimInputs:
    """What the simulator knows when it turns a label into a policy: the curve's row cap
    and the static configuration its grid search chose (None before it ran)."""

    max_batch_rows: int
    tuned: tuple[int, float] | None = None  # (rows, linger s)


# make_policy's parameters and the Batcher's keyword arguments for one simulator label.
SimSpec = tuple[dict[str, Any], dict[str, Any]]


def _rows(s: PolicySettings) -> dict[str, Any]:
    return {"max_batch_rows": s.max_batch_rows}


def _plain(name: str, params: dict[str, Any] | None = None) -> Callable[[str, SimInputs], SimSpec | None]:
    """A policy the simulator runs under its own name only, with the curve's row cap
    (or `params`)."""

    def sim(label: str, inputs: SimInputs) -> SimSpec | None:
        if label != name:
            return None
        return (dict(params) if params is not None else {"max_batch_rows": inputs.max_batch_rows}), {}

    return sim


@dataclass(frozen=True)
class PolicyEntry:
    """One policy. params: a configuration's settings to make_policy's parameters
    (default: the row cap). sim: a simulator label to its SimSpec, None when the label is
    not this policy's, a one-line ValueError when it is but is malformed (default: the
    policy's own name, with the curve's row cap). sim_defaults: its labels in the
    simulator's default comparison (default: its name); sim_more: its other labels, as
    the simulator's help and errors show them."""

    name: str
    cls: type[Policy]
    params: Callable[[PolicySettings], dict[str, Any]] = _rows
    sim: Callable[[str, SimInputs], SimSpec | None] | None = None
    sim_defaults: tuple[str, ...] | None = None
    sim_more: tuple[str, ...] = ()

    def sim_spec(self, label: str, inputs: SimInputs) -> SimSpec | None:
        return (self.sim or _plain(self.name))(label, inputs)

    @property
    def default_labels(self) -> tuple[str, ...]:
        return (self.name,) if self.sim_defaults is None else self.sim_defaults

    @property
    def sim_labels(self) -> tuple[str, ...]:
        return (*self.default_labels, *self.sim_more)


def _static_params(s: PolicySettings) -> dict[str, Any]:
    return {"max_batch_rows": s.max_batch_rows, "max_queue_delay": s.max_queue_delay_ms / 1000.0}


def _adaptive_params(s: PolicySettings) -> dict[str, Any]:
    if s.hold_for_efficiency is None:
        return _rows(s)
    return {"max_batch_rows": s.max_batch_rows, "hold_for_efficiency": s.hold_for_efficiency}


STATIC_64 = (64, 0.010)  # static "as commonly deployed": 64 rows, 10 ms linger


def _static_sim(label: str, inputs: SimInputs) -> SimSpec | None:
    """static-64 · static-tuned (the grid search's pick) · static:ROWS:DELAY_MS."""
    if label == "static-64":
        rows, delay = STATIC_64
    elif label == "static-tuned":
        if inputs.tuned is None:
            raise ValueError("static-tuned needs the grid search (tune_static) first")
        rows, delay = inputs.tuned
    elif label.startswith("static:"):
        try:
            _, r, d = label.split(":")
            rows, delay = int(r), float(d) / 1e3
        except ValueError:
            raise ValueError(f"bad static policy {label!r}; use static:ROWS:DELAY_MS") from None
    else:
        return None
    return {"max_batch_rows": rows, "max_queue_delay": delay}, {}


def _adaptive_sim(label: str, inputs: SimInputs) -> SimSpec | None:
    """adaptive · adaptive-score (expiry score_late) · adaptive-hold (hold_for_efficiency)."""
    if not label.startswith("adaptive"):
        return None
    variants = set(label.split("-")[1:])
    if variants - {"score", "hold"}:
        raise ValueError(f"bad adaptive variant {label!r}; use adaptive, adaptive-score, adaptive-hold")
    params = {"max_batch_rows": inputs.max_batch_rows, "hold_for_efficiency": "hold" in variants}
    # Default expiry action in the simulator: route_late (an immediate late-topic
    # record); adaptive-score keeps them in the late lane and scores them later.
    action = "score_late" if "score" in variants else "route_late"
    return params, {"expiry_action": action}


# In this order in every list of policies (CLI choices, errors, the simulator's table).
POLICIES: tuple[PolicyEntry, ...] = (
    PolicyEntry("none", NonePolicy, params=lambda s: {}, sim=_plain("none", {})),
    PolicyEntry("static", StaticPolicy, params=_static_params, sim=_static_sim,
                sim_defaults=("static-64", "static-tuned"), sim_more=("static:ROWS:DELAY_MS",)),
    PolicyEntry("greedy", GreedyPolicy),
    PolicyEntry("adaptive", AdaptivePolicy, params=_adaptive_params, sim=_adaptive_sim,
                sim_more=("adaptive-score", "adaptive-hold")),
)
POLICY_NAMES = tuple(e.name for e in POLICIES)
_BY_NAME = {e.name: e for e in POLICIES}


def policy_entry(name: str) -> PolicyEntry:
    """The registered policy `name`; a one-line ValueError naming the others if none."""
    entry = _BY_NAME.get(name)
    if entry is None:
        raise ValueError(f"unknown batching policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
    return entry


def make_policy(name: str, **params: Any) -> Policy:
    """Build a policy by name; unknown names and parameters give one-line errors."""
    cls = policy_entry(name).cls
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"policy {name!r}: {exc}") from None


def policy_params(
    name: str,
    *,
    max_batch_rows: int,
    max_queue_delay_ms: float = 10.0,
    hold_for_efficiency: bool | None = None,
) -> dict[str, Any]:
    """make_policy's parameters for a policy named in a configuration: the row cap for
    every policy but "none", the linger for "static" only, and adaptive's
    hold_for_efficiency when one is given. One place for the worker and the Faust path."""
    return policy_entry(name).params(PolicySettings(max_batch_rows, max_queue_delay_ms, hold_for_efficiency))
