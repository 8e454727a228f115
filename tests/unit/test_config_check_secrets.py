"""`tidebatch config check FILE` resolves the secret references `run` resolves (issue
44: it said "valid" for a `${KAFKA_PASSWORD}` that was not set, or an `@file:` path
that did not exist, and `run` then exited 2 on the same file): the same one line,
naming the key and the variable or path, never a value; exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.errors import UserError

VAR = "TB_CHECK_TEST_SECRET"
SECRET = "s3cr3t-value-never-shown"


def _check(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    code = main(["config", "check", str(path), *flags])
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).strip()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "worker.yaml"
    path.write_text(text)
    return path


KAFKA_ENV = f"kafka:\n  common:\n    sasl.username: tb\n    sasl.password: ${{{VAR}}}\n"
KAFKA_FILE = "kafka:\n  consumer:\n    ssl.key.password: '@file:{path}'\n"


def test_an_unset_kafka_variable_is_runs_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VAR, raising=False)
    path = _write(tmp_path, KAFKA_ENV)
    code, shown = _check(path, capsys)
    assert code == 2, shown
    assert shown == f"tidebatch: error: Kafka setting sasl.password: environment variable {VAR} is not set"
    with pytest.raises(UserError) as run_says:  # what `run` resolves before it connects (pipeline/app/serve.py)
        load_config(path).kafka.client("admin")
    assert shown == f"tidebatch: error: {run_says.value}"


def test_a_missing_file_reference_in_one_clients_block_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "key-password"
    code, shown = _check(_write(tmp_path, KAFKA_FILE.format(path=missing)), capsys)
    assert code == 2, shown
    assert shown.startswith(f"tidebatch: error: Kafka setting ssl.key.password: cannot read {missing}"), shown


def test_resolved_references_are_valid_and_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VAR, SECRET)
    secret_file = tmp_path / "key-password"
    secret_file.write_text(SECRET + "\n")
    code, shown = _check(_write(tmp_path, KAFKA_ENV + f"  consumer:\n    ssl.key.password: '@file:{secret_file}'\n"), capsys)
    assert code == 0, shown
    assert "valid" in shown and SECRET not in shown


def test_metrics_auth_and_redis_references_are_resolved_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VAR, raising=False)
    metrics = _write(tmp_path, f"metrics:\n  auth:\n    username: ops\n    password: ${{{VAR}}}\n")
    code, shown = _check(metrics, capsys)
    assert (code, shown) == (2, f"tidebatch: error: config key metrics.auth.password: environment variable {VAR} is not set")

    redis = _write(tmp_path, f"redis:\n  password: ${{{VAR}}}\n  dedup:\n    enabled: true\n")
    code, shown = _check(redis, capsys)
    assert (code, shown) == (2, f"tidebatch: error: config key redis.password: environment variable {VAR} is not set")

    # Redis off: `run` never connects, so never resolves its password; neither does check.
    code, shown = _check(_write(tmp_path, f"redis:\n  password: ${{{VAR}}}\n"), capsys)
    assert code == 0, shown


def test_no_env_says_the_references_were_not_resolved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VAR, raising=False)
    code, shown = _check(_write(tmp_path, KAFKA_ENV), capsys, "--no-env")
    assert code == 0, shown
    assert "secret references not resolved (--no-env)" in shown
