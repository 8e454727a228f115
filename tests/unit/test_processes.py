"""`run --processes N`'s pure decisions (pipeline/app/processes.py): the auto rule, the
restart policy on a fake clock, each child's config and transactional.id, the host's
exit status; and the config key and flag that choose N."""

from __future__ import annotations

import argparse

import pytest

from pipeline.app.processes import (
    AUTO_MAX,
    RestartPolicy,
    auto_processes,
    cap_by_partitions,
    child_config,
    describe_exit,
    host_exit_code,
)
from pipeline.commands.run import processes_arg
from pipeline.config import load_config
from pipeline.errors import UserError


def test_auto_is_one_process_below_four_cores() -> None:
    n, why = auto_processes("auto", 2, "auto")
    assert n == 1 and "2 usable cores < 4" in why
    assert auto_processes("auto", 3, "cuda")[0] == 1


def test_auto_on_cpu_counts_the_ort_threads_and_is_capped() -> None:
    assert auto_processes("auto", 4, "cpu")[0] == 2
    assert auto_processes("auto", 8, "cpu", intra_op_threads=3)[0] == 2
    assert auto_processes("auto", 64, "cpu")[0] == AUTO_MAX


def test_auto_on_a_gpu_needs_two_cores_a_process() -> None:
    n, why = auto_processes("auto", 16, "cuda", intra_op_threads=4)
    assert n == 8 and "GPU" in why
    assert auto_processes("auto", 6, "CUDAExecutionProvider")[0] == 3


def test_auto_never_runs_more_processes_than_input_partitions() -> None:
    assert cap_by_partitions(8, "auto", 3) == (3, "auto; 3 input partitions")
    assert cap_by_partitions(2, "auto", 3) == (2, "auto")
    assert cap_by_partitions(4, "auto", None) == (4, "auto")


def test_a_number_is_taken_as_it_is() -> None:
    assert auto_processes(3, 2, "cpu") == (3, "runtime.processes 3")


def test_restart_policy_allows_n_restarts_within_the_window() -> None:
    policy = RestartPolicy(3, 600.0)
    assert [policy.decide(t, -9)[0] for t in (0.0, 10.0, 20.0)] == [True, True, True]
    again, why = policy.decide(30.0, 1)
    assert not again and "3 restarts within 600 s" in why
    # The first restart leaves the window: one more is allowed.
    assert policy.decide(601.0, -9)[0]
    assert not policy.decide(602.0, -9)[0]


def test_restart_policy_never_restarts_a_configuration_error() -> None:
    again, why = RestartPolicy(3, 600.0).decide(0.0, 2)
    assert not again and "exit 2" in why


def test_restart_policy_zero_stops_at_the_first_death() -> None:
    assert not RestartPolicy(0, 600.0).decide(0.0, -9)[0]


def test_exit_status_of_the_host_is_the_worst_childs() -> None:
    assert host_exit_code([0, 0]) == 0
    assert host_exit_code([0, -9]) == 1
    assert host_exit_code([1, 2, 0]) == 2
    assert describe_exit(-9) == "signal SIGKILL" and describe_exit(3) == "exit 3"


def _cfg(**extra: object):
    return load_config(overrides={"broker_profile": "kafka", **extra}, environ={})


def test_each_child_has_its_own_transactional_id_stable_per_index() -> None:
    cfg = _cfg(delivery="exactly_once", group_id="g")
    ids = [child_config(cfg, i, "h1").transactional_id for i in range(3)]
    assert ids == ["tidebatch.g.h1.p0", "tidebatch.g.h1.p1", "tidebatch.g.h1.p2"]
    # A restarted child (same index, same host) gets the id of its dead predecessor.
    assert child_config(cfg, 1, "h1").transactional_id == ids[1]


def test_transactional_id_from_the_config_or_the_static_member() -> None:
    assert child_config(_cfg(delivery="exactly_once", transactional_id="tx"), 1, "h").transactional_id == "tx.p1"
    child = child_config(_cfg(delivery="exactly_once", group_id="g", group_instance_id="pod-3"), 0, "h")
    assert child.transactional_id == "tidebatch.g.pod-3.p0"
    assert child.group_instance_id == "pod-3-p0"  # two members with one instance id would fence each other


def test_group_instance_id_from_the_environment_is_made_per_child() -> None:
    cfg = load_config(overrides={"group_instance_id_env": "POD"}, environ={})
    import os

    os.environ["POD"] = "pod-7"
    try:
        child = child_config(cfg, 2, "h")
    finally:
        del os.environ["POD"]
    assert child.group_instance_id == "pod-7-p2" and child.group_instance_id_env is None


def test_child_config_is_one_process_on_a_guarded_loopback_port() -> None:
    cfg = _cfg(metrics={"host": "0.0.0.0", "port": 9400, "auth": {"bearer_token": "secret"}}, runtime={"processes": 4})
    child = child_config(cfg, 1, "h")
    assert child.runtime.processes == 1
    assert (child.metrics.host, child.metrics.port) == ("127.0.0.1", 0)
    assert child.metrics.auth.bearer_token == "${TIDEBATCH_CHILD_OPS_TOKEN}" and child.metrics.auth.protect_metrics
    assert not child.metrics.tls.enabled
    assert child.create_topics is False and child.transactional_id is None  # at_least_once: no id
    assert child_config(_cfg(metrics={"enabled": False}), 0, "h").metrics.enabled is False


