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
    with pytest.raises(UserError, match="config key 'batching.slo_ms': expected float"):
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


def test_batch_cap_defaults_to_the_pipeline_and_config_wins() -> None:
    from pipeline.pipelines import get_pipeline
    from pipeline.worker import _policy_params

    camera = get_pipeline("camera").max_batch_rows
    assert camera < get_pipeline("ctr").max_batch_rows
    assert _policy_params(load_config(environ={}), camera)["max_batch_rows"] == camera
    explicit = load_config(overrides={"batching": {"max_batch_rows": 64}}, environ={})
    assert _policy_params(explicit, camera)["max_batch_rows"] == 64
