"""Where the tests' schema registry comes from (tests/integration/apicurio_dist.py) and
the command line it starts with (tests/integration/schema_registry.py): no Maven, no JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import apicurio_dist
from tests.integration.apicurio_dist import RegistryDistError, ensure_dist, runner_jar
from tests.integration.schema_registry import SchemaRegistry


def test_runner_jar_of_both_layouts(tmp_path: Path) -> None:
    legacy = tmp_path / "2x"  # 2.x: legacy-jar, lib/ beside the runner
    legacy.mkdir()
    (legacy / "apicurio-registry-app-2.6.13.Final-runner.jar").touch()
    assert runner_jar(legacy).name == "apicurio-registry-app-2.6.13.Final-runner.jar"
    fast = tmp_path / "3x"  # 3.x: fast-jar
    fast.mkdir()
    (fast / "quarkus-run.jar").touch()
    assert runner_jar(fast).name == "quarkus-run.jar"
    with pytest.raises(RegistryDistError, match="no quarkus-run.jar"):
        runner_jar(tmp_path)


def test_complete_dist_is_used_without_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dist").mkdir()
    (tmp_path / ".complete").write_text("apicurio-registry-app x\n")
    monkeypatch.setenv("PATH", "/nonexistent")  # mvn would not even be found
    assert ensure_dist("x", tmp_path) == tmp_path / "dist"


def test_no_maven_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RegistryDistError, match="mvn not found") as info:
        ensure_dist("x", tmp_path)
    assert "\n" not in str(info.value)


def test_home_and_version_follow_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(apicurio_dist.VERSION_ENV, raising=False)
    monkeypatch.delenv(apicurio_dist.HOME_ENV, raising=False)
    assert apicurio_dist.pinned_version() == apicurio_dist.APICURIO_VERSION
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert apicurio_dist.apicurio_home("9.9") == tmp_path / "cache" / "tidebatch" / "apicurio-9.9"
    monkeypatch.setenv(apicurio_dist.HOME_ENV, str(tmp_path))
    monkeypatch.setenv(apicurio_dist.VERSION_ENV, "3.3.3")
    assert (apicurio_dist.apicurio_home("3.3.3"), apicurio_dist.pinned_version()) == (tmp_path, "3.3.3")


def test_command_binds_loopback_and_uses_the_class_data_archive(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "quarkus-run.jar").touch()
    registry = SchemaRegistry(tmp_path / "work", port=18081, version="x", java="/opt/java")
    cds = tmp_path / "app-cds.jsa"
    cmd = registry.command(dist, cds)
    assert cmd[0] == "/opt/java" and cmd[-2:] == ["-jar", str(dist / "quarkus-run.jar")]
    assert {"-Dquarkus.http.host=127.0.0.1", "-Dquarkus.http.port=18081",
            "-Dquarkus.management.host=127.0.0.1", f"-XX:SharedArchiveFile={cds}"} <= set(cmd)
    assert f"-XX:ArchiveClassesAtExit={cds}" in registry.command(dist, cds, train=True)
    assert not any("Archive" in arg for arg in registry.command(dist))
    assert registry.url == "http://127.0.0.1:18081/apis/ccompat/v7"


def test_storage_is_in_memory_unless_a_data_dir_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ("REGISTRY_DATASOURCE_URL", "APICURIO_DATASOURCE_URL")
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    in_memory = SchemaRegistry(tmp_path, port=1, version="x").environment()
    assert not any(k in in_memory for k in keys)
    on_file = SchemaRegistry(tmp_path, port=1, version="x", data_dir=tmp_path / "data").environment()
    assert {on_file[k] for k in keys} == {f"jdbc:h2:file:{tmp_path / 'data' / 'registry'}"}