@pytest.mark.parametrize("value, expected", [("2", 2), ("auto", "auto"), ("1", 1)])
def test_processes_from_env_and_yaml(value: str, expected: object) -> None:
    assert load_config(environ={"TIDEBATCH_RUNTIME__PROCESSES": value}).runtime.processes == expected
    yaml_value = int(value) if value.isdigit() else value
    assert load_config(overrides={"runtime": {"processes": yaml_value}}, environ={}).runtime.processes == expected


@pytest.mark.parametrize("value", ["0", "many", "-1"])
def test_bad_processes_is_one_line_naming_the_key(value: str) -> None:
    with pytest.raises(UserError, match="runtime.processes"):
        load_config(environ={"TIDEBATCH_RUNTIME__PROCESSES": value})


def test_bad_restart_policy_names_its_key() -> None:
    with pytest.raises(UserError, match="runtime.child_restarts"):
        load_config(overrides={"runtime": {"child_restarts": -1}}, environ={})
    with pytest.raises(UserError, match="runtime.child_restart_window_s"):
        load_config(overrides={"runtime": {"child_restart_window_s": 0}}, environ={})


def test_processes_flag() -> None:
    assert processes_arg("auto") == "auto" and processes_arg("3") == 3
    for bad in ("0", "x", "-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            processes_arg(bad)


def test_child_environment_variables_are_not_warned_about() -> None:
    warnings: list[str] = []
    from pipeline.config.env import env_overrides
    from pipeline.config.sections import WorkerConfig

    env_overrides({"TIDEBATCH_CHILD_INDEX": "1", "TIDEBATCH_MODEL_HOST": "/x"}, WorkerConfig, warnings.append)
    assert warnings == []


def test_processes_of_another_type_names_both_it_may_be() -> None:
    with pytest.raises(UserError, match=r"runtime.processes': expected int or str, got a value of type float"):
        load_config(overrides={"runtime": {"processes": 2.5}}, environ={})


def test_the_children_share_a_model_host_on_a_gpu_or_when_told() -> None:
    from pipeline.app.processes import shares_model_host

    assert shares_model_host("auto", "cuda")[0] is True
    assert shares_model_host("auto", "auto")[0] is False  # auto providers: the CPU rule (each its own)
    assert shares_model_host("auto", "cpu") == (False, "auto: providers cpu (not a GPU provider): each process its own model")
    assert shares_model_host(True, "cpu") == (True, "runtime.shared_model_host true")
    assert shares_model_host(False, "cuda")[0] is False


def test_the_model_hosts_counters_on_the_parents_port() -> None:
    from pipeline.ops.host_http import model_host_metrics

    assert model_host_metrics("ctr", None) == ""
    text = model_host_metrics("ctr", lambda: {"calls": 3, "requests": 7, "rows": 200, "joined_calls": 2})
    assert 'tidebatch_model_host_up{pipeline="ctr"} 1.0' in text
    assert 'tidebatch_model_host_requests_total{pipeline="ctr"} 7.0' in text
    assert 'tidebatch_model_host_one_by_one_reruns_total{pipeline="ctr"} 0.0' in text

    def down() -> dict:
        raise ConnectionRefusedError("restarting")

    assert model_host_metrics("ctr", down) == (
        "# HELP tidebatch_model_host_up Whether the shared model host answered this scrape.\n"
        "# TYPE tidebatch_model_host_up gauge\n"
        'tidebatch_model_host_up{pipeline="ctr"} 0.0\n'
    )


def test_shared_model_host_keys_refuse_what_they_cannot_use() -> None:
    from pipeline.config import load_config

    with pytest.raises(UserError, match=r"runtime.shared_model_host.*'maybe' is not one of auto, true, false"):
        load_config(None, {"runtime": {"shared_model_host": "maybe"}})
    with pytest.raises(UserError, match=r"runtime.shared_model_host_max_rows.*must be >= 1"):
        load_config(None, {"runtime": {"shared_model_host_max_rows": 0}})


def test_each_child_enforces_its_share_of_the_hosts_tenant_rows_per_s() -> None:
    # Without the split a host of N children admitted N times a tenant's ceiling.
    cfg = load_config(overrides={"broker_profile": "kafka", "tenants": {
        "capacity_rows_per_s": 9000, "classes": {
            "gold": {"share": 0.5, "ceiling_rows_per_s": 6000, "members": ["a"]},
            "free": {"share": 0.1, "members": ["b"]},
        }}}, environ={})
    child = child_config(cfg, 1, "h", count=3)
    assert child.tenants.capacity_rows_per_s == 3000
    assert child.tenants.classes["gold"].ceiling_rows_per_s == 2000
    assert child.tenants.classes["gold"].share == 0.5
    assert child.tenants.classes["free"].ceiling_rows_per_s is None
    assert child_config(cfg, 0, "h").tenants == cfg.tenants  # one child: the host's own


def test_a_child_knows_how_many_children_the_host_runs() -> None:
    from pipeline.app.children import ChildSeat

    seat = ChildSeat.from_env({"TIDEBATCH_CHILD_INDEX": "1", "TIDEBATCH_CHILD_COUNT": "4"})
    assert seat is not None and (seat.index, seat.count) == (1, 4)
    assert ChildSeat.from_env({}) is None
