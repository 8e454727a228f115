"""Environment variables are read by the type their key declares (pipeline/config/env.py),
and one that names no key is a warning, not a stopped worker (issue 21's findings)."""

from __future__ import annotations

import logging

import pytest

from pipeline.config import load_config
from pipeline.errors import UserError


@pytest.mark.parametrize(
    ("name", "raw", "read"),
    [
        # Each of these was parsed as YAML 1.1 before: "expected str, got 83", False, 511.
        ("TIDEBATCH_GROUP_ID", "0123", lambda c: c.group_id),
        ("TIDEBATCH_INPUT_TOPIC", "no", lambda c: c.input_topic),
        ("TIDEBATCH_REDIS__PASSWORD", "0777", lambda c: c.redis.password),
        ("TIDEBATCH_KAFKA__COMMON__SASL_PASSWORD", "a #b", lambda c: c.kafka.common["sasl.password"]),
        ("TIDEBATCH_KAFKA__COMMON__SASL_PASSWORD", "x: y", lambda c: c.kafka.common["sasl.password"]),
        ("TIDEBATCH_KAFKA__COMMON__SASL_PASSWORD", "1e3", lambda c: c.kafka.common["sasl.password"]),
        ("TIDEBATCH_GROUP_INSTANCE_ID", "null", lambda c: c.group_instance_id),
    ],
)
def test_a_string_key_keeps_the_text_it_was_given(name: str, raw: str, read) -> None:
    assert read(load_config(environ={name: raw})) == raw


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("TRUE", True), ("yes", True), ("1", True),
                                              ("false", False), ("no", False), ("off", False), ("0", False)])
def test_booleans_take_the_usual_spellings(raw: str, value: bool) -> None:
    assert load_config(environ={"TIDEBATCH_CREATE_TOPICS": raw}).create_topics is value


def test_numbers_optionals_and_mappings_are_read_as_declared() -> None:
    cfg = load_config(environ={
        "TIDEBATCH_METRICS__PORT": " 9401 ",
        "TIDEBATCH_BATCHING__SLO_MS": "75",
        "TIDEBATCH_GROUP_INSTANCE_ID": "",
        "TIDEBATCH_BATCHING__PRIORITY_SLO_MS": "{0: 50, 1: 200}",
        "TIDEBATCH_KAFKA__CONSUMER__FETCH_WAIT_MAX_MS": "5",  # free-form librdkafka value: YAML
    })
    assert cfg.metrics.port == 9401 and cfg.batching.slo_ms == 75.0
    assert cfg.group_instance_id is None
    assert cfg.batching.priority_slo_ms == {0: 50.0, 1: 200.0}
    assert cfg.kafka.consumer["fetch.wait.max.ms"] == 5


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("TIDEBATCH_METRICS__PORT", "9400x", "config key 'metrics.port': expected an integer, got '9400x'"),
        ("TIDEBATCH_CREATE_TOPICS", "maybe", "config key 'create_topics': expected true or false, got 'maybe'"),
        ("TIDEBATCH_BATCHING__SLO_MS", "fast", "config key 'batching.slo_ms': expected a number, got 'fast'"),
    ],
)
def test_a_value_that_is_not_its_type_is_one_line_naming_the_key(name: str, raw: str, says: str) -> None:
    with pytest.raises(UserError) as err:
        load_config(environ={name: raw})
    assert str(err.value) == says


def test_a_variable_that_names_no_key_is_a_warning_with_the_closest_key(caplog: pytest.LogCaptureFixture) -> None:
    environ = {
        # What a Kubernetes Service named "tidebatch-worker" injects into every pod.
        "TIDEBATCH_WORKER_PORT": "tcp://10.0.0.7:9400",
        "TIDEBATCH_BATCHING__POLICI": "static",
        "TIDEBATCH_BATCHING": "static",  # a section, not a key
        "TIDEBATCH_BATCHING__POLICY__X": "1",  # below a key
        "TIDEBATCH_GROUP_ID": "g",
    }
    with caplog.at_level(logging.WARNING, logger="pipeline.config.env"):
        cfg = load_config(environ=environ)
    assert cfg.group_id == "g" and cfg.batching.policy != "static"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines
    assert any("TIDEBATCH_BATCHING__POLICI" in line and "did you mean TIDEBATCH_BATCHING__POLICY?" in line
               for line in lines), lines
    assert any(line.startswith("ignoring environment variable TIDEBATCH_WORKER_PORT") for line in lines)
    assert any("TIDEBATCH_BATCHING:" in line and "section" in line for line in lines), lines
    assert "tcp://10.0.0.7" not in " ".join(lines)  # a value is never echoed: it may be a secret


def test_log_level_and_format_are_config_keys() -> None:
    # Before: TIDEBATCH_LOG_LEVEL stopped the worker ("config key 'log_level' is not known").
    cfg = load_config(environ={"TIDEBATCH_LOG_LEVEL": "debug", "TIDEBATCH_LOG_FORMAT": "json"})
    assert (cfg.log_level, cfg.log_format) == ("debug", "json")
    with pytest.raises(UserError, match="config key 'log_level': 'LOUD' is not one of DEBUG, INFO"):
        load_config(environ={"TIDEBATCH_LOG_LEVEL": "loud"})
