from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.errors import UserError


def test_defaults_without_file() -> None:
    cfg = load_config(environ={})
    assert cfg.pipeline == "ctr"
    assert cfg.batching.policy == "adaptive"
    assert cfg.slo_seconds(0) == pytest.approx(0.1)


def test_yaml_then_env_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text("bootstrap_servers: kafka:9092\nbatching:\n  policy: static\n  max_batch_rows: 64\n")
    env = {"TIDEBATCH_BATCHING__MAX_BATCH_ROWS": "128", "TIDEBATCH_BATCHING__PRIORITY_SLO_MS": "{1: 500}"}
    cfg = load_config(f, overrides={"batching": {"policy": "greedy"}}, environ=env)
    assert cfg.bootstrap_servers == "kafka:9092"
    assert cfg.batching.max_batch_rows == 128  # env beats file
    assert cfg.batching.policy == "greedy"  # flags beat env
    assert cfg.slo_seconds(1) == pytest.approx(0.5)
    assert cfg.slo_seconds(0) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batching": {"polcy": "static"}}, "config key 'batching.polcy' is not known; did you mean 'batching.policy'?"),
        ({"batching": {"policy": "fastest"}}, "config key 'batching.policy': 'fastest' is not one of"),
        ({"batching": {"max_batch_rows": "many"}}, "config key 'batching.max_batch_rows': expected int"),
        ({"batching": {"queue_low_rows": 50, "queue_high_rows": 10}}, "config key 'batching.queue_low_rows'"),
        ({"batching": {"expiry_action": "drop"}}, "config key 'batching.expiry_action'"),
        ({"batching": {"shed_reserve": 1}}, "config key 'batching.shed_reserve': must be within [0, 1)"),
        ({"runtime": {"executors": 0}}, "config key 'runtime.executors'"),
        ({"runtime": {"gc_gen0_threshold": -1}}, "config key 'runtime.gc_gen0_threshold'"),
        ({"runtime": {"gil_switch_interval_ms": 0}}, "config key 'runtime.gil_switch_interval_ms'"),
        ({"runtime": {"model_process": "maybe"}}, "config key 'runtime.model_process': expected true or false"),
        ({"client": "kafkajs"}, "config key 'client'"),
        ({"metrics": {"enabled": "yes please"}}, "config key 'metrics.enabled': expected true or false"),
    ],
)
def test_errors_name_the_key(overrides: dict, message: str) -> None:
    with pytest.raises(UserError) as exc:
        load_config(overrides=overrides, environ={})
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_env_error_names_the_key() -> None:
    with pytest.raises(UserError, match="config key 'batching.slo_ms': expected a number, got 'fast'"):
        load_config(environ={"TIDEBATCH_BATCHING__SLO_MS": "fast"})


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "nope.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("batching: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(bad, environ={})


def test_faust_example_settings_are_not_worker_keys() -> None:
    cfg = load_config(environ={"TIDEBATCH_FAUST_BROKER": "kafka://x:9092", "TIDEBATCH_BATCHING__POLICY": "greedy"})
    assert cfg.batching.policy == "greedy"


def test_the_test_suite_s_settings_are_not_worker_keys() -> None:
    """Regression: TIDEBATCH_TEST_BROKER=embedded (the suite on Tansu) made every
    worker subprocess exit with "config key 'test_broker' is not known"."""
    cfg = load_config(environ={"TIDEBATCH_TEST_BROKER": "embedded", "TIDEBATCH_BATCHING__POLICY": "greedy"})
    assert cfg.batching.policy == "greedy"


def test_batch_cap_defaults_to_the_pipeline_and_config_wins() -> None:
    from pipeline.app.compose import batching_params
    from pipeline.registry.pipelines import get_pipeline

    camera = get_pipeline("camera").max_batch_rows
    assert camera < get_pipeline("ctr").max_batch_rows
    assert batching_params(load_config(environ={}), camera)["max_batch_rows"] == camera
    explicit = load_config(overrides={"batching": {"max_batch_rows": 64}}, environ={})
    assert batching_params(explicit, camera)["max_batch_rows"] == 64


# ----------------------------------------------------------------------------- rebalancing
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"group_protocol": "eager"}, "config key 'group_protocol': 'eager' is not one of classic, consumer"),
        ({"group_protocol": "consumer", "broker_profile": "embedded"}, "config key 'group_protocol': the embedded broker"),
        ({"group_protocol": "consumer", "client": "kafka-python"}, "config key 'group_protocol': kafka-python has no"),
        ({"group_remote_assignor": "uniform"}, "config key 'group_remote_assignor': only applies with group_protocol consumer"),
        ({"group_protocol": "consumer", "group_remote_assignor": "sticky"}, "config key 'group_remote_assignor': 'sticky'"),
        ({"group_protocol": "consumer", "session_timeout_ms": 6000}, "config key 'session_timeout_ms': with group_protocol"),
        ({"session_timeout_ms": 0}, "config key 'session_timeout_ms': must be >= 1"),
        ({"group_instance_id": ""}, "config key 'group_instance_id': must be 1..249 characters"),
    ],
)
def test_group_keys_are_checked(overrides: dict, message: str) -> None:
    with pytest.raises(UserError) as exc:
        load_config(overrides=overrides, environ={})
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_group_instance_id_from_its_key_or_a_named_variable() -> None:
    assert load_config(environ={}).instance_id({}) is None  # dynamic membership
    cfg = load_config(environ={"TIDEBATCH_GROUP_INSTANCE_ID": "worker-3"})
    assert cfg.instance_id({"POD_NAME": "ignored"}) == "worker-3"
    cfg = load_config(environ={"TIDEBATCH_GROUP_INSTANCE_ID_ENV": "POD_NAME"})
    assert cfg.instance_id({"POD_NAME": "tidebatch-worker-7c9d-x2"}) == "tidebatch-worker-7c9d-x2"
    with pytest.raises(UserError, match=r"config key 'group_instance_id_env': \$POD_NAME is not set or empty"):
        cfg.instance_id({"HOSTNAME": "h"})


def test_group_keys_become_client_settings() -> None:
    from pipeline.kafka_backend import group_overrides

    cfg = load_config(overrides={"group_instance_id": "w0", "session_timeout_ms": 12000}, environ={})
    assert group_overrides(cfg, "confluent") == {
        "group.instance.id": "w0", "session.timeout.ms": 12000, "heartbeat.interval.ms": 2000,
    }
    assert group_overrides(cfg, "kafka-python") == {
        "group_instance_id": "w0", "session_timeout_ms": 12000, "heartbeat_interval_ms": 2000,
    }
    cfg = load_config(overrides={"group_protocol": "consumer", "group_remote_assignor": "range"}, environ={})
    assert group_overrides(cfg, "confluent") == {"group.protocol": "consumer", "group.remote.assignor": "range"}
    assert group_overrides(load_config(environ={}), "confluent") == {}  # the profile's defaults stay


def test_run_flags_set_the_group_keys() -> None:
    import argparse

    from pipeline.commands import run

    parser = argparse.ArgumentParser()
    run.add_parser(parser.add_subparsers())
    args = parser.parse_args(["run", "--group-protocol", "consumer", "--group-instance-id", "pod-1"])
    cfg = load_config(overrides=run.flag_overrides(args), environ={})
    assert (cfg.group_protocol, cfg.group_instance_id) == ("consumer", "pod-1")
