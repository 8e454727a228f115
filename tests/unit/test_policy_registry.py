"""The one policy registry (pipeline/batching/registry.py): the CLI's --policy choices,
the shell completion, the config check and the simulator all see exactly the registered
policies, and the parameters each policy gets from a configuration."""

from __future__ import annotations

import pytest

from pipeline import cli
from pipeline.batching.registry import POLICIES, POLICY_NAMES, make_policy, policy_params
from pipeline.commands.completion import script
from pipeline.completion.tree import command_tree
from pipeline.config import BatchingConfig, WorkerConfig
from pipeline.config.checks import validate
from pipeline.errors import UserError
from pipeline.simulate.arrivals import Arrival
from pipeline.simulate.curves import load_curve
from pipeline.simulate.engine import SimConfig, simulate
from pipeline.simulate.specs import DEFAULT_POLICIES, SIM_LABELS, policy_spec
from pipeline.simulate.workload import Workload

REGISTERED = set(POLICY_NAMES)
COMMANDS_WITH_POLICY = ("run", "demo")


def test_names_are_registered_once_in_order() -> None:
    assert POLICY_NAMES == ("none", "static", "greedy", "adaptive")
    assert len(set(POLICY_NAMES)) == len(POLICIES)


@pytest.mark.parametrize("command", COMMANDS_WITH_POLICY)
def test_cli_choices_and_completion_are_the_registry(command: str) -> None:
    tree = {c.key: c for c in command_tree(cli.build_parser())}
    (flag,) = [f for f in tree[command].flags if "--policy" in f.names]
    assert flag.choices == POLICY_NAMES  # what argparse accepts, read by the completion scripts
    assert f"'{command} --policy') echo '{' '.join(POLICY_NAMES)}' ;;" in script("bash")


def test_profile_checks_against_the_registry() -> None:
    args = cli.build_parser().parse_args(["profile", "ctr", "--policy", "fast"])
    with pytest.raises(UserError, match=f"use {', '.join(POLICY_NAMES)}$"):
        args.func(args)


def test_config_check_accepts_exactly_the_registry() -> None:
    for name in POLICY_NAMES:
        validate(WorkerConfig(batching=BatchingConfig(policy=name)))
    with pytest.raises(UserError, match=f"not one of {', '.join(POLICY_NAMES)}$"):
        validate(WorkerConfig(batching=BatchingConfig(policy="fast")))


def test_simulator_runs_every_registered_policy() -> None:
    curve = load_curve("ctr")
    workload = Workload("tiny", [Arrival(i * 1e-3, 20) for i in range(50)], 0.05)
    specs = [policy_spec(label, curve, tuned=(16, 0.002)) for label in DEFAULT_POLICIES]
    assert {s.policy for s in specs} == REGISTERED
    # every label but the pattern static:ROWS:DELAY_MS
    assert {policy_spec(label, curve, (16, 0.002)).policy for label in SIM_LABELS if label.islower()} == REGISTERED
    for spec in specs:
        assert simulate(workload, curve, spec, SimConfig()).produced == 50
    with pytest.raises(UserError, match=f"use {', '.join(DEFAULT_POLICIES)}, "):
        policy_spec("fast", curve)


def test_config_settings_become_each_policys_parameters() -> None:
    assert policy_params("none", max_batch_rows=64) == {}
    assert policy_params("static", max_batch_rows=64, max_queue_delay_ms=5.0) == {
        "max_batch_rows": 64, "max_queue_delay": 0.005}
    assert policy_params("greedy", max_batch_rows=64, hold_for_efficiency=True) == {"max_batch_rows": 64}
    assert policy_params("adaptive", max_batch_rows=64) == {"max_batch_rows": 64}
    assert policy_params("adaptive", max_batch_rows=64, hold_for_efficiency=False) == {
        "max_batch_rows": 64, "hold_for_efficiency": False}
    for name in POLICY_NAMES:
        assert make_policy(name, **policy_params(name, max_batch_rows=8)).name == name
    with pytest.raises(ValueError, match="unknown batching policy 'fast'; choose one of none, static"):
        policy_params("fast", max_batch_rows=8)
